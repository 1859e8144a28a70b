"""The simulated GPU: one CPU core of compute and a byte budget of memory.

Jobs placed on the same simulated GPU are pinned to the same core with one
intra-op thread, so their device work time-shares that core as kernels of
different processes time-share a GPU. A job's device busy time is the CPU time
its process spends there. Memory is the caching-allocator model of
``torch_hooks/csrc/sim_allocator.cpp`` over all of the job's tensor storage.
"""

from __future__ import annotations

import os
import time
from typing import Any

from colocate.gpus.sim import core_of
from colocate.vocab import DeviceKind, OnCap
from torch_hooks.device.base import MemoryStats


class SimJobDevice:
    """In-job side of a simulated GPU (see ``torch_hooks.device.base.JobDevice``)."""

    kind: str = DeviceKind.SIM

    def __init__(self, env):
        self.index = env.gpu
        self.core = core_of(env)
        self.mem_total = env.sim_gpu_mem
        self._cap = min(env.gpu_mem, self.mem_total) if env.gpu_mem is not None else self.mem_total
        self._error_on_cap = env.on_cap == OnCap.ERROR
        self._ext: Any = None  # the compiled allocator module, loaded by install()

    def install(self) -> None:
        import torch

        from torch_hooks import _ext

        try:
            os.sched_setaffinity(0, {self.core})
        except (AttributeError, OSError):  # not Linux, or core not allowed
            pass
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already started some parallel work
            pass
        self._ext = _ext.load()
        self._ext.install()
        self._ext.set_cap(self._cap)
        self._ext.set_error_on_cap(self._error_on_cap)
        self._ext.reset_window()

    def set_cap(self, cap_bytes: int) -> None:
        self._cap = min(int(cap_bytes), self.mem_total)
        self._ext.set_cap(self._cap)

    def release_cache(self) -> int:
        return int(self._ext.empty_cache())

    def memory(self) -> MemoryStats:
        s = self._ext.stats()
        return MemoryStats(
            cap=self._cap,
            allocated=s["allocated"],
            reserved=s["reserved"],
            host=s["host"],
            peak_allocated=s["peak_allocated"],
            peak_reserved=s["peak_reserved"],
            peak_host=s["peak_host"],
            win_peak_allocated=s["win_peak_allocated"],
            win_peak_reserved=s["win_peak_reserved"],
            win_host_touched=s["win_host_at_start"] + s["win_host_alloc_bytes"],
        )

    def reset_window(self) -> None:
        self._ext.reset_window()

    def quiet(self, cap: int) -> bool:
        """True when, since the window's start, no host-served bytes were touched and the reserved
        bytes are within ``cap``: a boundary has nothing to charge or enforce."""
        s = self._ext.stats()
        return not (s["win_host_at_start"] or s["win_host_alloc_bytes"]) and s["reserved"] <= cap

    def busy_time(self) -> float:
        return time.process_time()

    def phase_start(self) -> None:
        """Device work of a mini-batch begins (nothing to do on sim)."""

    def phase_end(self) -> None:
        """Device work of a mini-batch ends (nothing to do on sim)."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) as the job should see them: the cap is the total."""
        s = self._ext.stats()
        return max(0, self._cap - s["reserved"]) + s["cached"], self._cap

    def set_low_priority(self, on: bool) -> bool:
        """Run this process's threads in the core's idle scheduling class (``SCHED_IDLE``),
        or back in the normal one: the core then runs this job only while no
        normal-priority job on it is runnable, and a guaranteed job that wakes
        takes the core at once (the device's priority scheduling, as MPS client
        priority or stream priorities give on a GPU). Threads started later
        inherit the class. Returns False if the OS refused (an unprivileged
        process may not leave the idle class; it then stays there).
        """
        policy = os.SCHED_IDLE if on else os.SCHED_OTHER
        ok = True
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            tids = [0]
        for tid in tids:
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except ProcessLookupError:  # the thread has exited
                pass
            except (AttributeError, OSError):
                ok = False
        return ok

    def charge(self, seconds: float) -> None:
        """Spend ``seconds`` of device time (this thread's CPU time on the core)."""
        if seconds <= 0:
            return
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
