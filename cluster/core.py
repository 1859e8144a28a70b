"""``SchedulerCore``: the global scheduler's pure policy core. Events in, decisions out.

``handle(event, now) -> list[decision]`` applies one event at scheduler time ``now`` and, when
the event can change what fits (submit, exit, cancel, node join/loss, a report that moves a
GPU's utilization bucket, tick), runs one scheduling cycle. ``handle_batch`` applies several
events at one ``now`` and runs at most one cycle. The same events at the same times give the
same decisions: no clock, no I/O, randomness only from the injected ``random.Random``.

Job states (``cluster.events``): pending -> placing -> running -> succeeded | failed | cancelled.
  * a cycle's StartWorkers reserves the placement (id ``f"{job_id}.{attempt}"``): PLACING;
  * RUNNING once every rank reported RankStarted (or a NodeReport lists it running);
  * a rank that exits before the whole gang started, a PlacementRefused, or no full start within
    ``start_timeout_s`` (Tick) fails the start: the placement is stopped everywhere and the job
    requeued; after ``max_start_failures`` failed starts it FAILS;
  * a rank exiting non-zero while RUNNING stops the rest: FAILED; every rank exiting 0: SUCCEEDED;
  * a rank out of GPU memory (``oom``) under a recommended cap (``JobSpec.mem_fallback``), placing or running:
    the rest are stopped and the job requeued with its fallback cap, uncounted (``_oom_restart``);
  * NodeLost: the node goes down, every placement touching it is stopped on its other nodes
    and requeued whole; NodeJoined with a new epoch of a known node: its next NodeReport decides,
    placements there it does not list are lost (requeued whole); a changed spec is a loss + join;
  * a NodeReport listing a running worker whose placement is unknown or ended: StopWorkers
    for it on that node (reason "orphan"), on every such report;
  * preempted jobs (StopWorkers reason "preempted") go back to pending.
Every state change is a JobChanged emitted before the StartWorkers/StopWorkers it causes.

A stopped placement keeps its slots until released rank by rank (RankExited), node by node
(a NodeReport that no longer lists its workers, a PlacementRefused for it, NodeLost). A preempting
job therefore gets the freed GPUs in a cycle after the stops are confirmed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace as dc_replace
from typing import Any, assert_never

from cluster import events as ev
from cluster.config import PolicyConfig
from cluster.core_nodes import NodeEvents
from cluster.core_views import CoreViews
from cluster.events import CANCELLED, FAILED, PENDING, PLACING, RUNNING, SUCCEEDED
from cluster.framework import Framework
from cluster.jobs import Job
from cluster.points import Preempt, Upgrade
from cluster.recovery import Recovery
from cluster.spec import JobSpec, Placement
from cluster.state import ClusterState
from colocate.base.vocab import TERMINAL, JobClass, JobState


def refusal_backoff_s(n: int) -> float:
    """Seconds before the ``n``-th refused start in a row (1, 2, ...) is queued again: 0.5 s doubling, at most
    30 s."""
    return min(30.0, 0.5 * 2 ** min(max(n, 1) - 1, 16))


class _Stop:
    __slots__ = ("job", "placement", "reason")

    def __init__(self, job: Job, placement: Placement, reason: str) -> None:
        self.job, self.placement, self.reason = job, placement, reason


class SchedulerCore(NodeEvents, CoreViews):
    """One per scheduler (live server or simulation). Not thread-safe: one caller at a time. Its node events
    (joined, lost, report) are ``cluster.core_nodes``', its read-only views ``cluster.core_views``'."""

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.state = ClusterState()
        self.fw = Framework(config.instantiate(), config.scheduler, self.state, rng)
        if not self.fw.places(JobClass.OPPORTUNISTIC):  # its only reader: no upkeep on every allocation
            self.state.use_utilization_index(False)
        self.jobs = self.fw.jobs
        self.holders = self.fw.holders  # pid -> job, every placement holding slots
        self.stopping: dict[str, _Stop] = self.fw.stopping
        self.placing: dict[str, Job] = {}  # pid -> job, PLACING, in placement order
        self.sched = config.scheduler
        self.recovery = Recovery(self)
        self._seq = 0
        self._dirty = False
        self.retry: dict[str, tuple[float, Job]] = {}  # job id -> (when it is queued again, job): refused starts,
        # jobs waiting for the workers of their old placement to be gone (Recovery.wait)
        self.refusals: dict[str, int] = {}  # job id -> refused starts in a row (the backoff's exponent)
        self.stats = dict.fromkeys(("events", "decisions", "cycles", "placements", "preemptions", "promotions",
                                    "start_failures", "requeues", "orphan_stops", "nodes_lost", "duplicates",
                                    "oom_restarts", "foreign_reports", "reclaims"), 0)
        self._handlers: dict[type, Callable[..., Any]] = {
            ev.JobSubmitted: self._submitted, ev.JobCancelled: self._cancelled, ev.NodeJoined: self._joined,
            ev.NodeLost: self._lost, ev.NodeReport: self._report, ev.RankStarted: self._started,
            ev.RankExited: self._exited, ev.PlacementRefused: self._refused, ev.Tick: self._tick,
            ev.JobProgressed: self._progressed,
        }

    # ------------------------------------------------------------------ entry points

    def handle(self, event, now: float) -> list[ev.Decision]:
        """Apply ``event`` at ``now``; the decisions, in the order the edge must act on them.
        Raises TypeError for an object that is not an event; never for a stale or duplicate one
        (those are ignored)."""
        return self.handle_batch((event,), now)

    def handle_batch(self, events: Iterable, now: float, schedule: bool = True) -> list[ev.Decision]:
        """Apply every event at ``now``, then at most one scheduling cycle (none with
        ``schedule=False``: the change is remembered and the next call's cycle covers it)."""
        out: list[ev.Decision] = []
        for event in events:
            h = self._handlers.get(type(event))
            if h is None:
                raise TypeError(f"not a scheduler event: {type(event).__name__}")
            self.stats["events"] += 1
            h(event, now, out)
        if self._dirty and schedule:
            self._cycle(now, out)
        self.stats["decisions"] += len(out)
        return out

    def schedule(self, now: float) -> list[ev.Decision]:
        """Run one scheduling cycle now, whatever changed (benchmarks, tests)."""
        out: list[ev.Decision] = []
        self._cycle(now, out)
        self.stats["decisions"] += len(out)
        return out

    def validate(self, spec: JobSpec) -> str | None:
        """Why a submit of ``spec`` would be rejected now, in one line (duplicate id, unknown queue,
        no plugin for its class, a request no node that has joined could ever hold: GPUs per node,
        GPU memory per GPU, CPU, host memory, GPU model), or None. For the server's reply; changes
        nothing the job's fate depends on."""
        if spec.job_id in self.jobs:
            return f"job {spec.job_id!r} already exists"
        return self._rejection(Job(spec, -1))

    def _rejection(self, job: Job) -> str | None:
        """Why ``job`` cannot be queued under this policy (a pre-enqueue refusal, or no plugin
        places its class), else None."""
        st = self.fw.pre_enqueue(job)
        if st is not None:
            return str(st)
        if not self.fw.places(job.spec.klass):
            return f"no plugin places {job.spec.klass} jobs in this policy"
        return None

    def learn(self, history: Iterable) -> None:
        """What ended jobs taught (``cluster.predict.history.HistoryRecord``s, oldest first), to the plugins'
        ``on_history`` (run-time prediction): on a fresh core, before ``restore``."""
        self.fw.learned(list(history))

    def restore(self, records: Iterable[ev.JobRecord], now: float) -> list:
        """Rebuild from journaled job records, on a fresh core, before any event. Pending jobs are
        queued again in record order; the placements of placing/running jobs are re-reserved as
        their nodes register and confirmed by those nodes' next NodeReport (unlisted workers:
        lost, requeued); a node that has not registered within ``restore_grace_s`` (Tick) counts
        as lost. Returns JobChanged decisions for records the current config rejects."""
        return self.recovery.restore(records, now)

    # ------------------------------------------------------------------ cycle

    skip_idle = True  # a cycle that provably decides nothing (Framework.idle) is counted, not run

    def _cycle(self, now: float, out: list) -> None:
        self._dirty = False
        self.stats["cycles"] += 1
        if self.skip_idle and self.fw.idle():
            self.fw.skip_cycle(now)
            return
        cycle = self.fw.run_cycle(now)
        for job in cycle.returned:
            self.set_state(job, PENDING, "back in its queue: a node that can hold it joined", out)
        for job, st in cycle.aside:
            self.set_state(job, PENDING, f"set aside: {st.reason}; it returns to its queue when a node that can hold it "
                                    "joins", out)
        for job, st in cycle.errors:
            if job.reason != str(st):
                self.set_state(job, PENDING, str(st), out)
        for job, st in cycle.failed:
            self.set_state(job, FAILED, str(st), out)
            job.ended_at = now
            self.fw.ended(job, now)
        for job, placement in cycle.placed:
            self._start(job, placement, now, out)
        for act in cycle.actions:
            match act:
                case Preempt():
                    self._preempt(act, now, out)
                case Upgrade():
                    self._upgrade(act.pid, now, out)
                case _:
                    assert_never(act)

    # ------------------------------------------------------------------ what recovery may do (recovery.Host)

    def set_state(self, job: Job, state: JobState, reason: str, out: list, pid: str | None = None,
                  oom: bool = False, spec: JobSpec | None = None) -> None:
        """Move ``job`` to ``state`` (a ``cluster.events`` status) for ``reason``; appends the ``JobChanged``
        the edges journal to ``out`` (``oom``: its run ended for want of GPU memory; ``spec``: its new spec)."""
        job.state, job.reason = state, reason
        if state in TERMINAL:
            job.end_attempt()  # nothing reads a finished job's ranks: their records go
        out.append(ev.JobChanged(job.job_id, state, reason, pid, oom, spec))

    def new_job(self, spec: JobSpec) -> Job:
        """A job for ``spec``, known from now on, ordered after every job made before it; its id must be new."""
        job = Job(spec, self._seq)
        self._seq += 1
        self.jobs[spec.job_id] = job
        return job

    def mark_dirty(self) -> None:
        """Something a cycle may act on changed: the next batch runs one."""
        self._dirty = True

    def is_retrying(self, job: Job) -> bool:
        """Whether ``job`` waits in the retry list (a backoff, or for its old placement's workers to be gone)."""
        return self.retry.get(job.job_id, (0, None))[1] is job

    def retry_at(self, job: Job, at: float, now: float) -> None:
        """Queue ``job`` again at ``at`` (now, when ``at`` has come)."""
        self.retry[job.job_id] = (at, job)
        self._retry_due(now)

    # ------------------------------------------------------------------ placing

    def _start(self, job: Job, placement: Placement, now: float, out: list) -> None:
        job.attempt += 1
        job.placement = placement
        job.begin_attempt()
        job.placed_at = now
        pid = placement.placement_id
        self.holders[pid] = job
        self.placing[pid] = job
        self.stats["placements"] += 1
        how = "" if placement.klass == job.spec.klass else f"as {placement.klass}"
        self.set_state(job, PLACING, how, out, pid)
        out.append(ev.StartWorkers(job.spec, placement))
        self.fw.placed(job, placement, now)

    def _requeue(self, job: Job, now: float, delay_s: float = 0.0) -> None:
        """Back to pending: queued now, or after ``delay_s`` (a Tick queues it; a refused start's backoff), and
        never while a worker of its old placement may still run (``Recovery.wait``): one an up node is stopping
        (until its exit is reported), or a silent node's (until its hold is over or it says the worker is
        gone). Call after ``_stop``."""
        old = job.placement_id
        until = self.recovery.wait(job, old, now + delay_s) if old is not None else None
        if until is not None:
            delay_s = until - now
        job.state = PENDING
        job.placement = None
        job.end_attempt()
        job.running_since = None
        job.enqueued_at = now
        self.stats["requeues"] += 1
        if delay_s > 0:
            self.retry[job.job_id] = (now + delay_s, job)
        else:
            self.fw.enqueue(job)
        self._dirty = True

    def _retry_due(self, now: float) -> None:
        for job_id, (at, job) in list(self.retry.items()):
            if now >= at:
                del self.retry[job_id]
                if job.state == PENDING:
                    self.fw.enqueue(job)
                    self._dirty = True

    def _stop(self, job: Job, reason: str, now: float, out: list, gone_ranks=(), gone_node: str | None = None) -> None:
        """Stop ``job``'s current placement: slots known gone are released now, the rest wait
        for their exits (a StopWorkers to the nodes that still hold them)."""
        placement = job.placement
        assert placement is not None  # only a placed job is stopped
        pid = placement.placement_id
        self.placing.pop(pid, None)
        for r in gone_ranks:
            self.state.release(pid, r)
        if gone_node is not None:
            self.state.release_placement(pid, gone_node)
        held = self.state.allocs.get(pid)
        self._dirty = True
        if held:
            nodes = tuple(dict.fromkeys(s.node_id for s in placement.slots
                                        if s.rank in held))
            self.stopping[pid] = _Stop(job, placement, reason)
            out.append(ev.StopWorkers(job.job_id, pid, nodes, reason))
        else:
            self._released(job, placement, now)

    def _released(self, job: Job, placement: Placement, now: float) -> None:
        pid = placement.placement_id
        self.holders.pop(pid, None)
        self.stopping.pop(pid, None)
        self.fw.released(job, placement, now)
        self.recovery.settle(pid, now)  # its job, requeued, may be waiting for these workers to be gone

    def _release_slot(self, pid: str, rank: int | None, now: float, node_id: str | None = None) -> None:
        """Release a rank (or every rank on ``node_id``) of a placement; finish it when empty."""
        if rank is not None:
            self.state.release(pid, rank)
        else:
            self.state.release_placement(pid, node_id)
        self._dirty = True
        self._finish_if_empty(pid, now)

    # ------------------------------------------------------------------ job events

    def _submitted(self, e: ev.JobSubmitted, now: float, out: list) -> None:
        spec = e.spec
        if spec.job_id in self.jobs:
            self.stats["duplicates"] += 1
            return
        job = self.new_job(spec)
        why = self._rejection(job)
        if why is not None:
            self.set_state(job, FAILED, why, out)
            job.ended_at = now
            return
        job.queue = self.fw.queue_of(spec)
        job.enqueued_at = now
        self.set_state(job, PENDING, "", out)
        self.fw.enqueue(job)
        self._dirty = True

    def _cancelled(self, e: ev.JobCancelled, now: float, out: list) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.state in TERMINAL:
            return
        if job.state == PENDING:
            self.fw.dequeue(job)
            self.set_state(job, CANCELLED, JobState.CANCELLED, out)
        else:
            self.set_state(job, CANCELLED, JobState.CANCELLED, out, job.placement_id)
            self._stop(job, JobState.CANCELLED, now, out)
        job.ended_at = now
        self.fw.ended(job, now)
        self._dirty = True

    def _current(self, job_id: str, pid: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is None or job.state not in (PLACING, RUNNING) or job.placement_id != pid:
            return None
        return job

    def speaks_for(self, node_id: str, pid: str, rank: int) -> bool:
        """Whether ``node_id`` may report on rank ``rank`` of placement ``pid`` (always, for a trusted source: "").
        A node speaks only for its own workers: the rank's slot is held on it, or, for a slot no longer held, it is
        not another node's worker that recovery awaits (a node's key could otherwise end, fail or start any job)."""
        if not node_id:
            return True
        held = self.state.allocs.get(pid, {}).get(rank)
        if held is not None:
            return held.node_id == node_id
        awaited = self.recovery.awaited_on(pid, rank)
        return not awaited or node_id in awaited

    def _started(self, e: ev.RankStarted, now: float, out: list) -> None:
        if not self.speaks_for(e.node_id, e.placement_id, e.rank):
            self.stats["foreign_reports"] += 1
            return
        job = self._current(e.job_id, e.placement_id)
        if job is not None:
            self._rank_started(job, e.rank, now, out)

    def _rank_started(self, job: Job, rank: int, now: float, out: list) -> None:
        if job.state != PLACING or not 0 <= rank < job.spec.workers or rank in job.exited:
            return
        job.started.add(rank)
        if len(job.started) == job.spec.workers:
            self.placing.pop(job.placement_id or "", None)
            self.refusals.pop(job.job_id, None)
            job.running_since = now
            self.set_state(job, RUNNING, "", out, job.placement_id)
            self.fw.running(job, now)

    def _exited(self, e: ev.RankExited, now: float, out: list) -> None:
        if not self.speaks_for(e.node_id, e.placement_id, e.rank):
            self.stats["foreign_reports"] += 1
            return
        self.recovery.exited(e.placement_id, e.rank, now)
        if e.placement_id in self.stopping:
            self._release_slot(e.placement_id, e.rank, now)
            return
        job = self._current(e.job_id, e.placement_id)
        if job is not None:
            self._rank_exited(job, e.rank, e.exit_code, now, out, e.fenced, e.oom, e.reclaimed)

    def _rank_exited(self, job: Job, rank: int, code: int, now: float, out: list, fenced: bool = False,
                     oom: bool = False, reclaimed: bool = False) -> None:
        if not 0 <= rank < job.spec.workers or rank in job.exited:
            return
        if fenced:  # stopped by its node's lapsed lease: the job lost that worker, through no fault of its own
            self.set_state(job, PENDING, f"rank {rank} was stopped: its node's lease lapsed", out)
            self._stop(job, "node lease lapsed", now, out, gone_ranks=(rank,))
            self._requeue(job, now)
            return
        if reclaimed:  # its node took back the memory it held, for the
            self.stats["reclaims"] += 1  # guaranteed job beside it: a preemption, not the job's failure
            self.set_state(job, PENDING, f"rank {rank} was stopped by its node: the guaranteed job on its GPU needed "
                           "the memory it held", out)
            self._stop(job, "memory reclaimed", now, out, gone_ranks=(rank,))
            self._requeue(job, now)
            return
        if oom and code != 0 and job.spec.mem_fallback is not None:
            self._oom_restart(job, rank, code, now, out)
            return
        job.exited[rank] = code
        pid = job.placement_id
        assert pid is not None  # the exit of the job's current placement (_current)
        if job.state == PLACING:
            self._start_failed(job, f"rank {rank} exited with code {code} before the gang started", now, out, (rank,))
        elif code != 0:
            why = f"rank {rank} ran out of GPU memory (exit code {code})" if oom else f"rank {rank} exited with code {code}"
            self.set_state(job, FAILED, why, out, pid, oom)
            job.ended_at = now
            self._stop(job, "gang member failed", now, out, gone_ranks=(rank,))
            self.fw.ended(job, now)
        elif len(job.exited) == job.spec.workers:
            self.set_state(job, SUCCEEDED, "", out, pid)
            job.ended_at = now
            self._release_slot(pid, rank, now)
            self.fw.ended(job, now)
        else:
            self.state.release(pid, rank)
            self._dirty = True

    def _oom_restart(self, job: Job, rank: int, code: int, now: float, out: list) -> None:
        """A rank ran out of memory under the cap the job was recommended: the job goes back to its place in its
        queue with its fallback (``JobSpec.mem_fallback``); neither a failure nor a failed start."""
        old = job.spec
        fallback = old.mem_fallback or 0
        job.respec(dc_replace(old, gpu_mem=fallback, mem_fallback=None))
        self.stats["oom_restarts"] += 1
        self.set_state(job, PENDING, f"rank {rank} ran out of GPU memory (exit code {code}) under its recommended cap "
                       f"of {old.gpu_mem} bytes: restarted with {f'{fallback} bytes' if fallback else 'the whole GPU'}"
                       " (not the job's failure)", out, oom=True, spec=job.spec)
        self._stop(job, "out of memory under its recommended cap", now, out, gone_ranks=(rank,))
        self._requeue(job, now)

    def _start_failed(self, job: Job, reason: str, now: float, out: list, gone_ranks=(), gone_node=None,
                      delay_s: float = 0.0) -> None:
        job.failed_starts += 1
        self.stats["start_failures"] += 1
        limit = self.sched["max_start_failures"]
        if job.failed_starts >= limit:
            self.set_state(job, FAILED, f"start failed {job.failed_starts} times; last: {reason}", out, job.placement_id)
            job.ended_at = now
            self._stop(job, "start failed", now, out, gone_ranks, gone_node)
            self.fw.ended(job, now)
        else:
            self.set_state(job, PENDING, f"start failed: {reason}", out)
            self._stop(job, "start failed", now, out, gone_ranks, gone_node)
            self._requeue(job, now, delay_s)

    def _refused(self, e: ev.PlacementRefused, now: float, out: list) -> None:
        """A refused start is retried after a backoff (``refusal_backoff_s``); it counts as a failed start
        unless the node refused for its own stale state (``stale``: it is still stopping an old placement)."""
        job = self._current(e.job_id, e.placement_id)
        if job is None or job.state != PLACING:
            return
        if job.placement is not None and all(s.node_id != e.node_id for s in job.placement.slots):
            self.stats["foreign_reports"] += 1  # a node refuses only its own part of a placement
            return
        n = self.refusals[job.job_id] = self.refusals.get(job.job_id, 0) + 1
        delay = refusal_backoff_s(n)
        reason = f"node {e.node_id} refused: {e.reason}"
        if not e.stale:
            self._start_failed(job, reason, now, out, gone_node=e.node_id, delay_s=delay)
            return
        self.set_state(job, PENDING, f"{reason}; retry in {delay:g} s", out)
        self._stop(job, "start refused", now, out, gone_node=e.node_id)
        self._requeue(job, now, delay)

    def _preempt(self, act: Preempt, now: float, out: list) -> None:
        job = self.holders.get(act.pid)
        if job is None or act.pid in self.stopping or job.placement_id != act.pid:
            return
        self.stats["preemptions"] += 1
        self.set_state(job, PENDING, act.reason, out)
        self._stop(job, "preempted", now, out)
        self._requeue(job, now)

    def _upgrade(self, pid: str, now: float, out: list) -> None:
        job = self.holders.get(pid)
        if job is None or job.state != RUNNING or job.placement_id != pid or not self.state.promote(pid):
            return
        p = job.placement
        assert p is not None  # it runs placement pid
        job.placement = Placement(p.placement_id, p.job_id, p.slots, JobClass.GUARANTEED)
        self.stats["promotions"] += 1
        self.set_state(job, RUNNING, "promoted to guaranteed", out, pid)
        out.append(ev.Promote(job.job_id, pid, p.nodes()))
        self.fw.promoted(job, job.placement, now)

    def _tick(self, e: ev.Tick, now: float, out: list) -> None:
        timeout = self.sched["start_timeout_s"]
        if timeout > 0:
            late = []
            for job in self.placing.values():
                assert job.placed_at is not None  # set when it was placed
                if now - job.placed_at < timeout:
                    break
                late.append(job)
            for job in late:
                self._start_failed(job, f"workers did not all start within {timeout:g} s", now, out)
        self.recovery.tick(now, out)
        self._retry_due(now)
        self._dirty = True
