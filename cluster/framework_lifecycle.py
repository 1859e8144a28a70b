"""The framework's lifecycle notices, which only the core calls, once per change it applied: a job placed, running,
released (every slot of its placement free again), ended, promoted; the history of ended jobs learned; a running
job's progress. Each goes to the plugins that implement its point (``on_placed``, ``on_running``, ``on_released``,
``on_ended``, ``on_promoted``, ``on_history``, ``on_progress``), in config order, after the framework's own
bookkeeping: a placed or ended job is no longer nominated nor holds reserved nodes, and a released victim brings
the job it made room for one step nearer its claim (tried first in the next cycle once its last victim is gone).

``Lifecycle`` is a part of ``cluster.framework.Framework`` (its base class), kept apart by what it owns; it uses the
framework's point table and preemption records (declared below for the type checker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster.jobs import Job
    from cluster.spec import Placement


class Lifecycle:
    if TYPE_CHECKING:  # the framework's, which this part uses
        pt: dict[str, Any]
        nominated: dict[str, set[str]]
        victim_of: dict[str, str]
        _claims: list[str]

        def _unreserve(self, job_id: str) -> None: ...

    def placed(self, job: Job, placement: Placement, now: float) -> None:
        self.nominated.pop(job.job_id, None)
        self._unreserve(job.job_id)
        for f in self.pt["on_placed"]:
            f(job, placement, now)

    def running(self, job: Job, now: float) -> None:
        for f in self.pt["on_running"]:
            f(job, now)

    def released(self, job: Job, placement: Placement, now: float) -> None:
        """Every slot of ``placement`` is free again."""
        by = self.victim_of.pop(placement.placement_id, None)
        if by is not None:
            vs = self.nominated.get(by)
            if vs is not None:
                vs.discard(placement.placement_id)
                if not vs:
                    del self.nominated[by]
                    self._claims.append(by)
        for f in self.pt["on_released"]:
            f(job, placement, now)

    def ended(self, job: Job, now: float) -> None:
        self.nominated.pop(job.job_id, None)
        self._unreserve(job.job_id)
        for f in self.pt["on_ended"]:
            f(job, now)

    def promoted(self, job: Job, placement: Placement, now: float) -> None:
        for f in self.pt["on_promoted"]:
            f(job, placement, now)

    def learned(self, history: list) -> None:
        """Ended jobs' history records (oldest first) to every ``on_history`` (before any job is restored)."""
        for f in self.pt["on_history"]:
            f(history)

    def progressed(self, job: Job, progress: Any, now: float) -> bool:
        """A running job's progress (``JobProgressed``) to every ``on_progress``: whether any estimate moved."""
        moved = False
        for f in self.pt["on_progress"]:
            moved = bool(f(job, progress, now)) or moved
        return moved
