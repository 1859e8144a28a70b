"""The engine's clock-driven events: node reports (``NodeReport``), progress reports (``JobProgressed``) and ticks
(``Tick``), as ``cluster.sim.engine`` (its module docstring) says when each is sent.

``ClockedEvents`` is a part of ``cluster.sim.engine.Simulation`` (its base class), kept apart by what it owns: each
method adds the events due at ``t`` to ``events`` and schedules the next one; it reads the simulation's records
(declared below for the type checker) and changes only the report and tick bookkeeping.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cluster import events as ev
from cluster.sim.records import SimConfig, SimJob, SimNode

K_STARTED, K_DONE, K_STOPPED, K_TICK, K_REPORT, K_PROGRESS = range(6)  # the heap's event kinds, in tie order


class ClockedEvents:
    if TYPE_CHECKING:  # the simulation's, which this part uses
        core: Any  # cluster.core.SchedulerCore
        cfg: SimConfig
        jobs: list[SimJob]
        tick_s: float
        progress_s: float
        pending: int
        running: int
        reports_sent: int
        progress_sent: int
        ticks_sent: int
        _live_events: int
        _last_cycle_t: float
        _t_active: float
        _next_sub: int

        def _push(self, t: float, kind: int, a: Any, b: Any = None) -> None: ...

    def _report(self, node: SimNode, t: float, events: list) -> None:
        p = self.cfg.report_s
        gpus = tuple(ev.GpuReport(g.index, g.window(t, p), 0) for g in node.gpus)
        workers = []
        for job in node.live:
            pid, pl = job.pid, job.placement
            assert pid is not None and pl is not None, "a live job holds its placement"
            for s in pl.slots:
                if s.node_id == node.node_id and s.rank in job.held:
                    workers.append(ev.WorkerReport(job.job_id, pid, s.rank, True))
        events.append(ev.NodeReport(node.node_id, 1, gpus, tuple(workers)))
        self.reports_sent += 1
        if any(g.hist for g in node.gpus):
            node.report_at = t + self.cfg.report_s
            self._push(node.report_at, K_REPORT, node)
        else:
            node.report_at = None

    def _progress(self, job: SimJob, run: tuple, t: float, events: list) -> None:
        """A progress report of ``job``'s run ``run`` = (placement id, start time); none once that run has ended."""
        if not job.live or (job.pid, job.running_at) != run:
            return
        step_s, duration = self.cfg.step_s, job.duration
        assert duration is not None, "only a job with a duration reports progress"
        if job.rate > 0:
            left = job.work - job.rate * (t - job.t_rate)
            total = max(1, round(duration / step_s))
            done = min(total, max(0, int((duration - left) / step_s)))
            step = step_s / job.rate
            events.append(ev.JobProgressed(job.job_id, done, total, step, step, 0.0, step))
            self.progress_sent += 1
        job.reported += 1
        self._push(job.running_at + self.progress_s * 2.0 ** job.reported, K_PROGRESS, job, run)

    def _tick(self, t: float, events: list, more_submits: bool) -> None:
        if t - self._last_cycle_t >= self.tick_s or self.core.timers_due(t):
            events.append(ev.Tick())
            self.ticks_sent += 1
        busy = self.pending > 0 or self.running > 0 or self._live_events > 0
        if busy and (more_submits or self._live_events > 0 or t - self._t_active < self.cfg.idle_horizon_s):
            self._push(t + self.tick_s, K_TICK, None)
        elif more_submits:  # nothing to tick for until the next submission
            nxt = self.jobs[self._next_sub].submit
            self._push(max(t, math.floor(nxt / self.tick_s) * self.tick_s) + self.tick_s, K_TICK, None)
