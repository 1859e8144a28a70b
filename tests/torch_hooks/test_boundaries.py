"""Mini-batch boundaries by source, under the real launcher (``colocate run --device sim``).

Each test writes a plain torch script (no colocate import unless it calls ``torch_hooks.step()``)
into a tmp directory, runs it under ``colocate run`` in a fresh process and reads the
``--stats-file``: ``iterations`` and ``boundaries`` (counts by source: optimizer, backward,
step, scaler), and the job's stderr for the no-boundary warning.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import half_share_run

pytestmark = pytest.mark.slow  # each test runs a torch job under the launcher

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # the first job on a machine builds the allocator extension
WARNING = "colocate: no mini-batch boundary"


def run_job(tmp_path: Path, code: str, *opts: str, env: dict | None = None):
    """Run ``code`` as a script under ``colocate run --device sim OPTS``; returns (proc, stats)."""
    script = tmp_path / "job.py"
    script.write_text(code)
    stats = tmp_path / "stats.json"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    child_env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "colocate", "run", "--device", "sim", "--stats-file", str(stats), *opts, "--",
         sys.executable, str(script)],
        cwd=str(tmp_path), env=child_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc, json.loads(stats.read_text())


# A hand-update loop like pytorch/examples' word_language_model: no optimizer, p.data.add_(p.grad,
# alpha=-lr), an evaluation pass under no_grad every few batches. ~20 ms of device work a batch.
HAND_UPDATE = r'''
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 256), nn.Tanh(), nn.Linear(256, 10))
x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
crit = nn.CrossEntropyLoss()
N = int(__import__("sys").argv[1]) if len(__import__("sys").argv) > 1 else 80
lr = 0.05
for i in range(N):
    model.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    if i % 10 == 9:
        model.eval()
        with torch.no_grad():  # evaluation: never a boundary
            for _ in range(3):
                model(x)
        model.train()
print("done", N)
'''


def test_hand_update_loop_finds_backward_boundaries_and_holds_the_share(tmp_path):
    def once():
        proc, s = run_job(tmp_path, HAND_UPDATE, "--sm-share", "0.5", env={"COLOCATE_BOUNDARY_WARN_S": "2"})
        n = int(proc.stdout.split()[-1])
        # one boundary per training batch, found at the next batch's first forward: the last batch has no
        # next forward, and the evaluation forwards under no_grad add none
        assert s["iterations"] == n - 1, s
        assert s["boundaries"] == {"backward": n - 1}, s
        assert WARNING not in proc.stderr, proc.stderr
        return proc, s

    proc, s, info = half_share_run(once)  # on a core of its own: a contended run is done again
    assert s["throttle_idle_s"] > 0, info
    assert abs(s["busy_fraction"] - 0.5) <= 0.05, info


NO_BOUNDARY = r'''
import time, torch, torch.nn as nn
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
x = torch.randn(256, 256)
t0 = time.monotonic()
while time.monotonic() - t0 < 3.0:  # inference with grad enabled: never backward, never a step
    model(x)
print("done")
'''


def test_job_without_boundaries_warns_once_naming_step(tmp_path):
    proc, s = run_job(tmp_path, NO_BOUNDARY, env={"COLOCATE_BOUNDARY_WARN_S": "0.5"})
    assert s["iterations"] == 0 and s["boundaries"] == {}
    lines = [line for line in proc.stderr.splitlines() if line.startswith(WARNING)]
    assert len(lines) == 1, proc.stderr  # about 5 periods passed: said once
    assert "torch_hooks.step()" in lines[0]


def test_warning_can_be_switched_off(tmp_path):
    proc, s = run_job(tmp_path, NO_BOUNDARY, env={"COLOCATE_BOUNDARY_WARN_S": "0"})
    assert s["iterations"] == 0
    assert WARNING not in proc.stderr, proc.stderr


ACCUMULATION = r'''
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
STEPS, MICRO = 6, 4
for step in range(STEPS):
    for micro in range(MICRO):  # gradient accumulation: 4 forward/backward pairs per optimizer step
        (model(torch.randn(16, 64)).pow(2).mean() / MICRO).backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        model(torch.randn(4, 64))
print("done")
'''


def test_gradient_accumulation_counts_one_boundary_per_optimizer_step(tmp_path):
    proc, s = run_job(tmp_path, ACCUMULATION)
    assert s["iterations"] == 6, s
    assert s["boundaries"] == {"optimizer": 6}, s


EXPLICIT_STEP = r'''
import torch, torch.nn as nn, torch_hooks
model = nn.Linear(32, 1)
for i in range(5):
    model.zero_grad()
    model(torch.randn(8, 32)).pow(2).mean().backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.01)
    torch_hooks.step()  # the script marks its own boundary: the backward is not counted again
print("done")
'''

SCALER = r'''
import torch, torch.nn as nn
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for i in range(6):
    opt.zero_grad()
    scaler.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
    if i in (1, 2, 4):  # an inf gradient: GradScaler skips optimizer.step()
        model.weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
print("done")
'''

# activation checkpointing runs module forwards (and, reentrant, torch.autograd.backward) inside the
# outer backward: none of them may end a mini-batch there, not even in a second backward right after a
# first one (two losses). A reentrant checkpoint runs its forward under no_grad, so the stem outside it
# is what starts the next batch.
CHECKPOINT = r'''
import os, torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
reentrant = os.environ["REENTRANT"] == "1"
stem = nn.Linear(32, 32)
branches = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(2))
params = list(stem.parameters()) + list(branches.parameters())
for i in range(5):
    h = stem(torch.randn(8, 32))
    losses = [checkpoint(b, h, use_reentrant=reentrant).pow(2).mean() for b in branches]
    losses[0].backward(retain_graph=True)
    losses[1].backward()  # recomputes branch 1's forward, with grad, after a completed backward
    with torch.no_grad():
        for p in params:
            p -= 0.01 * p.grad
            p.grad = None
print("done")
'''


@pytest.mark.parametrize("code, env, expected", [
    (EXPLICIT_STEP, {}, {"step": 5}),
    (SCALER, {}, {"optimizer": 3, "scaler": 3}),
    (CHECKPOINT, {"REENTRANT": "1"}, {"backward": 4}),
    (CHECKPOINT, {"REENTRANT": "0"}, {"backward": 4}),
], ids=["explicit-step", "grad-scaler", "reentrant-checkpoint", "checkpoint"])
def test_boundaries_are_counted_by_source(tmp_path, code, env, expected):
    proc, s = run_job(tmp_path, code, env=env)
    assert s["boundaries"] == expected, s
    assert s["iterations"] == sum(expected.values())
