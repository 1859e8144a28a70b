"""The CUDA device inside a job: torch.cuda for caps, statistics and busy time.

Job-side contract on CUDA (the launcher sets CUDA_VISIBLE_DEVICES to the job's
GPUs, by NVML UUID, in ``--gpus`` order; this process's GPU is device
``JobEnv.device_index`` inside the job: ``cuda:LOCAL_RANK`` for torchrun's workers,
``cuda:0`` for a single process). Every call below names that device:

* lazy: installing the runtime does not start CUDA. ``import torch`` in a job
  process that never touches the GPU costs no CUDA context, and a script may
  still fork workers that use CUDA, as it could without colocate. The cap is
  applied from a ``torch.cuda._lazy_call`` hook when the process first starts
  CUDA (before its first allocation); until then the device total is NVML's;
* cap: ``torch.cuda.set_per_process_memory_fraction`` with a fraction chosen so
  that the caching allocator's limit is the cap to the byte. Lowering it frees
  nothing until ``empty_cache()`` (the runtime calls it at the boundary);
* a cap lowered below the job's footprint (a node shrinking an opportunistic
  job): with ``--on-cap host`` the allocator's limit stays at the footprint of
  the job's last mini-batch (reserved peak) instead, so the job does not die of
  an OOM in its next batch but cannot grow; the runtime reports what it holds
  over the cap as ``mem_floor`` and the node pauses the job (there is no host
  fallback on CUDA). The limit follows the footprint down to the cap at later
  boundaries. With ``--on-cap error`` the cap is hard: over it the job stops
  with one line;
* statistics: ``torch.cuda.memory_stats()``;
* ``torch.cuda.mem_get_info`` (and ``torch.cuda.memory.mem_get_info``) are
  wrapped so the job sees its cap as the total;
* busy time: CUDA events around each mini-batch's device phase (wall time on
  the GPU from the first forward to the optimizer step, launch gaps included).
"""

from __future__ import annotations

import logging
import sys
import threading

from colocate.base.vocab import DeviceKind, OnCap
from colocate.gpus.nvml import memory_total as nvml_memory_total
from torch_hooks.device.base import MemoryStats

log = logging.getLogger("colocate.cuda")


def memory_fraction(limit: int, total: int) -> float:
    """The ``set_per_process_memory_fraction`` argument whose allowed maximum is
    ``limit`` bytes: the allocator computes ``size_t(fraction * double(total))``,
    and ``limit / total`` can round one byte under it."""
    if total <= 0 or limit >= total:
        return 1.0
    if limit <= 0:
        return 0.0
    f = limit / total
    while int(f * float(total)) < limit:
        f = _next_up(f)
    return min(f, 1.0)


def _next_up(x: float) -> float:
    import math

    return math.nextafter(x, 2.0)


class CudaJobDevice:
    """In-job side of a CUDA GPU (see ``torch_hooks.device.base.JobDevice``)."""

    kind: str = DeviceKind.CUDA

    def __init__(self, env, torch_module=None):
        self.index = env.gpu  # the NVML index
        self.cuda_index = env.device_index  # the same GPU as this process's CUDA device ordinal
        self._requested = env.gpu_mem  # None: the whole device
        self._soft = env.on_cap != OnCap.ERROR
        self._torch = torch_module
        self._lock = threading.Lock()  # busy time
        self._mem_lock = threading.RLock()  # cap, limit, total
        self._busy = 0.0
        self._start_event = None
        self._peaks = [0, 0]
        self._last_win_peak = 0  # reserved peak of the last finished mini-batch
        self._ready = False  # CUDA started in this process and the limit applied
        self.mem_total = 0
        self._cap = 0
        self._limit = 0  # what the caching allocator may reserve: the cap, or more while a soft floor holds

    # ---- set-up --------------------------------------------------------------
    def install(self) -> None:
        if self._torch is None:
            import torch

            self._torch = torch
        torch = self._torch
        if not torch.backends.cuda.is_built():
            raise RuntimeError("COLOCATE_DEVICE=cuda but this torch build has no CUDA support")
        with self._mem_lock:
            self.mem_total = nvml_memory_total(self.index)  # until CUDA starts and says
            self._cap = self._clip(self._requested)
            self._limit = self._cap
        self._wrap_mem_get_info()
        lazy_call = getattr(torch.cuda, "_lazy_call", None)
        if lazy_call is not None:
            lazy_call(self._on_cuda_init)  # at once if CUDA is already up
        if not self._ready and (lazy_call is None or self.mem_total <= 0):
            # no hook to wait for, or no total to report until then: start CUDA now
            torch.cuda.init()
            if not self._ready:
                self._on_cuda_init()

    def _wrap_mem_get_info(self) -> None:
        cuda = self._torch.cuda
        wrapped = cuda.mem_get_info
        real = getattr(wrapped, "_colocate_real", wrapped)  # a device installed before: replace its wrapper

        def mem_get_info(device=None):
            free, _ = real(device)
            return self.mem_get_info_from(free)

        mem_get_info._colocate_real = real  # type: ignore[attr-defined]  # found again by a later install
        mem_get_info.__doc__ = real.__doc__
        self._real_mem_get_info = real
        cuda.mem_get_info = mem_get_info
        memory = getattr(cuda, "memory", None)
        if memory is not None and getattr(memory, "mem_get_info", None) in (real, wrapped):
            memory.mem_get_info = mem_get_info

    def _on_cuda_init(self) -> None:
        """Runs once when this process starts CUDA (inside torch's lazy init,
        before the first allocation): learn the real total and apply the cap."""
        if self._ready:
            return
        try:
            _, total = self._real_mem_get_info(self.cuda_index)
            with self._mem_lock:
                self.mem_total = int(total)
                self._cap = self._clip(self._requested)
                self._limit = self._cap
                self._apply(self._limit)
                self._ready = True
        except Exception as exc:  # never break the job's first CUDA call
            print(f"colocate: could not apply the GPU memory cap: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _clip(self, cap: int | None) -> int:
        if cap is None:
            return self.mem_total
        cap = int(cap)
        return min(cap, self.mem_total) if self.mem_total > 0 else cap

    def _apply(self, limit: int) -> None:
        self._torch.cuda.set_per_process_memory_fraction(memory_fraction(limit, self.mem_total), self.cuda_index)

    def _reserved(self) -> tuple[int, int]:
        """(reserved now, reserved peak of the current window)."""
        if not self._ready:
            return 0, 0
        s = self._torch.cuda.memory_stats(self.cuda_index)
        return int(s.get("reserved_bytes.all.current", 0)), int(s.get("reserved_bytes.all.peak", 0))

    # ---- limits -----------------------------------------------------------------
    def set_cap(self, cap_bytes: int) -> None:
        with self._mem_lock:
            self._requested = int(cap_bytes)
            self._cap = self._clip(self._requested)
            if not self._ready:
                self._limit = self._cap
                return
            limit = self._cap
            if self._soft:  # keep the last batch's footprint: no OOM in the next one
                limit = max(limit, *self._reserved(), self._last_win_peak)
            self._limit = limit
            self._apply(limit)

    def release_cache(self) -> int:
        if not self._ready:
            return 0
        with self._mem_lock:
            before, peak = self._reserved()
            self._torch.cuda.empty_cache()
            after, _ = self._reserved()
            if self._limit > self._cap:
                # at a boundary: a soft floor follows this batch's footprint down to the cap
                limit = max(self._cap, min(self._limit, max(before, peak)))
                if limit != self._limit:
                    self._limit = limit
                    self._apply(limit)
        return max(0, before - after)

    def allocator_limit(self) -> int:
        """Bytes the caching allocator may reserve now (>= the cap while a soft floor holds)."""
        with self._mem_lock:
            return self._limit

    # ---- statistics ---------------------------------------------------------------
    def memory(self) -> MemoryStats:
        if not self._ready:
            return MemoryStats(
                cap=self._cap, allocated=0, reserved=0, host=0,
                peak_allocated=self._peaks[0], peak_reserved=self._peaks[1], peak_host=0,
                win_peak_allocated=0, win_peak_reserved=0, win_host_touched=0,
            )
        s = self._torch.cuda.memory_stats(self.cuda_index)
        alloc, res = s.get("allocated_bytes.all.current", 0), s.get("reserved_bytes.all.current", 0)
        win_alloc, win_res = s.get("allocated_bytes.all.peak", 0), s.get("reserved_bytes.all.peak", 0)
        self._peaks = [max(self._peaks[0], win_alloc), max(self._peaks[1], win_res)]
        return MemoryStats(
            cap=self._cap, allocated=alloc, reserved=res, host=0,
            peak_allocated=self._peaks[0], peak_reserved=self._peaks[1], peak_host=0,
            win_peak_allocated=win_alloc, win_peak_reserved=win_res, win_host_touched=0,
        )

    def reset_window(self) -> None:
        if not self._ready:
            return
        m = self.memory()  # fold the window peaks into the lifetime peaks first
        self._last_win_peak = m.win_peak_reserved
        self._torch.cuda.reset_peak_memory_stats(self.cuda_index)

    def phase_start(self) -> None:
        if not self._ready:  # a forward before CUDA started is not device work
            return
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(self._torch.cuda.current_stream(self.cuda_index))  # this process's GPU, whatever the current one
        self._start_event = ev

    def phase_end(self) -> None:
        if self._start_event is None:
            return
        end = self._torch.cuda.Event(enable_timing=True)
        end.record(self._torch.cuda.current_stream(self.cuda_index))
        end.synchronize()
        with self._lock:
            self._busy += self._start_event.elapsed_time(end) / 1000.0
        self._start_event = None

    def busy_time(self) -> float:
        with self._lock:
            return self._busy

    def mem_get_info_from(self, card_free: int) -> tuple[int, int]:
        if not self._ready:
            return max(0, min(self._cap, card_free)), self._cap
        reserved = self._torch.cuda.memory_reserved(self.cuda_index)
        allocated = self._torch.cuda.memory_allocated(self.cuda_index)
        free = max(0, min(self._cap - reserved, card_free)) + (reserved - allocated)
        return free, self._cap

    def mem_get_info(self) -> tuple[int, int]:
        free, _ = self._real_mem_get_info(self.cuda_index)
        return self.mem_get_info_from(free)

    def charge(self, seconds: float) -> None:
        """Host fallback costs are paid by the hardware on CUDA: nothing to add."""

    def set_low_priority(self, on: bool) -> bool:
        """Not available on CUDA yet: stream priorities order work only inside one
        process's context, and without MPS client priorities another process's
        kernels cannot be put ahead of this one's. Returns False when asked for
        low priority (normal priority is the state it stays in)."""
        return not on
