"""The policy core never imports the simulator (import-linter contract
``core-never-knows-it-is-simulated`` in pyproject.toml): kept on the real tree, and reported
BROKEN when a core module imports ``cluster.sim`` (a copy of the tree, broken on purpose)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTRACT = "core-never-knows-it-is-simulated"
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())", "--no-cache", "--config", "pyproject.toml"]

pytest.importorskip("importlinter")


def contract() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return next(c for c in tomllib.load(f)["tool"]["importlinter"]["contracts"] if c["id"] == CONTRACT)


def lint(root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run(LINT, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    return re.sub(r"\s", "", res.stdout)


def test_the_core_is_in_the_contract():
    c = contract()
    assert c["forbidden_modules"] == ["cluster.sim"]
    for mod in ("cluster.core", "cluster.framework", "cluster.state", "cluster.plugins", "cluster.config"):
        assert mod in c["source_modules"]


@pytest.mark.parametrize("path", ["cluster/core.py", "cluster/plugins/backfill.py"])
def test_broken_on_purpose(tmp_path, path):
    for pkg in ("colocate", "torch_hooks", "cluster"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    name = re.sub(r"\s", "", contract()["name"])
    assert name + "KEPT" in lint(tmp_path)
    target = tmp_path / path
    target.write_text(target.read_text() + "\nimport cluster.sim  # broken on purpose\n")
    assert name + "BROKEN" in lint(tmp_path)
