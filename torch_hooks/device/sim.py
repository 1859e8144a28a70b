"""The simulated GPU: one CPU core of compute and a byte budget of memory.

Jobs placed on the same simulated GPU are pinned to the same core with one
intra-op thread, so their device work time-shares that core as kernels of
different processes time-share a GPU. A job's device busy time is the CPU time
its process spends there. A job joins the core at its first device work
(``phase_start``): until then (Python and torch start-up, model construction) it
is host work and runs off that core, never competing with device work there;
low device priority asked for before then takes effect when it joins. Memory is the caching-allocator model of
``torch_hooks/csrc/sim_allocator.cpp`` over all of the job's tensor storage, held to the job's cap and, where the
job has a node, to the GPU's total across all its jobs (the node's ledger, ``colocate.gpus.ledger``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from colocate.base.vocab import DeviceKind, OnCap
from colocate.gpus import ledger
from colocate.gpus.sim import core_of, keep_off_cores
from torch_hooks.device import autogroup
from torch_hooks.device.base import MemoryStats

log = logging.getLogger("colocate.runtime")


class SimJobDevice:
    """In-job side of a simulated GPU (see ``torch_hooks.device.base.JobDevice``)."""

    kind: str = DeviceKind.SIM

    def __init__(self, env):
        self.index = env.gpu
        self.core = core_of(env)
        self.mem_total = env.sim_gpu_mem
        self._cap = min(env.gpu_mem, self.mem_total) if env.gpu_mem is not None else self.mem_total
        self._error_on_cap = env.on_cap == OnCap.ERROR
        self._job_id = env.job_id  # its other processes (ranks) may share this one's session
        self._node = env.node  # the node whose ledger holds the GPU's total ("": none, the cap alone)
        self.ledger: ledger.Slot | None = None  # this process's slot in the GPU's ledger, once attached
        self._ext: Any = None  # the compiled allocator module, loaded by install()
        self._lock = threading.Lock()  # orders joining the core with priority changes
        self.joined = False  # the process runs on the GPU's core (from its first device work)
        self.speed = 1.0  # the GPU type's relative speed (the node's Welcome): device work takes 1/speed as long
        self.type_name = ""  # the GPU's type (the node's Welcome; "": untyped)
        self._phase_busy: float | None = None  # busy_time() at the current mini-batch's device work start
        self._low = False  # low device priority asked for
        # control threads (the node link), host work: native id -> [CPU clock id, last seconds read], or None
        # where the thread's CPU clock cannot be read
        self._control: dict[int, list | None] = {}
        try:
            self._host_cpus = os.sched_getaffinity(0) - {self.core}  # where host work may run
        except (AttributeError, OSError):
            self._host_cpus = set()

    def install(self) -> None:
        import torch

        from torch_hooks import _ext

        keep_off_cores({self.core})  # start-up is host work (the launcher's child is off the core already)
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
        if self._node:
            self.attach_ledger(ledger.ledger_path(self._node, self.index))

    def attach_ledger(self, path: str) -> bool:
        """Hold this process's device bytes, with every other job's on the GPU, to the GPU's total through the
        ledger at ``path`` (``colocate.gpus.ledger``). False, and said once in the log, where it cannot: then only
        the job's own cap holds."""
        slot, why = ledger.attach(path, int(self._ext.stats()["reserved"]))
        if slot is None:
            log.warning("simulated GPU %d: only this job's cap holds its memory, not the GPU's total beside other "
                        "jobs: %s", self.index, why)
            return False
        if not self._ext.set_ledger(slot.address, slot.fd, slot.index):
            return False
        self.ledger = slot
        return True

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
        bytes are within ``cap``: a boundary has nothing to charge or enforce (never on a slower GPU type,
        whose boundary charges the extra device time)."""
        if self.speed < 1.0:
            return False
        s = self._ext.stats()
        return not (s["win_host_at_start"] or s["win_host_alloc_bytes"]) and s["reserved"] <= cap

    def busy_time(self) -> float:
        """The process's CPU seconds but its control threads' (they run off the core: not device work)."""
        busy = time.process_time()
        for clock in list(self._control.values()):
            if clock is None:
                continue
            try:
                clock[1] = time.clock_gettime(clock[0])
            except OSError:  # the thread has ended: its time stays in the process's, as last read
                pass
            busy -= clock[1]
        return busy

    def set_speed(self, speed: float, type_name: str = "") -> None:
        """The GPU type's relative speed, in (0, 1] (1: the fastest type; values outside are clamped), and its
        name ("": untyped)."""
        self.speed = min(1.0, max(1e-3, float(speed)))
        self.type_name = str(type_name)

    def phase_start(self) -> None:
        """Device work of a mini-batch begins: the first one moves the process onto the GPU's core."""
        if not self.joined:
            self.join_core()
        if self.speed < 1.0:
            self._phase_busy = self.busy_time()

    def join_core(self) -> None:
        """Pin every thread of this process but its control threads to the GPU's core (threads started
        later inherit it) and take the device priority asked for so far. Idempotent."""
        with self._lock:
            if self.joined:
                return
            self.joined = True
            for tid in _threads():
                if tid in self._control:
                    continue
                try:
                    os.sched_setaffinity(tid, {self.core})
                except (AttributeError, OSError):  # not Linux, core not allowed, or the thread has exited
                    pass
            if self._low:
                self._set_class(True)

    def control_thread(self) -> None:
        """The calling thread carries the job's control messages (the node link): host work, kept off the
        GPU's core and out of the idle class, so a job that yields the device still answers its node at
        once (on a GPU, too, only kernels have a priority, not the process's CPU threads). Idempotent."""
        tid = threading.get_native_id()
        with self._lock:
            try:
                clock = time.pthread_getcpuclockid(threading.get_ident())
                self._control[tid] = [clock, time.clock_gettime(clock)]
            except (AttributeError, OSError):  # no per-thread CPU clocks here: its time counts as busy
                self._control[tid] = None
            try:
                if self._host_cpus:
                    os.sched_setaffinity(0, self._host_cpus)
            except (AttributeError, OSError):
                pass
            try:  # out of the idle class even where the affinity was refused
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except (AttributeError, OSError):
                pass

    def phase_end(self) -> None:
        """Device work of a mini-batch ends: on a slower GPU type (``speed`` < 1) the device work it took,
        ``d``, is stretched to ``d / speed`` by charging ``d * (1/speed - 1)`` more on the core."""
        start, self._phase_busy = self._phase_busy, None
        if start is not None and self.speed < 1.0:
            self.charge((self.busy_time() - start) * (1.0 / self.speed - 1.0))

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
        inherit the class. Before the job joins the core the wish is kept and
        taken at the join (start-up runs at normal priority, off the core).
        Returns False if the OS refused (an unprivileged process may not leave
        the idle class; it then stays there). The idle class orders threads
        within one session only (Linux autogroups): a job in a session of its
        own also lowers its session's weight (``torch_hooks.device.autogroup``).
        """
        with self._lock:
            self._low = bool(on)
            return self._set_class(on) if self.joined else True

    def _set_class(self, on: bool) -> bool:
        policy = os.SCHED_IDLE if on else os.SCHED_OTHER
        ok = True
        for tid in _threads():
            if tid in self._control:
                continue
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except ProcessLookupError:  # the thread has exited
                pass
            except (AttributeError, OSError):
                ok = False
        return autogroup.lower(on, self._job_id) and ok

    def charge(self, seconds: float) -> None:
        """Spend ``seconds`` of device time (this thread's CPU time on the core)."""
        if seconds <= 0:
            return
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass


def _threads() -> list[int]:
    """Native ids of this process's threads (0, the caller, where /proc is missing)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
