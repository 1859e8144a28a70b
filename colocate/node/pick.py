"""Where the node puts an opportunistic worker that leaves its GPU to the node (``Register.pick_gpu``).

The rule the global scheduler's ``opportunistic`` plugin places workers by, ``colocate.base.pick`` (one GPU,
no limit on workers per GPU): among the GPUs under ``threshold`` utilization over the last 10 s whose free
memory fits the worker's request, the least utilized; at equal utilization, one beside a guaranteed worker,
then the one with fewer opportunistic workers (what the node passes of them), then the lowest index. Pure:
the node core passes what it knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from colocate.base.pick import pick

UTIL_THRESHOLD = 0.8


@dataclass(frozen=True)
class GpuRoom:
    """GPU ``index``: its utilization (0..1) over the window, the bytes its jobs leave free, whether a guaranteed
    worker runs there and how many opportunistic ones (a ``colocate.base.pick.Room``)."""

    index: int
    utilization: float
    mem_free: int
    beside_guaranteed: bool = False
    opportunistic: int = 0

    @property
    def mem_room(self) -> int:
        return self.mem_free


def pick_gpu(rooms: Iterable[GpuRoom], mem_request: int | None, threshold: float = UTIL_THRESHOLD) -> int | None:
    """The index of the GPU for a worker asking ``mem_request`` bytes (None: any, but some must be free),
    or None when no GPU is under ``threshold`` with that much free."""
    picked = pick(rooms, 1, max(1, int(mem_request or 0)), threshold)
    return None if picked is None else picked[0]
