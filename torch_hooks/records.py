"""Per-mini-batch records and the process summary written for ``--stats-file``.

Units: seconds and bytes. The summary's fields are ``colocate.base.stats.FIELDS`` (the one
definition): ``busy_fraction`` is device busy time over wall time, both counted from the job's
first device work (its first module forward; runtime install when it has none) to the summary:
start-up (imports, building the model) is host work.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass

from colocate.base.stats import FIELDS


@dataclass(frozen=True)
class BatchRecord:
    """One mini-batch, boundary to boundary.

    ``duration_s`` spans the previous boundary to this one: ``idle_s`` the
    throttle inserted after the previous boundary, then the batch's own work.
    ``device_start_s`` is the offset from the end of that idle to the batch's
    first device work (first module forward), ``None`` when unseen. A record is
    handed to listeners at its boundary, before the job idles there.
    """

    index: int
    t_end: float  # monotonic clock of the job
    duration_s: float
    busy_s: float
    idle_s: float
    host_penalty_s: float
    device_start_s: float | None
    mem_allocated_peak: int
    mem_reserved: int
    mem_reserved_peak: int
    mem_cap: int
    mem_floor: int
    host_bytes: int
    host_bytes_touched: int
    sm_share: float
    limits_seq: int


class StatsBook:
    """Accumulates records (last ``keep`` kept in memory) and lifetime totals."""

    def __init__(self, keep: int = 4096):
        self.records: deque[BatchRecord] = deque(maxlen=keep)
        self.iterations = 0
        self.idle_s = 0.0
        self.host_penalty_s = 0.0
        self.max_reserved_over_cap = 0  # at boundaries, after releasing cache
        self.max_floor = 0
        self.paused_s = 0.0
        self.boundaries: Counter = Counter()  # boundary source -> count (see colocate.base.stats)

    def count(self, source: str = "step") -> None:
        """Count one mini-batch, its boundary found by ``source`` (see ``torch_hooks.hooks``)."""
        self.iterations += 1
        self.boundaries[source] += 1

    def add(self, rec: BatchRecord, source: str = "step") -> None:
        """Keep and count ``rec``."""
        self.records.append(rec)
        self.count(source)
        if rec.host_penalty_s:
            self.host_penalty_s += rec.host_penalty_s
        if rec.mem_floor > self.max_floor:
            self.max_floor = rec.mem_floor

    def summary(self, *, job, wall_s: float, busy_s: float, mem, ready_at: float | None = None) -> dict:
        out = {
            "job_id": job["job_id"],
            "pid": os.getpid(),
            "device": job["device"],
            "gpu": job["gpu"],
            "priority": job["priority"],
            "on_cap": job["on_cap"],
            "sm_share": job["sm_share"],
            "iterations": self.iterations,
            "boundaries": dict(self.boundaries),
            "ready_at": ready_at,
            "wall_s": wall_s,
            "device_busy_s": busy_s,
            "busy_fraction": busy_s / wall_s if wall_s > 0 else 0.0,
            "throttle_idle_s": self.idle_s,
            "paused_s": self.paused_s,
            "host_penalty_s": self.host_penalty_s,
            "mem_cap_bytes": mem.cap,
            "mem_reserved_peak_bytes": mem.peak_reserved,
            "mem_allocated_peak_bytes": mem.peak_allocated,
            "host_bytes_peak": mem.peak_host,
            "mem_floor_peak_bytes": self.max_floor,
            "boundary_reserved_over_cap_max_bytes": self.max_reserved_over_cap,
        }
        assert out.keys() == FIELDS.keys(), "colocate.base.stats.FIELDS is the one list of summary fields"
        return out
