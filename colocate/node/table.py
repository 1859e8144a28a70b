"""The node's placements and their worker processes as plain data (``PlacementTable``): what the node's pure core
changes. No I/O: ``colocate.node.worker_table.WorkerTable`` is the same table with its file (load, save, the
folder's lock), which the edge persists after every change.

Per placement: the job, its priority, whether it was promoted or is stopping, and per worker its rank, GPUs, pid,
the process's create time (so that a reused pid is never taken for the worker), its log and exit-status files and,
once known, its exit code. The table also keeps the ids of placements that ended, were refused or were stopped
before they started, so that no placement id starts twice, not even across a restart (the newest ``KEEP_IDS`` of
each). Each worker records the node incarnation (epoch) that started it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from colocate.base.vocab import JobClass

KEEP_IDS = 10000  # finished / refused / stopped-before-start placement ids remembered


@dataclass(slots=True)
class Worker:
    rank: int
    local_rank: int
    gpus: list[int]
    pid: int
    create_time: float  # psutil's create time of ``pid``: the pid and this name one process
    log_path: str
    exit_file: str
    exit_code: int | None = None  # None while it runs
    kill_at: float | None = None  # wall clock: SIGKILL the group then (a stop's grace period)
    killed: bool = False  # SIGKILL sent
    fenced: bool = False  # it ended (non-zero) while the node's lease had lapsed
    oom: bool = False  # it ended (non-zero) after saying it ran out of GPU memory
    reclaimed: bool = False  # it ended after the node stopped it for the guaranteed job's memory (``RECLAIMED``)
    epoch: int = 0  # the node incarnation that started it (0: unknown, a table of an older node)

    @property
    def running(self) -> bool:
        return self.exit_code is None


@dataclass(slots=True)
class LocalPlacement:
    placement_id: str
    job_id: str
    klass: JobClass  # the job class (the table file and the wire call it "priority")
    workers: list[Worker] = field(default_factory=list)
    promoted: bool = False
    stopping: bool = False
    stop_reason: str = ""
    ended_at: float | None = None  # wall clock when its last worker exited
    cluster: str = ""  # the cluster id of the scheduler that placed it ("" if it named none)
    start_mem: int = 0  # an opportunistic job's recommended memory and share: its policy's starting point (0: none)
    start_share: float = 0.0

    @property
    def running(self) -> bool:
        return any(w.running for w in self.workers)


def scoped(cluster_id: str, placement_id: str) -> str:
    """The node's key of a placement: its id within its cluster (the bare id when no cluster was named)."""
    return f"{cluster_id}/{placement_id}" if cluster_id else placement_id


class PlacementTable:
    """Placements by key (``scoped(cluster, placement id)``) plus the remembered keys; the node's pure core
    (``colocate.node.placements``) changes them."""

    def __init__(self) -> None:
        self.placements: dict[str, LocalPlacement] = {}
        self.done: dict[str, str] = {}  # key -> job id: ended and forgotten
        self.refused: dict[str, list[str]] = {}  # key -> [job id, reason]
        self.stopped_unknown: dict[str, str] = {}  # key -> job id: stopped before it was ever started

    # ------------------------------------------------------------------ ids
    def known(self, placement_id: str) -> bool:
        return (placement_id in self.placements or placement_id in self.done or placement_id in self.refused
                or placement_id in self.stopped_unknown)

    def remember(self, table: dict[str, Any], key: str, value: Any) -> None:
        """``table[key] = value``, keeping the newest ``KEEP_IDS`` keys."""
        table[key] = value
        while len(table) > KEEP_IDS:
            table.pop(next(iter(table)))

    def retire_ended(self, keys: list[str]) -> int:
        """Move the ended placements among ``keys`` (``scoped``) to ``done`` now; running or unknown ones stay as
        they are. Returns how many moved."""
        moved = 0
        for key in keys:
            p = self.placements.get(key)
            if p is not None and p.ended_at is not None and not p.running:
                del self.placements[key]
                self.remember(self.done, key, p.job_id)
                moved += 1
        return moved

    def retire(self, now_wall: float, keep_s: float) -> bool:
        """Move placements that ended more than ``keep_s`` ago to ``done``; True if any moved."""
        old = [p for p in self.placements.values() if p.ended_at is not None and now_wall - p.ended_at > keep_s]
        for p in old:
            key = scoped(p.cluster, p.placement_id)
            del self.placements[key]
            self.remember(self.done, key, p.job_id)
        return bool(old)
