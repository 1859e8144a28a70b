"""The scheduler core's read-only views: queues, jobs, running placements, blocked heads, the jobs set aside,
nodes, counters and the journal's records. What the server's status requests and the simulator's reports read.

``CoreViews`` is a part of ``cluster.core.SchedulerCore`` (its base class), kept apart by what it owns: it reads
the core's state (declared below for the type checker) and changes nothing. Each call builds a new value from
the current state; the caller owns it. ``job`` returns the core's record itself: read-only by contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cluster import events as ev
from cluster.events import PLACING, RUNNING
from colocate.base.vocab import JobClass

if TYPE_CHECKING:
    from cluster.framework import Framework
    from cluster.jobs import Job
    from cluster.spec import Placement
    from cluster.state import ClusterState


class CoreViews:
    if TYPE_CHECKING:  # the core's, which this part reads
        state: ClusterState
        fw: Framework
        holders: dict[str, Job]
        stopping: dict[str, Any]
        stats: dict[str, int]
        jobs: dict[str, Job]
        placing: dict[str, Job]
        retry: dict[str, tuple[float, Job]]
        sched: dict[str, Any]
        recovery: Any

    def timers_due(self, now: float) -> bool:
        """Whether a ``Tick`` at ``now`` would act on one of the core's timers: a placement past its start deadline
        (``start_timeout_s``), a lost node's hold or the restore's grace ended, a requeue's backoff over, a
        plugin's hold lapsed (``Plugin.wake_at``: a topology gang's wait). A caller
        that sends ticks only now and then (the simulator) sends one when this is true."""
        timeout = self.sched["start_timeout_s"]
        if timeout > 0 and self.placing:
            first = next(iter(self.placing.values()))  # placed in order: the oldest first (``_tick``)
            if first.placed_at is not None and now - first.placed_at >= timeout:
                return True
        if any(now >= at for at, _ in self.retry.values()):
            return True
        for f in self.fw.wakers:
            at = f()
            if at is not None and now >= at:
                return True
        return self.recovery.due(now)

    def queues(self) -> dict[str, list[str]]:
        """Pending job ids per queue, in scheduling order."""
        return {q: [j.job_id for j in lst] for q, lst in sorted(self.fw.queues.items())}

    def job(self, job_id: str) -> Job | None:
        """The job's record (read-only by contract), or None."""
        return self.jobs.get(job_id)

    def running(self) -> dict[str, Placement]:
        """Placing and running jobs and their current placements."""
        return {j.job_id: j.placement for j in self.holders.values()
                if j.state in (PLACING, RUNNING) and j.placement is not None and j.placement_id in self.holders}

    def blocked(self) -> dict[str, tuple[str, str]]:
        """Per queue, the head that blocked it in the last cycle and why."""
        return {q: (jid, str(st)) for q, (jid, st) in self.fw.blocked.items()}

    def set_aside(self) -> dict[str, str]:
        """Pending jobs out of their queues because no known node could hold them: job id -> why."""
        return {jid: st.reason for jid, (_, st) in self.fw.aside.items()}

    def nodes(self) -> list[dict]:
        """Per node: up, epoch, free whole GPUs, CPU/memory allocated, and per GPU the
        guaranteed milli, memory allocated, placements there and the last report."""
        out = []
        for n in self.state.nodes.values():
            out.append({
                "node_id": n.node_id, "up": n.up, "epoch": n.epoch, "gpu_model": n.model, "free_gpus": n.free,
                "cpu_milli": n.cpu, "mem_mib": n.host_mem, "workers": len(n.slots),
                "switch": n.spec.switch, "rack": n.spec.rack,
                "gpus": [{"index": g.index, "milli": g.milli, "mem": g.mem, JobClass.GUARANTEED: sorted(g.g),
                          JobClass.OPPORTUNISTIC: sorted(g.o), "utilization": g.utilization, "mem_used": g.mem_used}
                         for g in n.gpus],
            })
        return out

    def counters(self) -> dict[str, int]:
        c = dict(self.stats)
        c.update(cycles=self.fw.cycles, attempts=self.fw.attempts, pending=self.fw.pending(),
                 running=sum(1 for j in self.holders.values() if j.state == RUNNING and j.placement_id in self.holders),
                 stopping=len(self.stopping))
        return c

    def records(self) -> list[ev.JobRecord]:
        """Every job as a JobRecord, in arrival order (what a journal holds)."""
        jobs = sorted(self.jobs.values(), key=lambda j: j.seq)
        return [ev.JobRecord(j.spec, j.state, j.placement if j.state in (PLACING, RUNNING) else None,
                             j.attempt, j.failed_starts) for j in jobs]
