"""Smoke tests for the example training scripts: each runs as a real subprocess."""
import os
import subprocess
import sys

import pytest

from tests.support import REPO, MiB, result_of

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


# Runs an example under `colocate run --device sim` and prints each mini-batch's memory as the runtime saw it.
PER_BATCH = """\
import json, runpy, sys
import torch, torch_hooks  # the launcher installs the runtime as torch is imported
seen = []
torch_hooks.runtime().add_listener(lambda r: seen.append([r.index, r.mem_allocated_peak, r.mem_reserved]))
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
print("@@RESULT@@" + json.dumps(seen), flush=True)
"""


def test_mem_burst_holds_the_extra_buffer_from_the_burst_iteration_on(colocate, tmp_path):
    # (train_cnn.py's burst is checked by the node's memory-burst test, tests/integration/test_node.py)
    at, mib, iters = 3, 8, 6
    wrapper = tmp_path / "per_batch.py"
    wrapper.write_text(PER_BATCH)
    proc = colocate(["run", "--device", "sim", "--", sys.executable, wrapper, REPO / "examples" / "train_recsys.py",
                     "--iters", iters, "--host-ms", 0, "--log-every", 0, "--threads", 1,
                     "--mem-burst-at", at, "--mem-burst-mib", mib], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"done: {iters} iterations" in proc.stdout
    batches = result_of(proc.stdout, proc.stderr)
    assert [b[0] for b in batches] == list(range(iters))
    peak = [b[1] for b in batches]  # allocated peak of each mini-batch on the simulated GPU
    # batch `at` is the first to hold the buffer: it jumps by its size there and keeps it after
    assert peak[at] - peak[at - 1] >= mib * MiB, peak
    assert min(peak[at:]) - max(peak[1:at]) >= mib * MiB, peak
    assert max(peak[1:at]) - min(peak[1:at]) < mib * MiB, peak  # steady before the burst (batch 0 builds state)


def test_duration_only_stops():
    proc = run_script("train_cnn.py", "--duration", "0.5", "--host-ms", "0", "--log-every", "0", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done: ")


def test_bad_flag_exits_2():
    proc = run_script("train_transformer.py", "--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments" in proc.stderr
