"""The CUDA device: NVML for the node side, torch.cuda for the job side.

Job-side contract on CUDA (the launcher sets CUDA_VISIBLE_DEVICES to the job's
GPU, so it is device 0 inside the job):

* cap: ``torch.cuda.set_per_process_memory_fraction(cap / total)``; lowering it
  frees nothing until ``empty_cache()`` (the runtime calls it at the boundary);
* statistics: ``torch.cuda.memory_stats()``;
* ``torch.cuda.mem_get_info`` is wrapped so the job sees its cap as the total;
* busy time: CUDA events around each mini-batch's device phase.

Over the cap the caching allocator raises ``torch.OutOfMemoryError``; the host
fallback (``--on-cap host``) is not available on CUDA yet (see README).
"""

from __future__ import annotations

import threading

from colocate.device.base import GpuSpec, MemoryStats


def nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def node_gpus() -> list[GpuSpec]:
    import pynvml

    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name = pynvml.nvmlDeviceGetName(h)
        out.append(GpuSpec(index=i, kind="cuda", mem_total=int(mem.total), name=str(name)))
    return out


def nvml_utilization(index: int) -> float:
    """Device utilization 0..1 over NVML's last sample period."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0


class CudaJobDevice:
    """In-job side of a CUDA GPU (see ``colocate.device.base.JobDevice``)."""

    kind = "cuda"

    def __init__(self, env):
        self.index = env.gpu
        self._requested_cap = env.gpu_mem
        self._lock = threading.Lock()
        self._busy = 0.0
        self._start_event = None
        self._peaks = [0, 0]
        self.mem_total = 0
        self._cap = 0

    def install(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("COLOCATE_DEVICE=cuda but torch.cuda.is_available() is False")
        self._torch = torch
        _, total = torch.cuda.mem_get_info(0)
        self.mem_total = int(total)
        self.set_cap(self._requested_cap if self._requested_cap is not None else self.mem_total)
        real_mem_get_info = torch.cuda.mem_get_info

        def mem_get_info(device=None):
            free, _ = real_mem_get_info(device)
            return self.mem_get_info_from(free)

        torch.cuda.mem_get_info = mem_get_info
        self._real_mem_get_info = real_mem_get_info

    def set_cap(self, cap_bytes: int) -> None:
        self._cap = min(int(cap_bytes), self.mem_total)
        self._torch.cuda.set_per_process_memory_fraction(self._cap / self.mem_total, 0)

    def release_cache(self) -> int:
        before = self._torch.cuda.memory_reserved(0)
        self._torch.cuda.empty_cache()
        return max(0, before - self._torch.cuda.memory_reserved(0))

    def memory(self) -> MemoryStats:
        s = self._torch.cuda.memory_stats(0)
        alloc, res = s.get("allocated_bytes.all.current", 0), s.get("reserved_bytes.all.current", 0)
        win_alloc, win_res = s.get("allocated_bytes.all.peak", 0), s.get("reserved_bytes.all.peak", 0)
        self._peaks = [max(self._peaks[0], win_alloc), max(self._peaks[1], win_res)]
        return MemoryStats(
            cap=self._cap, allocated=alloc, reserved=res, host=0,
            peak_allocated=self._peaks[0], peak_reserved=self._peaks[1], peak_host=0,
            win_peak_allocated=win_alloc, win_peak_reserved=win_res, win_host_touched=0,
        )

    def reset_window(self) -> None:
        self.memory()  # fold the window peaks into the lifetime peaks first
        self._torch.cuda.reset_peak_memory_stats(0)

    def phase_start(self) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        self._start_event = ev

    def phase_end(self) -> None:
        if self._start_event is None:
            return
        end = self._torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        with self._lock:
            self._busy += self._start_event.elapsed_time(end) / 1000.0
        self._start_event = None

    def busy_time(self) -> float:
        with self._lock:
            return self._busy

    def mem_get_info_from(self, card_free: int) -> tuple[int, int]:
        reserved = self._torch.cuda.memory_reserved(0)
        allocated = self._torch.cuda.memory_allocated(0)
        free = max(0, min(self._cap - reserved, card_free)) + (reserved - allocated)
        return free, self._cap

    def mem_get_info(self) -> tuple[int, int]:
        free, _ = self._real_mem_get_info(0)
        return self.mem_get_info_from(free)

    def charge(self, seconds: float) -> None:
        """Host fallback costs are paid by the hardware on CUDA: nothing to add."""
