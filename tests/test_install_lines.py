"""Every ``pip install`` line in the README and the docs installs this project as a user of a checkout or a wheel
would, or a third-party package pinned to one version.

The distribution's name is ``[project] name`` in pyproject.toml; ``colocate`` on the package index is an unrelated
project, so a line that installs ``colocate`` installs someone else's code (or nothing, on Python 3.11). Each thing
a line installs must be one of:

- this checkout: ``.``, ``./``, ``'.[ray]'``, with or without ``-e``;
- a wheel of this project: a path whose file name is ``NAME-VERSION-...whl`` (the name normalized, ``-`` as
  ``_``), extras allowed: ``'dist/colocate_gpu-0.1.0-py3-none-any.whl[ray]'``;
- this project by its distribution name, once it is published: ``'colocate-gpu[ray]'``;
- a third-party package pinned to one version: ``torch==2.13.0``, ``'ray[train]==2.60.0'``.

Anything else fails the test: an unpinned third-party name (``ray``, ``torch>=2``), ``colocate`` in any form,
another path or a URL, a requirements file. A line is the text after ``pip install`` up to the end of the line,
of an inline code span (a backtick), a shell operator (``&&``, ``;``, ``|``, parentheses, redirections) or a
comment; lines in fenced code blocks, inline code and prose are all read.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
TAKEN = "colocate"  # on PyPI: "DataFrame column reordering made simple", not this project

PIP_INSTALL = re.compile(r"\bpip3?\s+install\b(?P<rest>[^\n]*)")
SHELL_OPERATOR = re.compile(r"[();<>|&]+")
# options whose value is not a thing to install
OPTIONS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix",
                      "--root", "--src", "--python-version", "--platform", "--implementation", "--abi",
                      "--upgrade-strategy", "--progress-bar", "-C", "--config-settings", "--report", "--log"}
# options whose value is a thing to install (or a file of them: refused, as nothing here reads it)
OPTIONS_WITH_TARGET = {"-e", "--editable", "-r", "--requirement", "-c", "--constraint"}


def own_name() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["name"]


def wheel_prefix(name: str) -> str:
    """The start of a wheel's file name for distribution ``name`` (PEP 427: normalized, ``-`` as ``_``)."""
    return re.sub(r"[-_.]+", "_", name).lower() + "-"


def documents() -> list[Path]:
    """The Markdown a user reads: the README, docs/, and the examples' and benchmarks' notes."""
    found = {REPO / "README.md"}
    for folder in ("docs", "examples", "benchmarks"):
        found.update((REPO / folder).rglob("*.md"))
    return sorted(found)


def install_lines(text: str) -> list[tuple[int, str]]:
    """(line number, what follows ``pip install`` up to a backtick) for each ``pip install`` in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group("rest").split("`", 1)[0])
            for m in PIP_INSTALL.finditer(text)]


def targets(rest: str) -> list[str]:
    """The things one install line names, options left out; ValueError on a line a shell cannot split."""
    if rest.rstrip().endswith("\\"):
        raise ValueError("continued on the next line: keep an install command on one line")
    lexer = shlex.shlex(rest, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = iter(lexer)  # a comment ends the line; an unclosed quote raises ValueError
    found: list[str] = []
    for word in words:
        if SHELL_OPERATOR.fullmatch(word):
            break
        if word in OPTIONS_WITH_TARGET:
            found.append(f"{word} {next(words, '')}" if word not in ("-e", "--editable") else next(words, ""))
        elif word.startswith("-"):
            if word in OPTIONS_WITH_VALUE:
                next(words, None)
        else:
            found.append(word)
    if not found:
        raise ValueError("installs nothing on this line: keep an install command on one line")
    return found


def refusal(target: str, own: str) -> str | None:
    """Why a line may not install ``target`` (None: it may). ``own`` is this project's distribution name."""
    if target.startswith(("-r ", "--requirement ", "-c ", "--constraint ")):
        return f"{target}: a requirements file; name what to install on the line"
    base = re.sub(r"\[[^\]]*\]$", "", target)  # extras: '.[ray]', 'x.whl[ray]'
    if base.endswith(".whl") or base.startswith((".", "/", "~")) or "/" in base or ":" in base:
        if base in (".", "./"):
            return None  # this checkout
        if base.endswith(".whl") and ":" not in base and base.rsplit("/", 1)[-1].lower().startswith(wheel_prefix(own)):
            return None  # a wheel of this project
        return f"{target}: a path or URL other than this checkout (.) or a wheel of {own}"
    try:
        req = Requirement(target)
    except InvalidRequirement:
        return f"{target}: neither a requirement nor a path"
    name = canonicalize_name(req.name)
    if name == canonicalize_name(own):
        return None
    if name == TAKEN:
        return f"{target}: '{TAKEN}' on the package index is an unrelated project; this one is {own}"
    specs = list(req.specifier)
    if req.url is None and len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return None  # a third-party package pinned to one version
    return f"{target}: a third-party package not pinned to one version (NAME==VERSION)"


def problems(text: str, own: str) -> list[str]:
    """'line N: why' for each thing an install line in ``text`` may not install."""
    found = []
    for line, rest in install_lines(text):
        try:
            words = targets(rest)
        except ValueError as e:
            found.append(f"line {line}: pip install{rest}: {e}")
            continue
        found += [f"line {line}: {why}" for why in (refusal(w, own) for w in words) if why]
    return found


def test_the_distribution_is_not_named_as_the_index_s_unrelated_colocate():
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert canonicalize_name(project["name"]) != TAKEN
    assert project["scripts"] == {"colocate": "colocate.cli:main"}  # the command keeps its name


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_install_line_installs_this_project_or_a_pinned_package(doc):
    found = problems(doc.read_text(), own_name())
    assert not found, f"{doc.relative_to(REPO)}:\n" + "\n".join(found)


def test_the_readme_installs_the_ray_extra_of_this_project():
    """The Ray quick start's install line is read (the check above is not vacuous) and is this project's."""
    own = own_name()
    lines = install_lines((REPO / "README.md").read_text())
    ray = [w for _, rest in lines for w in targets(rest) if w.endswith("[ray]")]
    assert ray and all(refusal(w, own) is None for w in ray), (lines, ray)


ALLOWED = [
    "```bash\npython3 -m pip install torch==2.13.0 '.[ray]'   # from the checkout\n```",
    "python3 -m pip install torch==2.13.0 . && colocate demo --out demo-out",
    "python3 -m pip install torch==2.13.0 -e '.[test]' && python3 -m pytest -q",
    "the gpu extra (`pip install '.[gpu]'`, NVML bindings) with",
    "pip install 'dist/colocate_gpu-0.1.0-py3-none-any.whl[ray]'",
    "RUN pip install --no-cache-dir /tmp/colocate_gpu-0.1.0-py3-none-any.whl 'ray[train]==2.60.0'",
    "pip install 'colocate-gpu[ray]'   # once published",
    "pip install -U ./",
    "pip install -i https://example.org/simple torch==2.13.0 > log",
]
REFUSED = [
    "python3 -m pip install 'colocate[ray]'",  # the README's line before the rename
    "install the `gpu` extra (`pip install 'colocate[gpu]'`, NVML bindings)",
    "pip install colocate==0.1.2",
    "pip install torch '.[ray]'",
    "pip install 'torch>=2.1'",
    "pip install ray[default]",
    "pip install 'torch==2.*'",
    "pip install ../other",
    "pip install dist/other-1.0-py3-none-any.whl",
    "pip install -r requirements.txt",
    "pip install git+https://github.com/x/colocate",
    "pip install 'colocate-gpu[ray]",  # unclosed quote
    "pip install \\\n  '.[ray]'",
    "`pip install`",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_an_allowed_line_passes(text):
    assert problems(text, "colocate-gpu") == []


@pytest.mark.parametrize("text", REFUSED)
def test_a_refused_line_fails(text):
    assert len(problems(text, "colocate-gpu")) == 1
