"""torch_hooks/device/cuda.py (and colocate/gpus/nvml.py) logic without a GPU: ``CudaJobDevice`` against a fake
``torch.cuda`` that models the parts it relies on (lazy initialization with
``_lazy_call`` queued calls, the caching allocator's fraction limit, memory
statistics, events). The same behaviour on a real GPU: tests/torch_hooks/test_cuda_device.py.
"""
from __future__ import annotations

import types

import pytest

from colocate.base.env import JobEnv
from colocate.gpus import nvml as N
from torch_hooks.device import cuda as C

MiB, GiB = 1 << 20, 1 << 30
H100_TOTAL = 85029158912  # a CUDA total for which cap / total rounds short for many caps


class FakeOOM(Exception):
    pass


class FakeCuda:
    """Enough of torch.cuda: one device, a caching allocator without segments
    (freed bytes stay reserved until empty_cache), torch's lazy-init protocol."""

    def __init__(self, total=H100_TOTAL, initialized=False):
        self.total = total
        self.initialized = initialized
        self.initializing = False
        self.inits = 0
        self.queued = []
        self.allowed = None  # allocator limit in bytes (None: no limit)
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.clock = 0.0
        self.memory = types.SimpleNamespace(mem_get_info=self.mem_get_info)
        self.devices = set()  # every device index a call named (None: the current device)
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                fake._lazy_init()
                self.t = None

            def record(self, stream=None):
                fake.devices.add(None if stream is None else stream.device)
                self.t = fake.clock

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.t - self.t) * 1000.0

        self.Event = Event

    # lazy init, as torch.cuda does it
    def _lazy_init(self):
        if self.initialized or self.initializing:
            return
        self.inits += 1
        self.initializing = True
        try:
            for fn in self.queued:
                fn()
        finally:
            self.initializing = False
        self.initialized = True

    def init(self):
        self._lazy_init()

    def _lazy_call(self, fn):
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def is_initialized(self):
        return self.initialized

    def current_stream(self, device=None):
        self.devices.add(device)
        return types.SimpleNamespace(device=device)

    # memory API
    def mem_get_info(self, device=None):
        self.devices.add(device)
        self._lazy_init()
        return self.total - self.reserved, self.total

    def set_per_process_memory_fraction(self, fraction, device=None):
        self.devices.add(device)
        self._lazy_init()
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(fraction)
        self.allowed = None if fraction >= 1.0 else int(fraction * float(self.total))

    def memory_stats(self, device=None):
        self.devices.add(device)
        if not self.initialized:
            return {}
        return {"allocated_bytes.all.current": self.allocated, "reserved_bytes.all.current": self.reserved,
                "allocated_bytes.all.peak": self.peak_allocated, "reserved_bytes.all.peak": self.peak_reserved}

    def memory_reserved(self, device=None):
        self.devices.add(device)
        return self.memory_stats(device).get("reserved_bytes.all.current", 0)

    def memory_allocated(self, device=None):
        self.devices.add(device)
        return self.memory_stats(device).get("allocated_bytes.all.current", 0)

    def empty_cache(self):
        if self.initialized:
            self.reserved = self.allocated

    def reset_peak_memory_stats(self, device=None):
        self.devices.add(device)
        assert self.initialized, "resetPeakStats before the allocator exists"
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    # the script's side
    def alloc(self, n):
        self._lazy_init()
        need = max(0, self.allocated + n - self.reserved)
        if need and self.allowed is not None and self.reserved + need > self.allowed:
            self.empty_cache()  # the allocator frees its cache and retries before giving up
            need = max(0, self.allocated + n - self.reserved)
            if self.reserved + need > self.allowed:
                raise FakeOOM(f"CUDA out of memory. Tried to allocate {n}; {self.allowed} allowed")
        self.reserved += need
        self.allocated += n
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n):
        self.allocated -= n


def fake_torch(cuda_built=True, **kw):
    cuda = FakeCuda(**kw)
    backends = types.SimpleNamespace(cuda=types.SimpleNamespace(is_built=lambda: cuda_built))
    return types.SimpleNamespace(cuda=cuda, backends=backends)


@pytest.fixture
def nvml(monkeypatch):
    """NVML's view of GPU 0 (a little more than CUDA's total, as on real cards)."""
    state = {"total": H100_TOTAL + 512 * MiB}
    monkeypatch.setattr(C, "nvml_memory_total", lambda index: state["total"])
    return state


def device(torch, **env):
    dev = C.CudaJobDevice(JobEnv(device="cuda", **env), torch_module=torch)
    dev.install()
    return dev


def test_cuda_device_implements_the_job_device_interface():
    from torch_hooks.device.base import JobDevice

    wanted = {n for n in vars(JobDevice) if not n.startswith("_")} | set(JobDevice.__annotations__)
    missing = sorted(n for n in wanted if not hasattr(C.CudaJobDevice, n) and n not in ("index", "mem_total"))
    assert not missing, f"CudaJobDevice lacks {missing}"
    dev = C.CudaJobDevice(JobEnv(device="cuda"), torch_module=fake_torch())
    assert dev.index == 0 and dev.mem_total == 0 and dev.kind == "cuda"


def test_low_priority_is_not_available_on_cuda(nvml):
    dev = device(fake_torch(), gpu_mem=1 * GiB)
    assert dev.set_low_priority(True) is False  # the node link logs that the device could not
    assert dev.set_low_priority(False) is True


# ---- the fraction ---------------------------------------------------------------
@pytest.mark.parametrize("total", [H100_TOTAL, 84987740160, 81559 * MiB, 16 * GiB - 3 * MiB, 2**33 + 12345])
def test_memory_fraction_gives_the_cap_to_the_byte(total):
    caps = list(range(1 * MiB, 4 * GiB, 2 * MiB)) + [total - 1, 12345, 1]
    short = [c for c in caps if int((c / total) * float(total)) < c]
    for cap in caps:
        assert int(C.memory_fraction(cap, total) * float(total)) == cap, cap
    if total == H100_TOTAL:
        assert short  # the plain ratio loses a byte for some caps: a cap-sized segment would be refused


def test_memory_fraction_edges():
    assert C.memory_fraction(5, 0) == 1.0
    assert C.memory_fraction(10 * GiB, 10 * GiB) == 1.0 == C.memory_fraction(11 * GiB, 10 * GiB)
    assert C.memory_fraction(0, 10 * GiB) == 0.0
    assert isinstance(C.memory_fraction(1, 10), float)


# ---- lazy start -------------------------------------------------------------------
def test_install_does_not_start_cuda(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=1 * GiB)
    assert t.cuda.inits == 0 and not t.cuda.initialized
    m = dev.memory()
    assert m.cap == 1 * GiB and m.reserved == m.allocated == 0
    dev.reset_window()
    dev.phase_start()
    dev.phase_end()
    assert dev.release_cache() == 0
    assert dev.busy_time() == 0.0
    assert t.cuda.inits == 0, "bookkeeping before the job's first CUDA call must not start CUDA"


def test_cap_applies_at_first_cuda_use_to_the_byte(nvml):
    t = fake_torch()
    cap = 55574528  # one of the caps the plain ratio rounds short on this total
    dev = device(t, gpu_mem=cap)
    t.cuda.alloc(cap)  # starts CUDA: the queued hook runs before the allocation
    assert t.cuda.inits == 1
    assert t.cuda.allowed == cap
    assert dev.mem_total == H100_TOTAL and dev.memory().cap == cap
    with pytest.raises(FakeOOM):
        t.cuda.alloc(1)


def test_uncapped_job_reports_nvml_total_then_cuda_total(nvml):
    t = fake_torch()
    dev = device(t)
    assert dev.memory().cap == nvml["total"]
    t.cuda.alloc(1 * MiB)
    assert dev.memory().cap == dev.mem_total == H100_TOTAL
    assert t.cuda.allowed is None  # fraction 1.0: no limit


def test_cuda_already_started_applies_at_once(nvml):
    t = fake_torch(initialized=True)
    dev = device(t, gpu_mem=2 * GiB)
    assert t.cuda.allowed == 2 * GiB and dev.mem_total == H100_TOTAL


def test_without_nvml_cuda_starts_at_install(monkeypatch):
    monkeypatch.setattr(C, "nvml_memory_total", lambda index: 0)
    t = fake_torch()
    dev = device(t, gpu_mem=1 * GiB)
    assert t.cuda.initialized and t.cuda.allowed == 1 * GiB and dev.mem_total == H100_TOTAL


def test_cpu_only_torch_is_an_error(nvml):
    with pytest.raises(RuntimeError, match="no CUDA support"):
        device(fake_torch(cuda_built=False))


def test_cap_changed_before_cuda_starts(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=1 * GiB)
    dev.set_cap(3 * GiB)
    assert t.cuda.inits == 0 and dev.memory().cap == 3 * GiB
    t.cuda.alloc(1)
    assert t.cuda.allowed == 3 * GiB


def test_hook_failure_does_not_break_the_job(nvml, capsys):
    t = fake_torch()
    dev = device(t, gpu_mem=1 * GiB)

    def broken(*a, **k):
        raise RuntimeError("boom")

    t.cuda.set_per_process_memory_fraction = broken
    t.cuda.alloc(1)  # the job's own CUDA call still works
    assert "could not apply the GPU memory cap" in capsys.readouterr().err
    assert dev.memory().reserved == 0  # not ready: statistics stay empty rather than wrong


# ---- mem_get_info ---------------------------------------------------------------
def test_mem_get_info_wrapped_under_both_names(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=1 * GiB)
    assert t.cuda.memory.mem_get_info is t.cuda.mem_get_info
    free, total = t.cuda.mem_get_info()  # starts CUDA itself
    assert total == 1 * GiB and free == 1 * GiB
    t.cuda.alloc(256 * MiB)
    t.cuda.free(128 * MiB)
    free, total = t.cuda.memory.mem_get_info(0)
    assert total == 1 * GiB and free == 1 * GiB - 128 * MiB  # cached bytes count as free
    assert dev.mem_get_info() == (free, total)


def test_second_install_rewraps_the_real_function(nvml):
    t = fake_torch()
    device(t, gpu_mem=1 * GiB)
    dev2 = device(t, gpu_mem=2 * GiB)
    assert dev2._real_mem_get_info == t.cuda.__class__.mem_get_info.__get__(t.cuda)
    assert t.cuda.mem_get_info()[1] == 2 * GiB


# ---- shrinking below what the job holds -----------------------------------------
def test_soft_floor_keeps_the_footprint_with_on_cap_host(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=2 * GiB)  # on_cap host (default)

    def batch(activations):
        t.cuda.alloc(activations)
        t.cuda.free(activations)

    def boundary():
        released = dev.release_cache()
        dev.reset_window()
        return released

    t.cuda.alloc(600 * MiB)  # live: weights and optimizer state
    batch(400 * MiB)
    boundary()  # reserved peak of that batch: 1000 MiB; the cache is released at the boundary
    dev.set_cap(256 * MiB)  # between batches, as a node does it
    assert dev.memory().cap == 256 * MiB
    assert dev.allocator_limit() == 1000 * MiB == t.cuda.allowed  # the last batch's footprint
    batch(400 * MiB)  # the next batch still fits: no OOM
    with pytest.raises(FakeOOM):
        t.cuda.alloc(500 * MiB)  # but the job cannot grow (the allocator emptied its cache trying)
    boundary()
    assert dev.memory().reserved == 600 * MiB > dev.memory().cap  # the floor the runtime reports
    assert dev.allocator_limit() == 1000 * MiB
    t.cuda.free(600 * MiB)  # the live set shrinks
    batch(100 * MiB)
    boundary()
    assert dev.allocator_limit() == 600 * MiB == t.cuda.allowed  # follows the footprint down
    batch(100 * MiB)
    boundary()
    assert dev.allocator_limit() == 256 * MiB == t.cuda.allowed  # under the cap again: the cap holds
    dev.set_cap(4 * GiB)
    assert t.cuda.allowed == 4 * GiB == dev.allocator_limit()


def test_soft_floor_set_mid_batch(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=2 * GiB)
    t.cuda.alloc(600 * MiB)
    t.cuda.alloc(300 * MiB)  # mid-batch: activations live
    dev.set_cap(256 * MiB)
    assert dev.allocator_limit() == 900 * MiB
    t.cuda.free(300 * MiB)


def test_hard_cap_with_on_cap_error(nvml):
    t = fake_torch()
    dev = device(t, gpu_mem=2 * GiB, on_cap="error")
    t.cuda.alloc(600 * MiB)
    dev.set_cap(256 * MiB)
    assert dev.allocator_limit() == 256 * MiB == t.cuda.allowed
    with pytest.raises(FakeOOM):
        t.cuda.alloc(1 * MiB)


def test_runtime_reports_the_floor_and_busy_time(nvml):
    from torch_hooks.runtime import Runtime

    t = fake_torch()
    dev = device(t, gpu_mem=2 * GiB)
    clock = [0.0]
    rt = Runtime(JobEnv(device="cuda", gpu_mem=2 * GiB), dev, clock=lambda: clock[0])
    assert rt.limits()["mem_cap"] == 2 * GiB
    t.cuda.alloc(600 * MiB)  # weights

    def batch():
        rt.on_device_start()
        t.cuda.alloc(100 * MiB)  # activations
        t.cuda.clock += 0.25
        clock[0] += 0.3
        t.cuda.free(100 * MiB)
        return rt.on_boundary()

    rec = batch()
    assert rec.busy_s == pytest.approx(0.25) and rec.mem_floor == 0 and rec.mem_reserved_peak == 700 * MiB
    rt.set_limits(mem_cap=256 * MiB)  # below the live set: the next batch runs on (no OOM)
    rec = batch()
    assert rec.mem_cap == 256 * MiB and rec.mem_floor == 600 * MiB and rec.mem_reserved == 600 * MiB
    rec = batch()
    assert rec.mem_floor == 600 * MiB
    s = rt.summary()
    assert s["mem_floor_peak_bytes"] == 600 * MiB and s["mem_reserved_peak_bytes"] == 700 * MiB
    assert s["device_busy_s"] == pytest.approx(0.75)


# ---- the launcher's choice of GPU ---------------------------------------------
def test_visible_device_falls_back_to_the_index(monkeypatch):
    def no_nvml():
        raise RuntimeError("no NVML")

    monkeypatch.setattr(N, "_nvml", no_nvml)
    assert N.visible_device(3) == "3"
    assert N.memory_total(0) == 0 and N.device_count() == 0


def test_visible_device_is_the_nvml_uuid(monkeypatch):
    fake = types.SimpleNamespace(
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: {"h0": b"GPU-aaa", "h1": "GPU-bbb"}[h],
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * GiB),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100",
    )
    monkeypatch.setattr(N, "_nvml", lambda: fake)
    assert N.visible_device(0) == "GPU-aaa" and N.visible_device(1) == "GPU-bbb"
    assert [(g.index, g.name, g.mem_total) for g in N.node_gpus()] == [(0, "NVIDIA H100", 80 * GiB), (1, "NVIDIA H100", 80 * GiB)]

    from colocate import launcher as L

    env = L.job_environment(L.RunSpec(command=("x",), device="cuda", gpu=1), {"PATH": "/usr/bin"}, "/tmp/s")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-bbb" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with pytest.raises(L.LaunchError, match="--gpus 2: this machine has 2 CUDA GPU"):
        L.launch(L.RunSpec(command=("true",), device="cuda", gpu=2))


def test_a_torchrun_worker_manages_its_own_device_index(nvml):
    """COLOCATE_GPUS=2,5 and LOCAL_RANK=1: NVML GPU 5, which is cuda:1 in the job; every call names device 1."""
    torch = fake_torch()
    env = JobEnv.from_environ({"COLOCATE_DEVICE": "cuda", "COLOCATE_GPUS": "2,5", "COLOCATE_GPU_MEM": str(GiB),
                               "LOCAL_RANK": "1", "RANK": "3", "WORLD_SIZE": "4", "COLOCATE_JOB_ID": "ddp"})
    assert (env.gpu, env.device_index, env.worker_id) == (5, 1, "ddp/3")
    dev = C.CudaJobDevice(env, torch_module=torch)
    dev.install()
    torch.cuda.alloc(256 * MiB)
    dev.phase_start()
    torch.cuda.clock += 0.25
    dev.phase_end()
    dev.set_cap(512 * MiB)
    dev.release_cache()
    dev.memory()
    dev.reset_window()
    dev.mem_get_info()
    assert torch.cuda.devices == {1}, torch.cuda.devices
    assert dev.index == 5 and dev.busy_time() == pytest.approx(0.25)
    single = C.CudaJobDevice(JobEnv.from_environ({"COLOCATE_DEVICE": "cuda", "COLOCATE_GPUS": "2,5"}), torch_module=torch)
    assert (single.index, single.cuda_index) == (2, 0)  # no LOCAL_RANK: the first GPU, cuda:0
