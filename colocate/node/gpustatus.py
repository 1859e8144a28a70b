"""Each GPU's state for the scheduler's ``NodeStatus``: utilization over the last 10 s and memory in use.

* simulated GPUs: from the node core (``core_gpu_status``): the device busy time the GPU's jobs
  reported in the window, and the reserved bytes of each job's last mini-batch (a fixed partition's whole cap);
* CUDA GPUs: from NVML (``NvmlSampler``): the mean of NVML's utilization samples taken over the window
  (at most one per second) and NVML's memory in use, which counts every process on the card.
"""

from __future__ import annotations

from collections import deque

from colocate import protocol as P

WINDOW_S = 10.0


def core_gpu_status(core, now: float, window_s: float = WINDOW_S) -> list:
    """``[GpuStatus]`` of the core's GPUs (``now``: the core's clock). Call under the node's lock."""
    out = []
    for g in core.gpus.values():
        jobs = [core.jobs[j] for j in g.jobs if j in core.jobs]
        used = sum(j.mem_held for j in jobs)
        out.append(P.GpuStatus(index=g.spec.index, utilization=g.utilization(now, window_s), mem_used=int(used)))
    return out


class NvmlSampler:
    """``sampler(now) -> [GpuStatus]`` for NVML GPUs; a GPU NVML cannot read reports 0 (and is logged once)."""

    def __init__(self, indices, window_s: float = WINDOW_S, nvml=None):
        from colocate.gpus import nvml as default_nvml

        self.indices = list(indices)
        self.window_s = window_s
        self.nvml = nvml or default_nvml
        self.samples: dict[int, deque[tuple[float, float]]] = {i: deque() for i in self.indices}  # (time, utilization)
        self._last_sample: float | None = None

    def __call__(self, now: float) -> list:
        if self._last_sample is None or now - self._last_sample >= 1.0:
            self._last_sample = now
            for i in self.indices:
                try:
                    self.samples[i].append((now, float(self.nvml.utilization(i))))
                except Exception:
                    pass
        out = []
        for i in self.indices:
            window = self.samples[i]
            while window and window[0][0] < now - self.window_s:
                window.popleft()
            util = sum(u for _, u in window) / len(window) if window else 0.0
            out.append(P.GpuStatus(index=i, utilization=min(1.0, max(0.0, util)), mem_used=self.nvml.memory_used(i)))
        return out
