"""The tree passes the linters pyproject.toml configures, and the closed vocabularies are named, not spelled.

``ruff check`` (``[tool.ruff]``) and ``mypy`` (``[tool.mypy]``) run on the tree as a developer runs them by
hand; a failure shows their own report. mypy keeps its incremental cache in ``.mypy_cache/`` (ignored by
git): the first run reads the packages in about 15 s, later ones in a few.

The vocabulary check: every closed set of wire strings is one ``StrEnum`` (``colocate.base.vocab``,
``colocate.protocol.ErrorCode``), so a string literal spelling one of the priority or job-state values in the
packages is a second definition waiting to drift. Tests may spell them (they check the wire).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize
from pathlib import Path

from colocate.base.vocab import JobClass, JobState

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("colocate", "torch_hooks", "cluster")

# (file, literal) pairs that are not the vocabulary: the "opportunistic" policy plugin's registry name
NOT_VOCABULARY = {
    ("cluster/config.py", "opportunistic"),
    ("cluster/plugins/__init__.py", "opportunistic"),
    ("cluster/plugins/opportunistic.py", "opportunistic"),
    ("cluster/slots.py", "opportunistic"),  # GpuState's attribute (colocate.base.pick.Room's name), in __slots__
}


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    res = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]


def test_the_size_rules_bite(tmp_path):
    """A function over the configured size limits fails ruff with this pyproject's rules (C901 and pylint's
    size rules), and passes once it says why in its noqa."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    source = f"def too_big(x):\n{body}    return -1\n"
    probe = tmp_path / "probe.py"  # outside the tree: a ruff run of the whole tree beside this one never sees it
    check = ("ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), "--output-format", "concise")
    probe.write_text(source)
    res = _run(*check, str(probe))
    assert res.returncode == 1 and all(code in res.stdout for code in ("C901", "PLR0911", "PLR0912")), res.stdout
    probe.write_text(source.replace("def too_big(x):", "def too_big(x):  # noqa: C901, PLR0911, PLR0912 (a probe)"))
    assert _run(*check, str(probe)).returncode == 0


def test_mypy_finds_nothing():
    res = _run("mypy")
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]


def vocabulary_literals(source: str, values: set[str]) -> list[tuple[int, str]]:
    """(line, value) of each string literal in ``source`` that is exactly one of ``values``."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.string[:1] in "\"'" and tok.string[1:-1] in values:
            out.append((tok.start[0], tok.string[1:-1]))
    return out


def test_vocabulary_literals_are_found():
    src = 'x = "guaranteed"\ny = f"{a}"\n"""running"""\nz = JobClass.GUARANTEED  # "pending"\n'
    assert vocabulary_literals(src, {"guaranteed", "running", "pending"}) == [(1, "guaranteed")]


def test_the_packages_name_the_vocabulary():
    values = {str(m) for m in (*JobClass, *JobState)}
    spelled = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "colocate/base/vocab.py" or rel.startswith("colocate/_examples/"):
                continue
            spelled += [f"{rel}:{line}: {value!r}" for line, value in vocabulary_literals(path.read_text(), values)
                        if (rel, value) not in NOT_VOCABULARY]
    assert not spelled, "use colocate.base.vocab's members, not their strings:\n" + "\n".join(spelled)
