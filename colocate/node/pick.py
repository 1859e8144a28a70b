"""Where the node puts an opportunistic worker that leaves its GPU to the node (``Register.pick_gpu``).

AntMan's rule, as the global scheduler's ``opportunistic`` plugin places workers: among the GPUs under
``threshold`` utilization over the last 10 s whose free memory fits the worker's request, the least utilized
(the lowest index at equal utilization). Pure: the node core passes what it knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

UTIL_THRESHOLD = 0.8


@dataclass(frozen=True)
class GpuRoom:
    """GPU ``index``: its utilization (0..1) over the window and the bytes its jobs leave free."""

    index: int
    utilization: float
    mem_free: int


def pick_gpu(rooms: Iterable[GpuRoom], mem_request: int | None, threshold: float = UTIL_THRESHOLD) -> int | None:
    """The index of the GPU for a worker asking ``mem_request`` bytes (None: any, but some must be free),
    or None when no GPU is under ``threshold`` with that much free."""
    need = max(1, int(mem_request or 0))
    fits = [r for r in rooms if r.utilization < threshold and r.mem_free >= need]
    if not fits:
        return None
    return min(fits, key=lambda r: (r.utilization, r.index)).index
