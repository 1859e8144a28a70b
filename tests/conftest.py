"""Shared helpers for the test-suite.

Anything that installs the simulated allocator or the runtime into a process is
process-global and irreversible, so those tests run their code in a fresh
Python subprocess (``run_py`` / ``run_py_json``) or under the real launcher
(``colocate``), never in the pytest process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULT_MARK = "@@RESULT@@"
# Generous: the first process on a fresh machine compiles the allocator extension.
SUBPROCESS_TIMEOUT = 300


def clean_env(extra: dict | None = None) -> dict:
    """os.environ without any COLOCATE_* variable, one intra-op thread, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def _run_py(code: str, *, env: dict | None = None, cwd=None, timeout: float = SUBPROCESS_TIMEOUT):
    """Run ``code`` with ``python -c`` in a fresh interpreter; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=str(cwd or REPO), env=clean_env(env),
        capture_output=True, text=True, timeout=timeout,
    )


def _run_py_json(code: str, **kw) -> dict:
    """Run ``code``; it must exit 0 and print one line ``@@RESULT@@<json>``; returns the object.

    The code may call ``emit(obj)`` (predefined) to print that line.
    """
    prelude = (
        "import json as _json, sys as _sys\n"
        f"def emit(obj):\n    print({RESULT_MARK!r} + _json.dumps(obj), flush=True)\n"
    )
    proc = _run_py(prelude + code, **kw)
    assert proc.returncode == 0, f"subprocess failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_MARK)]
    assert lines, f"subprocess printed no result:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len(RESULT_MARK):])


def _colocate(args, *, cwd=None, env: dict | None = None, timeout: float = SUBPROCESS_TIMEOUT):
    """``python -m colocate ARGS...`` as a real subprocess; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "colocate", *map(str, args)], cwd=str(cwd or REPO), env=clean_env(env),
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="session")
def run_py():
    return _run_py


@pytest.fixture(scope="session")
def run_py_json():
    return _run_py_json


@pytest.fixture(scope="session")
def colocate():
    return _colocate


@pytest.fixture
def job_env():
    """A clean environment for a subprocess (no inherited COLOCATE_* variables)."""
    return clean_env()


@pytest.fixture(scope="session")
def repo():
    return REPO
