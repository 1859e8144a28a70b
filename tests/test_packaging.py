"""The package a user installs: declared dependencies match the code, and a wheel built from a clean
checkout works in a fresh virtual environment (non-editable), as the README promises.

The wheel test copies what a clean clone holds (git's tracked files plus untracked, not ignored
ones), builds a wheel, installs it with the pinned CPU torch into a new venv, and runs
``colocate --version``, ``colocate env``, a short ``colocate run --device sim`` job with
``--stats-file``, and a ``colocate node`` answered by ``colocate ctl list``, all from outside the
checkout so nothing can come from the source tree.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.support import dists_with_requirements

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("colocate", "torch_hooks", "cluster")
TORCH_PIN = "torch==2.13.0"


def pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def imported_top_level() -> set[str]:
    """Third-party top-level modules the packages import (anywhere, lazily included)."""
    names = set()
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PACKAGES}


def requirement_name(req: str) -> str:
    for sep in "<>=!~;[ ":
        req = req.split(sep)[0]
    return req.lower().replace("_", "-")


# import name -> distribution, for what an environment may lack (the gpu extra is not in the test extra)
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}


def test_declared_dependencies_are_exactly_what_the_code_imports():
    project = pyproject()["project"]
    declared = {requirement_name(r) for r in project["dependencies"]}
    declared_gpu = {requirement_name(r) for r in project["optional-dependencies"]["gpu"]}
    declared_ray = {requirement_name(r) for r in project["optional-dependencies"]["ray"]}
    dists = metadata.packages_distributions()
    used = set()
    for module in imported_top_level():
        if module not in dists and module in NOT_INSTALLED_HERE:
            used.add(NOT_INSTALLED_HERE[module])
            continue
        assert module in dists, f"{module} is imported but no installed distribution provides it"
        used.update(d.lower().replace("_", "-") for d in dists[module])
    assert used == declared | declared_gpu | declared_ray, (sorted(used), sorted(declared | declared_gpu | declared_ray))
    assert declared_ray == {"ray"}  # colocate.ray (the runtime_env plugin, `colocate ray start`)
    assert declared_gpu == {"nvidia-ml-py"}  # the CUDA path's own need (NVML); torch's CUDA build does the rest
    assert not (declared & declared_gpu)


def test_every_subpackage_is_discovered():
    on_disk = {str(p.parent.relative_to(REPO)).replace(os.sep, ".")
               for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")}
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    from setuptools import find_packages

    assert set(find_packages(str(REPO), include=find["include"])) == on_disk


def wheel_prefix(dist_name: str) -> str:
    """A wheel's file name starts with the distribution's name, normalized, '-' as '_' (PEP 427, PEP 503)."""
    return re.sub(r"[-_.]+", "_", dist_name).lower()


def clean_copy(dest: Path) -> Path:
    """What a fresh clone of this tree holds: tracked files plus untracked, not ignored ones."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to know which files a clean clone has")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not os.path.lexists(src):
            continue  # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        else:
            shutil.copy2(src, target)
    return dest


def run(cmd, timeout=300, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert res.returncode == 0, f"{cmd} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def link_distributions(names, folder: Path) -> Path:
    """A folder of links to the installed files of distributions ``names`` and what they require (their
    packages, modules and ``.dist-info``), for another environment to see those and nothing else."""
    folder.mkdir()
    for dist in dists_with_requirements(names):
        for f in dist.files or []:
            top = f.parts[0]
            if top != ".." and not (folder / top).exists():
                (folder / top).symlink_to(Path(dist.locate_file(top)))
    return folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_from_a_clean_checkout_works_in_a_fresh_venv(tmp_path):
    src = clean_copy(tmp_path / "src")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", src])
    dist_name = pyproject()["project"]["name"]
    (wheel,) = (tmp_path / "dist").glob(f"{wheel_prefix(dist_name)}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages_in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    on_disk = {str(p.parent.relative_to(src)).replace(os.sep, ".")
               for pkg in PACKAGES for p in (src / pkg).rglob("__init__.py")}
    assert packages_in_wheel == on_disk  # every subpackage ships
    for data in ("torch_hooks/csrc/sim_allocator.cpp", "colocate/_inject/sitecustomize.py",
                 "colocate/_examples/train_cnn.py", "cluster/predict/data/justus2018_layers.csv.gz",
                 "cluster/predict/data/justus2018_gpus.json", "cluster/predict/data/NOTICE"):
        assert data in names, data

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    py, colocate = venv / "bin" / "python", venv / "bin" / "colocate"
    # torch (1 GB, most of an install's time) is this environment's own, installed by the README's pinned
    # command: the new venv sees it, and only it, through a .pth file; pip finds it satisfies the pin and
    # installs the wheel and every other requirement the wheel declares. --no-compile: no bytecode for what
    # it installs; what runs below compiles what it imports, as any Python does
    shared = link_distributions(["torch"], tmp_path / "torch-only")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "torch-of-the-suite.pth").write_text(f"{shared}\n")
    assert run([py, "-m", "pip", "show", "torch"]).returncode == 0
    run([py, "-m", "pip", "install", "-q", "--no-compile", TORCH_PIN, wheel], timeout=600)
    assert Path(site, "colocate").is_dir() and not Path(site, "torch").exists()  # the wheel's own, torch shared

    work = tmp_path / "work"  # outside the checkout: nothing can be imported from the source tree
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = run([py, "-c", "import colocate, torch_hooks, cluster.core; print(colocate.__file__)"], cwd=work, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    # the cross-hardware model reads its benchmark table from the installed package
    assert run([py, "-c", "from cluster.predict import crosshw; print(len(crosshw.samples()))"],
               cwd=work, env=env).stdout.strip() == "24000"

    assert run([colocate, "--version"], cwd=work, env=env).stdout.strip() == "colocate 0.1.0"
    # the distribution is installed under its own name, at the version the package reports
    shown = run([py, "-m", "pip", "show", dist_name], cwd=work, env=env).stdout
    assert f"Name: {dist_name}" in shown and "Version: 0.1.0" in shown, shown
    assert run([py, "-c", f"import importlib.metadata as m, colocate; print(m.version({dist_name!r}) == colocate.__version__)"],
               cwd=work, env=env).stdout.strip() == "True"
    assert "COLOCATE_SM_SHARE" in run([colocate, "env"], cwd=work, env=env).stdout

    script = work / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(8, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(20):\n    opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()\n")
    run([colocate, "run", "--device", "sim", "--stats-file", work / "stats.json", "--", py, script],
        cwd=work, env=env, timeout=600)
    stats = json.loads((work / "stats.json").read_text())
    assert stats["iterations"] == 20 and stats["exit_code"] == 0

    endpoint = f"ipc://{tmp_path}/node.sock"
    node = subprocess.Popen([colocate, "node", "--device", "sim", "--endpoint", endpoint, "--log-level", "warning"],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def listed():
            res = subprocess.run([colocate, "ctl", "--node", endpoint, "--timeout", "1", "list", "--json"],
                                 cwd=work, env=env, capture_output=True, text=True, timeout=30)
            return json.loads(res.stdout) if res.returncode == 0 else None

        deadline, listing = time.monotonic() + 60, None
        while listing is None and time.monotonic() < deadline and node.poll() is None:
            listing = listed()  # each try waits up to 1 s for the node's answer
        assert listing is not None, f"the node did not answer `colocate ctl list` within 60 s (rc {node.poll()})"
        assert [g["kind"] for g in listing["gpus"]] == ["sim"] and listing["jobs"] == []
    finally:
        node.send_signal(signal.SIGTERM)
        out, _ = node.communicate(timeout=30)
    assert node.returncode == 0, out
