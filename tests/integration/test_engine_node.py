"""What engine workers get from a real `colocate node`: fixed partitions, a GPU the node picks, fail-closed.

One node with two simulated GPUs of 1 GiB. Two `colocate run --partition` jobs share GPU 0 (shares 0.5 and
0.3, caps 512 and 256 MiB), each held to its share and cap while both train; a third partition that does not
fit exits with one line. An opportunistic worker started
as an engine starts it (no launcher: COLOCATE_ENABLED, the injected sitecustomize, COLOCATE_GPUS=node) is put
on GPU 1, the one its memory fits, and runs there (its core, its memory); one that fits nowhere exits with one
line. A worker with COLOCATE_NODE_REQUIRED=1 and no node exits with one line naming `colocate node`.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from colocate.gpus.sim import default_core
from colocate.launcher import INJECT_DIR
from tests.support import (
    JOB_START_S,
    PY,
    REPO,
    MiB,
    NodeProc,
    clean_env,
    finish,
    read_log,
    result_of,
    run_py,
    start_job,
    stats_of,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)

TRAIN = """\
import os, sys, time
import torch
stop, hold_mib = sys.argv[1], int(sys.argv[2])
held = torch.ones(hold_mib << 20, dtype=torch.uint8)  # over a partition's cap: served from host memory
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
deadline = time.monotonic() + 240
while not os.path.exists(stop):  # device work only: unthrottled it would keep the GPU's core busy
    if time.monotonic() > deadline:
        sys.exit("never told to stop")
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""

WORKER = """\
import json, os
import torch  # the runtime installs here, as in an engine's worker
import torch_hooks
rt = torch_hooks.runtime()
torch.nn.Linear(2, 2)(torch.ones(1, 2))  # its first device work: a simulated GPU's process joins its core here
print("@@RESULT@@" + json.dumps({"gpu": rt.env.gpu, "cores": sorted(os.sched_getaffinity(0)),
                                 "mem_total": rt.device.mem_total}), flush=True)
"""


REFUSED = """\
import sys
import torch_hooks
try:
    torch_hooks.install()  # refused before the device opens: torch is never imported
except ValueError as exc:
    sys.exit(f"colocate: {exc}")  # what the injected sitecustomize does (tests/colocate/base/test_engines.py)
print("ran")
"""


def engine_worker(node: str, job_id: str, code: str = WORKER, **colocate) -> subprocess.Popen:
    """A worker started as an engine starts one: no launcher, the runtime through the injected sitecustomize
    (started now; ``ended`` collects it)."""
    env = {"COLOCATE_ENABLED": "1", "COLOCATE_DEVICE": "sim", "COLOCATE_NODE": node, "COLOCATE_JOB_ID": job_id,
           "COLOCATE_NODE_WAIT_S": "20", "PYTHONPATH": os.pathsep.join([INJECT_DIR, str(REPO)]),
           **{f"COLOCATE_{k.upper()}": str(v) for k, v in colocate.items()}}
    return subprocess.Popen([PY, "-c", code], cwd=REPO, env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def partition(procs, node, job_id, share, cap_mib, hold_mib, stop):
    script = procs.tmp / "train.py"
    script.write_text(TRAIN)
    return start_job(procs, node, job_id, script, stop, hold_mib, run_opts=(
        "--partition", "--sm-share", share, "--gpu-mem", f"{cap_mib}MiB", "--sim-gpu-mem", "1GiB"))


@pytest.mark.slow
def test_partitions_share_a_gpu_and_the_node_picks_an_opportunistic_gpu(sim_ext, procs, ipc_dir):
    node = NodeProc(procs, ipc_dir, "--sim-gpus", "2", "--sim-gpu-mem", "1GiB").start()
    stop = ipc_dir / "stop"
    a = partition(procs, node, "a", 0.5, 512, 64, stop)
    b = partition(procs, node, "b", 0.3, 256, 320, stop)
    wait_for(lambda: all(node.jobs().get(j) and node.jobs()[j].iterations >= 20 for j in "ab"), JOB_START_S,
             what="both partitions to report 20 batches")

    jobs = node.jobs()
    assert {(j.job_id, j.gpu, j.priority, j.sm_share, j.mem_cap >> 20) for j in jobs.values()} == {
        ("a", 0, "guaranteed", 0.5, 512), ("b", 0, "guaranteed", 0.3, 256)}
    sent = [(r["job_id"], r["limits"]["seq"]) for r in node.records() if r["kind"] == "limits"]
    assert sent == [], sent  # the Welcome only: the node never changed a partition's limits

    # at once: a partition that does not fit, an opportunistic worker whose GPU the node picks (GPU 0 has 256 MiB
    # left, so 512 MiB fit on GPU 1 only), and one that fits nowhere
    workers = [engine_worker(node.endpoint, "c", REFUSED, partition=1, sm_share=0.3, gpu_mem="128MiB", gpu=0),
               engine_worker(node.endpoint, "o", gpus="node", priority="opportunistic", gpu_mem="512MiB"),
               engine_worker(node.endpoint, "p", REFUSED, gpus="node", priority="opportunistic", gpu_mem="2GiB")]
    c, o, p = map(ended, workers)
    assert c.returncode == 1 and c.stdout == "" and c.stderr.strip() == (
        f"colocate: the node coordinator at {node.endpoint} refused worker c: GPU 0: a partition of share 0.3 "
        "does not fit: its partitions (a, b) hold 0.8 of its compute"), c.stderr
    assert o.returncode == 0, o.stderr
    assert result_of(o.stdout, o.stderr) == {"gpu": 1, "cores": [default_core(1)], "mem_total": 1 << 30}
    assert p.returncode == 1 and p.stdout == "" and "refused worker p: no GPU on this node is under 80% busy with 2048 MiB free" in \
        p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr

    stop.write_text("")
    for job, share, cap_mib in ((a, 0.5, 512), (b, 0.3, 256)):
        assert finish(job) == 0, read_log(job)[-3000:]
        stats = stats_of(job)
        assert 0 < stats["busy_fraction"] <= share + 0.02, stats  # the runtime idles to its share
        assert stats["mem_reserved_peak_bytes"] <= cap_mib * MiB, stats
    assert stats_of(b)["host_bytes_peak"] > 0  # b held 320 MiB over its 256 MiB cap: the rest went to host


def test_a_worker_that_requires_its_node_exits_with_one_line_without_it(ipc_dir):
    endpoint = f"ipc://{ipc_dir}/no-node.sock"
    env = {"COLOCATE_ENABLED": "1", "COLOCATE_DEVICE": "sim", "COLOCATE_NODE": endpoint, "COLOCATE_NODE_REQUIRED": "1",
           "COLOCATE_NODE_WAIT_S": "0.5", "PYTHONPATH": os.pathsep.join([INJECT_DIR, str(REPO)])}
    proc = run_py("import torch\nprint('ran without its limits')", env=env, timeout=120)
    assert proc.returncode == 2 and "ran without" not in proc.stdout
    assert proc.stderr.strip() == (f"colocate: no node coordinator answered at {endpoint} within 0.5 s: start "
                                   "`colocate node` on this machine (COLOCATE_NODE_REQUIRED=1: this worker does "
                                   "not run without it)")
