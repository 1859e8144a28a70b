"""torch_hooks/device/cuda.py on a real GPU. Marked ``gpu``; skipped without CUDA.

The CUDA device changes process-global state (memory fraction, a wrapped
``torch.cuda.mem_get_info``), so it is exercised in a child process.
"""
import json
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GiB, MiB = 1 << 30, 1 << 20

CHILD = r'''
import dataclasses
import torch
from colocate.base.env import JobEnv
from torch_hooks.device.cuda import CudaJobDevice

GiB, MiB = 1 << 30, 1 << 20
real_free, real_total = torch.cuda.mem_get_info(0)
dev = CudaJobDevice(JobEnv(device="cuda", gpu_mem=1 * GiB))
dev.install()
out = {"real_total": real_total, "mem_total": dev.mem_total, "kind": dev.kind}
out["torch_info"] = list(torch.cuda.mem_get_info())
out["torch_info_0"] = list(torch.cuda.mem_get_info(0))
out["dev_info"] = list(dev.mem_get_info())

x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
out["after_alloc"] = dataclasses.asdict(dev.memory())
out["info_after_alloc"] = list(torch.cuda.mem_get_info())
try:
    y = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    out["over_cap"] = "allocated"
    del y
except torch.OutOfMemoryError:
    out["over_cap"] = "oom"
del x
out["cached"] = dataclasses.asdict(dev.memory())

dev.set_cap(512 * MiB)
out["shrunk_info"] = list(torch.cuda.mem_get_info())
out["released"] = dev.release_cache()
out["after_release"] = dataclasses.asdict(dev.memory())

dev.reset_window()
a = torch.randn(4096, 4096, device="cuda")
b0 = dev.busy_time()
dev.phase_start()
for _ in range(20):
    a = a @ a
    a = a / a.norm()
dev.phase_end()
out["busy_delta"] = dev.busy_time() - b0
out["window"] = dataclasses.asdict(dev.memory())

dev.set_cap(4 * GiB)
try:
    z = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    out["grown"] = "allocated"
    del z
except torch.OutOfMemoryError:
    out["grown"] = "oom"
out["grown_info"] = list(torch.cuda.mem_get_info())
emit(out)
'''


@pytest.fixture(scope="module")
def cuda(run_py_json):
    return run_py_json(CHILD)


def test_job_sees_its_cap_as_total(cuda):
    assert cuda["kind"] == "cuda"
    assert cuda["mem_total"] == cuda["real_total"] > 1 * GiB
    for key in ("torch_info", "torch_info_0", "dev_info"):
        free, total = cuda[key]
        assert total == 1 * GiB, key
        assert 0 <= free <= total, key


def test_memory_stats_follow_the_caching_allocator(cuda):
    m = cuda["after_alloc"]
    assert m["cap"] == 1 * GiB
    assert m["allocated"] >= 256 * MiB
    assert m["reserved"] >= m["allocated"]
    assert m["peak_allocated"] >= m["allocated"] and m["peak_reserved"] >= m["reserved"]
    assert m["host"] == 0
    free, total = cuda["info_after_alloc"]
    assert free <= 1 * GiB - 256 * MiB + (m["reserved"] - m["allocated"])
    c = cuda["cached"]
    assert c["allocated"] < 256 * MiB <= c["reserved"]  # freed into the cache, still reserved


def test_allocation_over_the_cap_raises(cuda):
    assert cuda["over_cap"] == "oom"


def test_shrink_then_release_cache(cuda):
    assert cuda["shrunk_info"][1] == 512 * MiB
    assert cuda["released"] >= 256 * MiB
    r = cuda["after_release"]
    assert r["cap"] == 512 * MiB
    assert r["reserved"] < 256 * MiB


def test_grow_takes_effect(cuda):
    assert cuda["grown"] == "allocated"
    assert cuda["grown_info"][1] == 4 * GiB


def test_busy_time_from_cuda_events(cuda):
    assert cuda["busy_delta"] > 0
    assert cuda["window"]["win_peak_allocated"] >= 64 * MiB


TRAIN = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
print("total", torch.cuda.mem_get_info()[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    loss = model(torch.randn(64, 256, device=device)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_colocate_run_on_cuda(colocate, tmp_path, device):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    stats = tmp_path / "stats.json"
    proc = colocate(["run", "--device", device, "--gpu-mem", "1GiB", "--stats-file", stats, "--",
                     sys.executable, script], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"total {GiB}" in proc.stdout.splitlines()
    s = json.loads(stats.read_text())
    assert s["device"] == "cuda"
    assert s["iterations"] == 5
    assert s["mem_cap_bytes"] == GiB
    assert 0 < s["mem_allocated_peak_bytes"] <= s["mem_reserved_peak_bytes"] <= GiB
    assert s["device_busy_s"] > 0


def test_on_cap_error_one_line_on_cuda(colocate, tmp_path):
    script = tmp_path / "big.py"
    script.write_text(textwrap.dedent("""\
        import torch
        x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        print("done")
        """))
    proc = colocate(["run", "--device", "cuda", "--gpu-mem", "1GiB", "--on-cap", "error", "--",
                     sys.executable, script], cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("colocate: device memory cap")
