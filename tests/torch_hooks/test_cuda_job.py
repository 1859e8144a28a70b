"""The CUDA path end to end on a real GPU: jobs under `colocate run --device cuda`
and a node with `--device cuda`. Marked ``gpu``; skipped without CUDA.

What each test guards (bugs the CPU-only suite cannot see):

* the runtime does not start CUDA at ``import torch`` (no context in processes
  that never use the GPU; fork-then-CUDA scripts keep working) and still caps
  the first allocation;
* the caching allocator's limit is the cap to the byte;
* a cap lowered below the live set pauses-not-kills with ``--on-cap host`` and
  stops the job with one line with ``--on-cap error``;
* the SM-share throttle holds the busy fraction near the share;
* a guaranteed and an opportunistic job share a GPU under a CUDA node.
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.support import REPO, NodeProc, cnn, finish, metric_samples, read_log, start_job, stats_of, wait_for

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GiB, MiB = 1 << 30, 1 << 20
MARK = "@@RESULT@@"


def result(proc) -> dict:
    lines = [l for l in proc.stdout.splitlines() if l.startswith(MARK)]
    assert lines, f"no result (rc={proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len(MARK):])


def run_job(colocate, tmp_path, code: str, *opts, args=()):
    script = tmp_path / "job.py"
    script.write_text(code)
    return colocate(["run", "--device", "cuda", *opts, "--", sys.executable, script, *args], cwd=tmp_path)


LAZY = f"""
import json, torch, torch_hooks
out = {{"installed": torch_hooks.runtime() is not None, "started_at_import": torch.cuda.is_initialized()}}
x = torch.ones(1, device="cuda")
out["started"] = torch.cuda.is_initialized()
out["total"] = torch.cuda.mem_get_info()[1]
out["total_memory_module"] = torch.cuda.memory.mem_get_info()[1]
get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
if get is not None:
    out["allowed"] = int(get(0) * float(torch.cuda.get_device_properties(0).total_memory))
print({MARK!r} + json.dumps(out))
"""


def test_runtime_does_not_start_cuda_but_caps_the_first_allocation(colocate, tmp_path):
    proc = run_job(colocate, tmp_path, LAZY, "--gpu-mem", "1GiB")
    assert proc.returncode == 0, proc.stderr
    r = result(proc)
    assert r["installed"] and not r["started_at_import"] and r["started"]
    assert r["total"] == r["total_memory_module"] == GiB
    if "allowed" in r:
        assert r["allowed"] == GiB


FORK = f"""
import json, multiprocessing as mp, torch

def child(q):
    try:
        x = torch.ones(1 << 20, device="cuda")
        q.put(["ok", torch.cuda.mem_get_info()[1]])
    except Exception as exc:
        q.put(["error", repr(exc)])

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    y = torch.ones(1, device="cuda")
    print({MARK!r} + json.dumps({{"child": got, "child_rc": p.exitcode, "parent_total": torch.cuda.mem_get_info()[1]}}))
"""


def test_script_may_fork_cuda_workers_after_import(colocate, tmp_path):
    """Without colocate a script that forks before its first CUDA call may use CUDA in
    the children; a runtime that started CUDA at import broke that."""
    proc = run_job(colocate, tmp_path, FORK, "--gpu-mem", "1GiB")
    assert proc.returncode == 0, proc.stderr
    r = result(proc)
    assert r["child"] == ["ok", GiB], r
    assert r["child_rc"] == 0 and r["parent_total"] == GiB


EXACT = """
import torch
from colocate.base.env import JobEnv
from torch_hooks.device.cuda import CudaJobDevice, memory_fraction
torch.cuda.init()
free, total = torch.cuda.mem_get_info(0)
props_total = torch.cuda.get_device_properties(0).total_memory
MiB = 1 << 20
short = [c for c in range(64 * MiB, 2048 * MiB, 2 * MiB) if int((c / total) * float(total)) < c]
cap = short[0] if short else 64 * MiB
dev = CudaJobDevice(JobEnv(device="cuda", gpu_mem=cap))
dev.install()
try:
    x = torch.empty(cap, dtype=torch.uint8, device="cuda")  # one segment of exactly the cap
    exact = "allocated"
except torch.OutOfMemoryError:
    exact = "oom"
try:
    y = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    over = "allocated"
except torch.OutOfMemoryError:
    over = "oom"
emit({"total": total, "props_total": props_total, "cap": cap, "rounds_short": bool(short), "exact": exact,
      "over": over})
"""


def test_allocator_limit_is_the_cap_to_the_byte(run_py_json):
    r = run_py_json(EXACT)
    assert r["total"] == r["props_total"], "the allocator's total differs from mem_get_info's"
    assert r["exact"] == "allocated", r
    assert r["over"] == "oom", r


SHRINK = f"""
import json, torch, torch_hooks
MiB = 1 << 20
weights = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")

def batch():
    a = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    a.fill_(1)
    del a
    torch_hooks.step()

batch(); batch()
torch_hooks.set_limits(mem_cap=128 * MiB)  # below the live set, as a node shrinking an opportunistic job
for _ in range(4):
    batch()
s = torch_hooks.stats()
print({MARK!r} + json.dumps({{k: s[k] for k in ("iterations", "mem_cap_bytes", "mem_floor_peak_bytes",
                                                  "mem_reserved_peak_bytes")}}))
"""


def test_cap_below_the_live_set_keeps_the_job_running_with_on_cap_host(colocate, tmp_path):
    proc = run_job(colocate, tmp_path, SHRINK, "--gpu-mem", "1GiB")
    assert proc.returncode == 0, proc.stderr
    r = result(proc)
    assert r["iterations"] == 6 and r["mem_cap_bytes"] == 128 * MiB
    assert r["mem_floor_peak_bytes"] >= 512 * MiB  # reported to the node, which pauses the job
    assert r["mem_reserved_peak_bytes"] <= 1 * GiB


def test_cap_below_the_live_set_stops_the_job_with_on_cap_error(colocate, tmp_path):
    proc = run_job(colocate, tmp_path, SHRINK, "--gpu-mem", "1GiB", "--on-cap", "error")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("colocate: device memory cap of 128.00 MiB exceeded"), proc.stderr


TRAIN = """
import sys, time, torch
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(2048, 4096, device="cuda")
t0 = time.monotonic()
while time.monotonic() - t0 < float(sys.argv[1]):
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
"""


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25])
def test_sm_share_holds_the_busy_fraction(colocate, tmp_path, share):
    stats = tmp_path / "stats.json"
    proc = run_job(colocate, tmp_path, TRAIN, "--sm-share", share, "--stats-file", stats, args=("4",))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(stats.read_text())
    assert s["device"] == "cuda" and s["iterations"] >= 10
    if share == 1.0:
        assert s["busy_fraction"] >= 0.85, s
        assert s["throttle_idle_s"] < 0.05
    else:
        assert abs(s["busy_fraction"] - share) <= 0.07, s


def test_gpu_index_out_of_range(colocate, tmp_path):
    proc = colocate(["run", "--device", "cuda", "--gpu", "64", "--", sys.executable, "-c", "pass"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "this machine has" in proc.stderr


@pytest.mark.slow
def test_guaranteed_and_opportunistic_jobs_share_a_cuda_node(procs, ipc_dir):

    node = NodeProc(procs, ipc_dir, "--device", "cuda").start()
    g = start_job(procs, node, "g1", *cnn("--duration", 12, "--host-ms", 5, "--batch-size", 256),
                  run_opts=("--device", "cuda", "--gpu-mem", "4GiB"))
    o = start_job(procs, node, "o1", str(REPO / "examples" / "train_transformer.py"), "--log-every", "0",
                  "--duration", 12, "--host-ms", 0, "--batch-size", 32, priority="opportunistic",
                  run_opts=("--device", "cuda"))
    seen = {}

    def both_seen():  # the node's listing and metrics while both jobs run
        for j in node.jobs().values():
            seen[j.job_id] = j
        if {"g1", "o1"} <= set(seen) and "gpu" not in seen:
            listing = node.listing(timeout=1.0)
            seen["gpu"] = listing.gpus[0] if listing else None
            seen["metrics"] = metric_samples(node.metrics())
        return "metrics" in seen or (g.poll() is not None and o.poll() is not None)

    wait_for(both_seen, 120, interval=0.5, what="both jobs in the node's listing")
    assert finish(g) == 0, read_log(g)[-3000:]
    assert finish(o) == 0, read_log(o)[-3000:]
    assert {"g1", "o1"} <= set(seen), node.log()[-3000:]
    gpu = seen["gpu"]
    assert gpu is not None and gpu.kind == "cuda" and gpu.mem_total > 4 * GiB
    assert seen["g1"].mem_cap == 4 * GiB
    assert 0 < seen["o1"].mem_cap <= gpu.mem_total  # what the guaranteed job leaves unused (adaptive)
    kinds = {dict(ls).get("kind") for (n, ls) in seen["metrics"] if n == "colocate_gpu_memory_total_bytes"}
    assert kinds == {"cuda"}
    gs, os_ = stats_of(g), stats_of(o)
    assert gs["device"] == os_["device"] == "cuda"
    assert gs["iterations"] > 0 and os_["iterations"] > 0
    limits = [r for r in node.records() if r["kind"] == "limits" and r["job_id"] == "o1"]
    assert limits, "the node never set the opportunistic job's limits"

