"""The opportunistic GPU pick (AntMan's rule), written once: the scheduler's ``opportunistic`` plugin
(``cluster.fitting``) places opportunistic workers with it, and the node (``colocate.node.pick``) the workers
that leave their GPU to it (``Register.pick_gpu``).

A GPU fits an opportunistic worker when its utilization over the last 10 s is under ``threshold``, its room
(``mem_room``: the bytes it leaves free, by the larger of allocation and report) holds the ``need`` bytes
asked (0: any room), and it holds fewer than ``max_per_gpu`` opportunistic workers (0: no limit). Among the
GPUs that fit, the pick prefers the least utilized; at equal utilization one beside a guaranteed worker
(which keeps idle GPUs whole for guaranteed jobs), then the one with fewer opportunistic workers, then the
lowest index. Pure; each side passes what it knows of its GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Room(Protocol):
    """One GPU as the pick sees it (read-only)."""

    @property
    def index(self) -> int: ...

    @property
    def utilization(self) -> float: ...  # 0..1, busy fraction over the last 10 s

    @property
    def mem_room(self) -> float: ...  # bytes an opportunistic worker may take there (inf: not stated)

    @property
    def beside_guaranteed(self) -> bool: ...  # a guaranteed worker runs there

    @property
    def opportunistic(self) -> int: ...  # opportunistic workers there


def fits(room: Room, need: float, threshold: float, max_per_gpu: int = 0) -> bool:
    """Whether an opportunistic worker asking ``need`` bytes (0: any) may go on ``room``."""
    return (room.utilization < threshold and (not need or room.mem_room >= need)
            and (not max_per_gpu or room.opportunistic < max_per_gpu))


def preference(room: Room) -> tuple[float, bool, int, int]:
    """The pick's order among GPUs that fit: smaller first."""
    return (room.utilization, not room.beside_guaranteed, room.opportunistic, room.index)


def pick(rooms: Iterable[Room], count: int, need: float, threshold: float,
         max_per_gpu: int = 0) -> tuple[int, ...] | None:
    """The indices (ascending) of the ``count`` GPUs of ``rooms`` an opportunistic worker asking ``need``
    bytes (0: any) goes on, the most preferred that fit; None when fewer than ``count`` fit."""
    if count == 0:
        return ()
    ok = [r for r in rooms if fits(r, need, threshold, max_per_gpu)]
    if len(ok) < count:
        return None
    if count == 1:  # the first of the sorted order, without sorting
        return (min(ok, key=preference).index,)
    ok.sort(key=preference)
    return tuple(sorted(r.index for r in ok[:count]))
