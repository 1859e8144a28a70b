"""What a node says about its workers, applied: a ``NodeStatus``, ``WorkerStarted``, ``WorkerExited`` or
``StartRefused`` from a node the service has identified, turned into core events (a node speaks only for the
workers it holds), journaled where a view reads them (a worker's log record, a job's exit code), and the
``PlacementsSettled`` the node may forget its ended placements by. Mixed into ``SchedulerService``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cluster import events as ev
from cluster.server.faults import NodeWrite, Replies
from cluster.server.journal import Journal
from cluster.server.learning import Learning
from cluster.server.views import Progress, held_by
from colocate import protocol as P
from colocate.base.text import quoted

if TYPE_CHECKING:
    from cluster.core import SchedulerCore

log = logging.getLogger("colocate.scheduler")


class NodeReports:
    """Mixed into ``SchedulerService``: the attributes below are the service's (declared for the type checker)."""

    core: SchedulerCore
    journal: Journal
    learning: Learning
    progress: Progress
    nodes: dict[str, bytes]
    joining: dict[str, ev.NodeJoined]
    _foreign_seen: set[tuple[str, str]]

    if TYPE_CHECKING:
        def _decide(self, events: list, now: float) -> Replies: ...

    def _apply(self, node_id: str, m: NodeWrite, now: float) -> Replies:
        event: ev.NodeReport | ev.RankStarted | ev.RankExited | ev.PlacementRefused
        progressed: list = []
        if isinstance(m, P.NodeStatus):
            progressed = [ev.JobProgressed(p.job_id, p.iterations, p.total_iterations or 0, p.step_p50_s, p.step_p90_s,
                                           p.since_report_s, p.step_mean_s)
                          for p in self.progress.note(m.progress, lambda job_id: held_by(self.core.job(job_id), node_id))]
            event = ev.NodeReport(node_id, m.epoch, tuple(ev.GpuReport(g.index, g.utilization, g.mem_used)
                                                          for g in m.gpus),
                                  tuple(ev.WorkerReport(w.job_id, w.placement_id, w.rank, w.running, w.exit_code,
                                                        w.fenced, w.oom, w.reclaimed) for w in m.workers))
        elif not self._speaks_for(node_id, m):
            self._foreign(node_id, m)
            return []
        elif isinstance(m, P.WorkerStarted):
            with self.journal.transaction():
                self.journal.add_log(m.job_id, m.rank, m.placement_id, node_id, m.log_path, now)
            event = ev.RankStarted(m.job_id, m.placement_id, m.rank, node_id)
        elif isinstance(m, P.WorkerExited):
            job = self.core.job(m.job_id)
            # the job's exit code is its cause: the first worker to end the placement's run (a failing rank, or the
            # last of a successful gang); the ranks we stop because of it (143) come after, when it is over. A requeue
            # clears it (``Journal.set_state``): a job shows its latest run's code, never an earlier run's
            if job is not None and job.placement_id == m.placement_id and job.state in (ev.PLACING, ev.RUNNING):
                with self.journal.transaction():
                    row = self.journal.job(m.job_id)
                    if row is not None and (m.exit_code != 0 or row["exit_code"] is None):
                        self.journal.set_exit_code(m.job_id, m.exit_code)
            event = ev.RankExited(m.job_id, m.placement_id, m.rank, m.exit_code, m.fenced, m.oom, node_id,
                                  m.reclaimed)
        else:
            log.warning("node %s refused placement %s (%s): %s", node_id, m.placement_id, m.code, m.reason)
            event = ev.PlacementRefused(m.job_id, m.placement_id, node_id, m.reason, m.code == P.REFUSED_STALE)
        joined = self.joining.pop(node_id, None) if isinstance(m, P.NodeStatus) else None
        out = self._decide(([joined] if joined else []) + [event] + progressed, now)
        for e in progressed:
            self.learning.progressed(e, now)
        return out + self._settled(node_id, m)

    def _speaks_for(self, node_id: str, m: P.WorkerStarted | P.WorkerExited | P.StartRefused) -> bool:
        """Whether the node may say ``m``: a node speaks only for its own workers (``SchedulerCore.speaks_for``), and
        refuses only a placement with a worker on it."""
        if isinstance(m, P.StartRefused):
            job = self.core.job(m.job_id)
            return job is None or job.placement_id != m.placement_id or held_by(job, node_id)
        return self.core.speaks_for(node_id, m.placement_id, m.rank)

    def _foreign(self, node_id: str, m: P.WorkerStarted | P.WorkerExited | P.StartRefused) -> None:
        """A node reported on a worker it does not hold (a forged report, or a node's stale view): dropped, and said
        once per node and placement."""
        if (node_id, m.placement_id) not in self._foreign_seen:
            if len(self._foreign_seen) >= 10_000:
                self._foreign_seen.clear()
            self._foreign_seen.add((node_id, m.placement_id))
            what = "placement" if isinstance(m, P.StartRefused) else f"rank {m.rank} of placement"
            log.warning("node %s reported on %s %s (job %s), which it does not hold: ignored",
                        node_id, what, quoted(m.placement_id), quoted(m.job_id))

    def _settled(self, node_id: str, m: NodeWrite) -> Replies:
        """``PlacementsSettled`` for the ended placements ``m`` shows whose end the core has taken (the job is
        no longer on that placement); sent after the batch's commit, like every reply, so the node forgets only
        what the journal holds."""
        if isinstance(m, P.NodeStatus):
            ended = {(w.job_id, w.placement_id) for w in m.workers if not w.running}
        elif isinstance(m, P.WorkerExited):
            ended = {(m.job_id, m.placement_id)}
        else:
            return []
        ids = sorted({pid for job_id, pid in ended if not self._on(job_id, pid)})
        ident = self.nodes.get(node_id)
        if not ids or ident is None:
            return []
        return [(ident, P.PlacementsSettled(node_id=node_id, placement_ids=tuple(ids[i:i + P.MAX_LIST_ITEMS])))
                for i in range(0, len(ids), P.MAX_LIST_ITEMS)]

    def _on(self, job_id: str, placement_id: str) -> bool:
        """The job is placed or running on ``placement_id`` (its end is not settled)."""
        job = self.core.job(job_id)
        return job is not None and job.placement_id == placement_id and job.state in (ev.PLACING, ev.RUNNING)
