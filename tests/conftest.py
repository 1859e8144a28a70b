"""Fixtures of the test-suite; the helpers they use live in ``tests/support.py``.

Anything that installs the simulated allocator or the runtime into a process is
process-global and irreversible, so those tests run their code in a fresh
Python subprocess (``run_py`` / ``run_py_json``) or under the real launcher
(``colocate``), never in the pytest process.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import support as S


@pytest.fixture(scope="session", autouse=True)
def private_keys(tmp_path_factory):
    """Every scheduler, node and client of the suite (and the processes it starts, which inherit the
    environment) keeps its default CURVE keys in a folder of the session, never in ~/.config."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield os.environ["XDG_CONFIG_HOME"]
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(scope="session")
def run_py():
    return S.run_py


@pytest.fixture(scope="session")
def run_py_json():
    return S.run_py_json


@pytest.fixture(scope="session")
def colocate():
    return S.colocate_run


@pytest.fixture
def job_env():
    """A clean environment for a subprocess (no inherited COLOCATE_* variables)."""
    return S.clean_env()


@pytest.fixture(scope="session")
def repo():
    return S.REPO


@pytest.fixture(scope="session")
def sim_ext():
    """Build (or find cached) the simulated-GPU allocator once, so job start-up times are short."""
    proc = subprocess.run([S.PY, "-c", "from torch_hooks import _ext; _ext.load()"], cwd=S.REPO, env=S.child_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _remove_gates(endpoint: str) -> None:
    from torch_hooks.gate import gate_path

    for gpu in range(4):
        try:
            os.unlink(gate_path(endpoint, gpu))
        except OSError:
            pass


@pytest.fixture
def ipc_dir():
    """A short private directory (ipc socket paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cl-"))
    yield path
    _remove_gates(f"ipc://{path}/node.sock")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_ipc_dir():
    """``ipc_dir`` shared by the tests of one module."""
    path = Path(tempfile.mkdtemp(prefix="cm-"))
    yield path
    _remove_gates(f"ipc://{path}/node.sock")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def procs(ipc_dir):
    """The test's background processes, SIGKILLed (by process group) when it ends, pass or fail."""
    p = S.Procs(ipc_dir)
    yield p
    p.cleanup()
