"""The device-phase gate: opportunistic jobs keep their device work out of the
guaranteed job's device phases on the same GPU.

A 64-byte block in shared memory per (node, GPU), laid out as the C++
``GateBlock`` in ``csrc/sim_allocator.cpp``::

    int32 active      1 while the guaranteed job's mini-batch device work runs
    int32 pid         the publisher
    double next_start monotonic time its next device phase is expected
    uint64 phases     device phases started so far
    double gap        typical idle gap between its device phases (followers keep half of it)

The guaranteed job is the only writer (``GatePublisher``); opportunistic jobs
follow it (``GateFollower``) when the node's limits say ``gate``: the sim
allocator then waits before each allocation while the gate is closed, which
holds the job's next operator the way AntMan holds kernel launches. The gate
closes a guard before the guaranteed job's expected start, sized from the
follower's own operator times, since an operator in flight cannot be recalled. On CUDA the
same block can drive a launch hold; only the sim follower is built today.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import statistics
import time
from collections import deque

from colocate.gpus.ledger import shared_path

BLOCK_BYTES = 64


def gate_path(node_endpoint: str, gpu: int) -> str:
    """Where the gate block of ``gpu`` under the node at ``node_endpoint`` lives."""
    return shared_path("gate", node_endpoint, gpu)


def _open_block(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < BLOCK_BYTES:
            os.ftruncate(fd, BLOCK_BYTES)
        return mmap.mmap(fd, BLOCK_BYTES)
    finally:
        os.close(fd)


class _Block:
    def __init__(self, path: str):
        self.path = path
        self.mm = _open_block(path)
        self.active = ctypes.c_int32.from_buffer(self.mm, 0)
        self.pid = ctypes.c_int32.from_buffer(self.mm, 4)
        self.next_start = ctypes.c_double.from_buffer(self.mm, 8)
        self.phases = ctypes.c_uint64.from_buffer(self.mm, 16)
        self.gap = ctypes.c_double.from_buffer(self.mm, 24)

    def address(self) -> int:
        return ctypes.addressof(self.active)


class GatePublisher:
    """Written by the guaranteed job: ``start()`` at device work, ``end()`` at the boundary."""

    def __init__(self, path: str, clock=time.monotonic):
        self._b = _Block(path)
        self._clock = clock
        self._gaps: deque[float] = deque(maxlen=9)
        self._b.pid.value = os.getpid()
        self._b.active.value = 0
        self._b.next_start.value = 0.0

    def start(self) -> None:
        self._b.phases.value += 1
        self._b.active.value = 1

    def end(self, resume_at: float, device_start_s: float | None) -> None:
        """The phase ended; the next one is expected ``median gap`` after ``resume_at``."""
        if device_start_s is not None:
            self._gaps.append(device_start_s)
        gap = statistics.median(self._gaps) if self._gaps else 0.0
        self._b.gap.value = gap
        self._b.next_start.value = resume_at + gap if gap > 0 else 0.0
        self._b.active.value = 0

    def close(self) -> None:
        self._b.active.value = 0
        self._b.next_start.value = 0.0


class GateFollower:
    """Makes this (opportunistic, sim) process wait while the gate is closed."""

    def __init__(self, path: str, ext, guard_min_s: float = 0.0015, guard_max_s: float = 0.015,
                 guard_mult: float = 2.0, late_s: float = 0.02, max_wait_s: float = 0.5):
        self._b = _Block(path)
        self._ext = ext
        self._params = (guard_min_s, guard_max_s, guard_mult, late_s, max_wait_s)
        self.enabled = False

    def set_enabled(self, on: bool) -> None:
        self.enabled = bool(on)
        self._ext.set_gate(self._b.address(), self.enabled, *self._params)

    def stats(self) -> dict:
        return dict(self._ext.gate_stats())
