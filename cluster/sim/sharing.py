"""The engine's GPU sharing: jobs attached to and detached from their GPUs, each GPU's shares and modelled
utilization from the co-location model, and each job's rate (the pace of its slowest share, slowed by its spread)
with its completion event re-timed when the rate changes.

``GpuSharing`` is a part of ``cluster.sim.engine.Simulation`` (its base class), kept apart by what it owns: the
jobs and rates on each ``SimGpu``, the occupancy and utilization totals, and each job's remaining work, rate and
completion event (stale ones are ignored by their version). It uses the simulation's records and event heap
(declared below for the type checker). Units: rates are solo-speed fractions, work is solo seconds, ``t`` is the
simulation's clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cluster.sim.clocked import K_DONE, K_REPORT
from cluster.sim.records import SimConfig, SimGpu, SimJob

if TYPE_CHECKING:
    from cluster.sim.colocation import ColocationModel


class GpuSharing:
    if TYPE_CHECKING:  # the simulation's, which this part uses
        cfg: SimConfig
        model: ColocationModel
        reports: bool
        occupied: int
        busy_total: float
        _live_events: int

        def _push(self, t: float, kind: int, a: Any, b: Any = None) -> None: ...

    def _attach(self, job: SimJob, t: float) -> None:
        shared = []
        for g in job.gpus:
            if g.jobs:
                g.jobs.append(job)
                g.rates.append(1.0)
                shared.append(g)
            else:
                g.jobs.append(job)
                g.rates.append(1.0)
                self.occupied += 1
                u = job.busy * job.spread_f  # busy u x duration in all: a spread gang's longer run is idler
                self._set_util(g, u if u < 1.0 else 1.0, t)
        job.t_rate = t
        job.rate = 0.0
        if shared:
            self._rerate(shared, t, job)
        self._retime(job, self._rate_of(job) if shared else job.spread_f, t)

    def _detach(self, job: SimJob, t: float) -> None:
        shared = []
        for g in job.gpus:
            k = g.jobs.index(job)
            del g.jobs[k]
            del g.rates[k]
            if g.jobs:
                shared.append(g)
            else:
                self.occupied -= 1
                self._set_util(g, 0.0, t)
        if shared:
            self._rerate(shared, t, job)

    def _rerate(self, gpus: list[SimGpu], t: float, skip: SimJob | None) -> None:
        """Recompute the rates on ``gpus`` and re-time every job there (but ``skip``)."""
        affected: dict[SimJob, None] = {}
        rates_of = self.model.gpu_rates
        for g in gpus:
            g.rates, _ = rates_of(g.jobs)
            for j in g.jobs:
                if j is not skip:
                    affected[j] = None
        touched: dict[SimGpu, None] = dict.fromkeys(gpus)
        for j in affected:
            if j.live:
                self._retime(j, self._rate_of(j), t)
                touched.update(dict.fromkeys(j.gpus))
        for g in touched:  # sum(u * rate) at each job's own pace (its slowest share, its spread): work conserved
            u = 0.0
            for j in g.jobs:
                u += j.busy * self._rate_of(j)
            self._set_util(g, u if u < 1.0 else 1.0, t)

    @staticmethod
    def _rate_of(job: SimJob) -> float:
        """A gang progresses at the pace of its slowest GPU share, slowed by its spread (``SimConfig.spread``)."""
        r = 1.0
        for g in job.gpus:
            x = g.rates[g.jobs.index(job)]
            if x < r:
                r = x
        return r * job.spread_f

    def _retime(self, job: SimJob, r: float, t: float) -> None:
        if r == job.rate:
            return
        job.work -= job.rate * (t - job.t_rate)
        if job.work < 0:
            job.work = 0.0
        job.rate, job.t_rate = r, t
        self._stale(job)
        if job.duration is not None and r > 0:
            job.due = True
            self._push(t + job.work / r, K_DONE, job, job.version)

    def _stale(self, job: SimJob) -> None:
        """Any completion event scheduled for ``job`` no longer counts."""
        job.version += 1
        if job.due:
            job.due = False
            self._live_events -= 1

    def _set_util(self, g: SimGpu, u: float, t: float) -> None:
        old = g.util
        if u == old:
            return
        self.busy_total += u - old
        g.util = u
        if self.reports:
            if not g.hist:
                g.u0 = old
            g.hist.append((t, u))
            node = g.node
            if node.report_at is None:
                p = self.cfg.report_s
                node.report_at = (math.floor(t / p) + 1) * p
                self._push(node.report_at, K_REPORT, node)
