"""The discrete-event engine: drives a real ``SchedulerCore`` (the live scheduler's policy code,
plugins and all) on simulated time.

Contract. ``Simulation(core, jobs, nodes, model, config).run()`` feeds the core only events the
live edge would send and acts on its decisions as the nodes would; nothing in ``cluster.core``,
``cluster.framework`` or ``cluster.plugins`` knows it is simulated. Time is the simulation's
own clock (never the wall clock); every event of one instant goes to ``core.handle_batch`` at
once (one scheduling cycle); events caused by that batch at the same instant (a start with no
delay) form the next batch at that instant. Within a batch: engine events in the order they were
scheduled, then submissions in trace order.

Events in:
  * ``NodeJoined(spec, epoch=1)`` for every node, in one batch at t = 0;
  * ``JobSubmitted`` at each job's ``submit_time``;
  * ``StartWorkers`` -> ``RankStarted`` for every rank, together, ``start_delay_s`` later (the
    workers start whole or not at all); from then the job progresses at the rate the
    co-location model gives it, and when its remaining work is done every rank exits 0 together
    (``RankExited(0)``); a job without a duration never finishes;
  * ``StopWorkers`` (preemption, a failed gang, cancel, orphan) -> the ranks on the named nodes
    stop progressing at once and exit 143 ``stop_delay_s`` later; the job keeps the work it has
    done (it resumes from a checkpoint taken at the stop) plus ``restart_overhead_s`` of solo
    work added at its next start (0: start-up and checkpoint costs ignored);
  * ``Promote`` -> the placement's class becomes guaranteed (its GPU shares are re-rated);
  * ``Tick`` every ``tick_s`` only when some configured plugin is time-driven (implements
    ``cycle_end``, e.g. promotion) or workers may start later than the start deadline; a tick is
    skipped when a cycle ran within the last period and none of the core's timers is due
    (``SchedulerCore.timers_due``: it would decide nothing new), and ticking stops
    ``idle_horizon_s`` after the last real event when nothing else is scheduled (a start event
    of a placement stopped before it came is no work ahead); and one ``Tick`` when a plugin's
    hold lapses (``Plugin.wake_at``: a ``topology`` gang's wait), asked after every batch;
  * ``NodeReport`` (utilization of each GPU over the last ``report_s`` seconds, the node's live
    workers) only when some plugin places opportunistic work (the only reader of utilization), or
    ``reports="always"``: at the report grid point after a GPU's modelled utilization changed,
    and again until the window has settled;
  * ``JobProgressed`` (iterations done of the total, seconds per iteration at the job's current rate) for a running
    job whose total is known (``SimConfig.known_total``), ``progress_s`` after its workers start and each time its
    run time doubles, only when some plugin reads progress (``on_progress``, e.g. the ``predictor``); a job of
    duration D has round(D / ``step_s``) iterations of ``step_s`` solo seconds each.
When the GPUs a job shares change, the rates of every job there change: its completion event is
re-timed (events carry a version; a stale completion is ignored).

Determinism: the engine has no randomness of its own (the core's comes from its injected
``random.Random``); the same inputs give the same events, decisions and results.
"""

from __future__ import annotations

import gc
import math
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from heapq import heappop, heappush

from cluster import events as ev
from cluster.events import PENDING, PLACING, RUNNING
from cluster.sim.clocked import K_DONE, K_PROGRESS, K_REPORT, K_STARTED, K_STOPPED, K_TICK, ClockedEvents
from cluster.sim.colocation import ColocationModel
from cluster.sim.network import span
from cluster.sim.records import SimConfig, SimJob, SimNode
from cluster.sim.sharing import GpuSharing
from cluster.spec import MILLI, NodeSpec
from colocate.base.vocab import TERMINAL, JobClass

_JobChanged, _StartWorkers, _StopWorkers, _Promote = ev.JobChanged, ev.StartWorkers, ev.StopWorkers, ev.Promote
_RankStarted, _RankExited, _JobSubmitted = ev.RankStarted, ev.RankExited, ev.JobSubmitted
_TERMINAL = TERMINAL


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (the previous setting restored on leaving). A replay's
    edges use it around loading a trace, the run and writing its rows: they make hundreds of thousands of
    records that live to the end and no reference cycles of their own, and each collection their allocations
    trigger would scan every live record again (a fifth of a run, a quarter of loading and writing)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


ONE_NODE = (1, 1, 1)  # the span of a placement on one node: nodes, switches, racks


class Simulation(ClockedEvents, GpuSharing):
    """One run of one policy over one workload (``run()`` once)."""

    def __init__(self, core, jobs, nodes: list[NodeSpec], model: ColocationModel, config: SimConfig | None = None,
                 progress=None, observer=None) -> None:
        self.core = core
        self.model = model
        self.cfg = cfg = config or SimConfig()
        self.progress = progress  # progress(finished, total), now and then
        self.observer = observer  # observer(sim, now, events, decisions) after every batch (tests)
        self.node_specs = list(nodes)
        self.nodes = {n.node_id: SimNode(n) for n in self.node_specs}
        self.jobs = [SimJob(j.spec, j.duration, j.cfg, j.busy, j.label) for j in jobs]
        self.jobs.sort(key=lambda j: j.submit)  # stable: trace order on ties
        self.by_id = {j.job_id: j for j in self.jobs}
        if len(self.by_id) != len(self.jobs):
            raise ValueError("two jobs with the same id in the workload")
        self.capacity = sum(n.gpus for n in self.node_specs)
        self._heap: list = []
        self._seq = 0
        self._live_events = 0  # STARTED/DONE/STOPPED entries in the heap
        fw = core.fw
        self.reports = cfg.reports == "always" or (cfg.reports == "auto" and fw.places(JobClass.OPPORTUNISTIC))
        timed = any(p.implements("cycle_end") for p in fw.plugins)
        late = cfg.start_delay_s > 0 and 0 < core.sched["start_timeout_s"] <= cfg.start_delay_s
        period = 30.0 if cfg.tick_s is None else cfg.tick_s
        self.tick_s = period if (timed or late) else 0.0
        reads = cfg.progress_s > 0 and cfg.known_total > 0 and any(p.implements("on_progress") for p in fw.plugins)
        self.progress_s = cfg.progress_s if reads else 0.0
        self._known = int(cfg.known_total * 2**32)  # a job's total is known when crc32(its id) < this
        # metrics
        self.t = 0.0
        self.pending = 0
        self.running = 0
        self.finished = 0
        self.alloc_milli = 0  # guaranteed milli held (placements from start decision to exit)
        self.occupied = 0  # GPUs with a resident job
        self.busy_total = 0.0  # sum of modelled GPU utilization
        self.acc_alloc = self.acc_occ = self.acc_busy = 0.0
        self.loaded_s = self.acc_busy_loaded = self.acc_occ_loaded = 0.0  # while some job is pending
        self.samples: list[tuple[float, int, float, float, int]] = []  # (t, pending, alloc GPUs, busy, running)
        span = self.jobs[-1].submit if self.jobs else 0.0
        self._sample_dt = max(span / max(cfg.samples, 1), 1.0)
        self._next_sample = 0.0
        self.log: list = []
        self.batches = 0
        self.ticks_sent = 0
        self.reports_sent = 0
        self.progress_sent = 0
        self.makespan = 0.0
        self.wall_s = 0.0
        self._last_cycle_t = -math.inf
        self._t_active = 0.0
        self._next_sub = 0
        self._waking: set[float] = set()  # times of the ticks pushed for a plugin's lapsing hold (``_wake``)

    # ------------------------------------------------------------------ the loop

    def _push(self, t: float, kind: int, a, b=None) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, a, b))
        if kind <= K_STOPPED:
            self._live_events += 1  # real work ahead (a DONE stops counting once stale)

    def run(self) -> Simulation:
        """Run to the end (no events left), with the collector paused (``collector_paused``)."""
        with collector_paused():
            return self._run()

    def _run(self) -> Simulation:  # noqa: C901, PLR0912, PLR0915 (the event loop: one dispatch over every event kind, in time order)
        wall0 = time.perf_counter()
        core = self.core
        heap, subs = self._heap, self.jobs
        ns, i = len(subs), 0
        apply, record, observer, progress = self._apply, self.cfg.record, self.observer, self.progress
        wakers = core.fw.wakers
        inf = math.inf
        joins = [ev.NodeJoined(n, 1) for n in self.node_specs]
        self._batch(0.0, joins)
        if self.tick_s > 0:
            first = subs[0].submit if subs else 0.0
            self._push(math.floor(first / self.tick_s) * self.tick_s + self.tick_s, K_TICK, None)
        total = ns
        while True:
            t = heap[0][0] if heap else inf
            if i < ns and subs[i].submit <= t:
                t = subs[i].submit
            if t == inf:
                break
            due = []
            while heap and heap[0][0] == t:
                e = heappop(heap)
                if e[2] != K_DONE or (e[3].version == e[4] and e[3].due):
                    due.append(e)
            if not due and not (i < ns and subs[i].submit == t):
                continue  # only stale completions: nothing happens at t
            if t != self.t:
                self._advance(t)
            events: list = []
            real = False
            for _, _, kind, a, b in due:
                if kind == K_DONE:
                    if a.version == b and a.due:  # an earlier entry of this batch may have re-timed it
                        self._live_events -= 1
                        a.due = False
                        self._done(a, t, events)
                        real = True
                elif kind == K_STARTED:
                    if a.starting == b:  # else discounted when superseded or stopped before it came
                        a.starting = None
                        self._live_events -= 1
                    if a.pid == b and not a.live and a.held:
                        self._started(a, t, events)
                        real = True
                elif kind == K_STOPPED:
                    self._live_events -= 1
                    self._stopped(a, b, t, events)
                    real = True
                elif kind == K_TICK:
                    if a is None:
                        self._next_sub = i
                        self._tick(t, events, i < ns)
                    else:  # a plugin's hold lapses now (``_wake``)
                        self._waking.discard(t)
                        if not any(type(e) is ev.Tick for e in events) and core.timers_due(t):
                            events.append(ev.Tick())
                            self.ticks_sent += 1
                elif kind == K_REPORT:
                    self._report(a, t, events)
                else:
                    self._progress(a, b, t, events)
            while i < ns and subs[i].submit == t:
                events.append(_JobSubmitted(subs[i].spec))
                i += 1
                real = True
            if not events:
                continue
            cycles = core.stats["cycles"]
            out = core.handle_batch(events, t)
            if core.stats["cycles"] != cycles:
                self._last_cycle_t = t
            if wakers:
                self._wake(wakers, t)
            self.batches += 1
            if real or out:
                self._t_active = t
            if out:
                apply(out, t)
            if record:
                self.log.append((t, tuple(events), tuple(out)))
            if observer is not None:
                observer(self, t, events, out)
            if progress is not None and not self.batches & 2047:
                progress(self.finished, total)
        # the values were constant since the last real event: end the integrals there
        end = self._t_active
        if self.t > end:
            dt = self.t - end
            self.acc_alloc -= self.alloc_milli * dt
            self.acc_occ -= self.occupied * dt
            self.acc_busy -= self.busy_total * dt
            self.t = end
        self.samples.append((end, self.pending, self.alloc_milli / MILLI, self.busy_total, self.running))
        ends = [j.end for j in self.jobs if j.end is not None]
        self.makespan = max(ends) if ends else 0.0
        for j in self.jobs:
            if j.live:
                j.run_s += end - j.running_at
        self.wall_s = time.perf_counter() - wall0
        if progress is not None:
            progress(self.finished, total)
        return self

    def _wake(self, wakers: list, t: float) -> None:
        """A tick when the earliest hold a plugin set lapses (``Plugin.wake_at``), once per time."""
        at = min((w for f in wakers if (w := f()) is not None), default=None)
        if at is not None and at > t and at not in self._waking:
            self._waking.add(at)
            self._push(at, K_TICK, True)

    def _batch(self, t: float, events: list) -> None:
        out = self.core.handle_batch(events, t)
        if self.cfg.record:
            self.log.append((t, tuple(events), tuple(out)))
        if out:
            self._apply(out, t)

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            self.acc_alloc += self.alloc_milli * dt
            self.acc_occ += self.occupied * dt
            self.acc_busy += self.busy_total * dt
            if self.pending:
                self.loaded_s += dt
                self.acc_busy_loaded += self.busy_total * dt
                self.acc_occ_loaded += self.occupied * dt
        if t >= self._next_sample:
            self.samples.append((t, self.pending, self.alloc_milli / MILLI, self.busy_total, self.running))
            self._next_sample = t + self._sample_dt
        self.t = t

    # ------------------------------------------------------------------ decisions

    def _apply(self, out: list, t: float) -> None:
        by_id = self.by_id
        for d in out:
            c = d.__class__
            if c is _JobChanged:  # the common case, inline (see _changed)
                job = by_id.get(d.job_id)
                if job is None:
                    continue
                s, old = d.state, job.state
                if s == PLACING and old == PENDING:
                    self.pending -= 1
                    job.wait += t - job.pending_since
                    if job.first_start is None:
                        job.first_start = t
                    job.starts += 1
                    job.state = s
                elif s == RUNNING:
                    job.state = s
                else:
                    self._changed(job, d, t)
            elif c is _StartWorkers:
                self._start(d, t)
            elif c is _StopWorkers:
                self._stop(d, t)
            elif c is _Promote:
                self._promote(d, t)

    def _changed(self, job: SimJob, d, t: float) -> None:
        s, old = d.state, job.state
        if s == PENDING:
            if old != PENDING:
                if old in (PLACING, RUNNING):
                    job.requeues += 1
                    if "preempt" in d.reason:
                        job.preemptions += 1
                self.pending += 1
                job.pending_since = t
        elif s == PLACING:
            if old == PENDING:
                self.pending -= 1
                job.wait += t - job.pending_since
            if job.first_start is None:
                job.first_start = t
            job.starts += 1
        elif s in _TERMINAL:
            if old == PENDING:
                self.pending -= 1
                job.wait += t - job.pending_since
            if job.end is None:
                job.end = t
                self.finished += 1
            job.reason = d.reason
        job.state = s

    def _start(self, d, t: float) -> None:
        job = self.by_id[d.spec.job_id]
        p = d.placement
        nodes = self.nodes
        job.placement, job.pid, job.klass = p, p.placement_id, p.klass
        job.held = range(len(p.slots))
        job.live = False
        gpus = []
        for s in p.slots:
            ng = nodes[s.node_id].gpus
            for g in s.gpus:
                gpus.append(ng[g])
        job.gpus = gpus
        if len(p.slots) == 1:  # one worker, one node: no spread (most jobs)
            job.span, job.spread_f = ONE_NODE, 1.0
            if self.reports:
                job.nodes = [nodes[p.slots[0].node_id]]
        else:
            ids = p.nodes()
            job.span = span([nodes[n].spec for n in ids])
            job.spread_f = self.cfg.spread.rate(*job.span)
            if self.reports:
                job.nodes = [nodes[n] for n in ids]
        job.milli = job.spec.gpu_milli if p.klass == JobClass.GUARANTEED else 0
        self.alloc_milli += job.milli * len(gpus)
        if job.starts > 1 and self.cfg.restart_overhead_s:
            job.work += self.cfg.restart_overhead_s
        job.queue = self.core.job(job.job_id).queue
        if job.starting is not None:  # an earlier placement's start, still pending: no longer work ahead
            self._live_events -= 1
        job.starting = job.pid
        self._push(t + self.cfg.start_delay_s, K_STARTED, job, job.pid)

    def _started(self, job: SimJob, t: float, events: list) -> None:
        pid, p = job.pid, job.placement
        assert pid is not None and p is not None, "a start event follows the job's placement"
        for r in range(len(p.slots)):
            events.append(_RankStarted(job.job_id, pid, r))
        job.live = True
        job.running_at = t
        self.running += 1
        if self.reports:
            for n in job.nodes:
                n.live[job] = None
        self._attach(job, t)
        if self.progress_s and job.duration is not None and zlib.crc32(job.job_id.encode()) < self._known:
            job.reported = 0
            self._push(t + self.progress_s, K_PROGRESS, job, (job.pid, t))

    def _done(self, job: SimJob, t: float, events: list) -> None:
        pid = job.pid
        assert pid is not None, "a completion event follows the job's placement"
        for r in job.held:
            events.append(_RankExited(job.job_id, pid, r, 0))
        self._halt(job, t)
        job.work = 0.0
        self.alloc_milli -= job.milli * len(job.gpus)
        job.held = ()

    def _halt(self, job: SimJob, t: float) -> None:
        """The job's workers stop progressing now (done or stopped)."""
        if job.live:
            job.work -= job.rate * (t - job.t_rate)
            if job.work < 0:
                job.work = 0.0
            job.live = False
            job.run_s += t - job.running_at
            self.running -= 1
            if self.reports:
                for n in job.nodes:
                    n.live.pop(job, None)
            self._detach(job, t)
        self._stale(job)
        job.rate = 0.0

    def _stop(self, d, t: float) -> None:
        job = self.by_id.get(d.job_id)
        if job is None or job.pid != d.placement_id or not job.held:
            return
        nodes = set(d.nodes)
        held, p = job.held, job.placement
        assert p is not None, "a job holding ranks holds its placement"
        ranks = [s.rank for s in p.slots if s.node_id in nodes and s.rank in held]
        if not ranks:
            return
        self._halt(job, t)
        job.held = tuple(r for r in held if r not in ranks)
        if not job.held and job.starting == job.pid:  # stopped before its start came: that start is no work ahead
            job.starting = None
            self._live_events -= 1
        self._push(t + self.cfg.stop_delay_s, K_STOPPED, job, (job.pid, ranks, job.milli * job.spec.gpus))

    def _stopped(self, job: SimJob, info, t: float, events: list) -> None:
        pid, ranks, per_rank = info
        for r in ranks:
            events.append(_RankExited(job.job_id, pid, r, 143))
            self.alloc_milli -= per_rank

    def _promote(self, d, t: float) -> None:
        job = self.by_id.get(d.job_id)
        if job is None or job.pid != d.placement_id:
            return
        job.klass = JobClass.GUARANTEED
        job.milli = job.spec.gpu_milli
        self.alloc_milli += job.milli * job.spec.gpus * len(job.held)
        if job.live:
            self._rerate(job.gpus, t, None)
