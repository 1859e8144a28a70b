"""Smoke tests for the example training scripts: each runs as a real subprocess."""
import os
import subprocess
import sys

import pytest

from tests.support import REPO

SCRIPTS = ["train_cnn.py", "train_transformer.py", "train_recsys.py"]
FAST = ["--iters", "5", "--host-ms", "0", "--log-every", "0", "--threads", "1"]


def run_script(name, *args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs(name):
    proc = run_script(name, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "done: 5 iterations" in proc.stdout.splitlines()[-1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_does_not_import_colocate(name):
    src = (REPO / "examples" / name).read_text()
    assert "import colocate" not in src and "torch_hooks" not in src
    assert "optimizer.step()" in src


def test_progress_lines():
    proc = run_script("train_cnn.py", "--iters", "4", "--host-ms", "0", "--log-every", "2", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("iter ")]
    assert [l.split()[1] for l in lines] == ["2/4", "4/4"]
    assert all(" loss " in l and " it/s " in l for l in lines)


def test_mem_burst():
    proc = run_script("train_recsys.py", *FAST, "--mem-burst-at", "2", "--mem-burst-mib", "8")
    assert proc.returncode == 0, proc.stderr
    assert "done: 5 iterations" in proc.stdout


def test_duration_only_stops():
    proc = run_script("train_cnn.py", "--duration", "0.5", "--host-ms", "0", "--log-every", "0", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done: ")


def test_bad_flag_exits_2():
    proc = run_script("train_transformer.py", "--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments" in proc.stderr
