"""Rebuilding and reconciling the core's placements: ``restore`` from journaled records, node
(re-)registration, and the NodeReport that confirms which workers a node really holds.

Owned by ``SchedulerCore`` (``core.recovery``); nothing else calls it. It sees the core only through
``Host``, the narrow part of the core it may read and do, never the core's own fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cluster import events as ev
from cluster.events import FAILED, PENDING, PLACING, RUNNING, STATES
from cluster.fitting import gpu_fits_guaranteed
from cluster.jobs import Job
from cluster.spec import JobSpec, WorkerSlot
from cluster.state import Alloc, ClusterState, NodeState
from colocate.base.vocab import TERMINAL, JobClass, JobState

if TYPE_CHECKING:
    from cluster.framework import Framework


class Host(Protocol):
    """What recovery may read and do of the scheduler core (``cluster.core.SchedulerCore`` is one)."""

    @property
    def jobs(self) -> dict[str, Job]: ...  # job id -> job, every job known

    @property
    def holders(self) -> dict[str, Job]: ...  # placement id -> job, every placement holding slots

    @property
    def placing(self) -> dict[str, Job]: ...  # placement id -> job, PLACING

    @property
    def stopping(self) -> Mapping[str, Any]: ...  # placement id -> its stop, while its workers stop

    @property
    def state(self) -> ClusterState: ...

    @property
    def fw(self) -> Framework: ...

    @property
    def sched(self) -> Mapping[str, Any]: ...  # the scheduler's settings (restore_grace_s)

    def new_job(self, spec: JobSpec) -> Job: ...

    def set_state(self, job: Job, state: JobState, reason: str, out: list, pid: str | None = None) -> None: ...

    def mark_dirty(self) -> None: ...

    def is_retrying(self, job: Job) -> bool: ...

    def retry_at(self, job: Job, at: float, now: float) -> None: ...

    def lose_node(self, node_id: str, reason: str, now: float, out: list, hold_s: float = 0.0) -> None: ...

    def placement_lost(self, pid: str, reason: str, now: float, out: list, node_id: str | None = None) -> None: ...


class Recovery:
    def __init__(self, core: Host) -> None:
        self.core = core
        self.awaiting: dict[str, list[tuple[Job, str, WorkerSlot]]] = {}  # node id -> restored or held slots
        self.reconcile: set[str] = set()  # nodes whose next report decides their placements
        self.deadlines: dict[str, tuple[float, str]] = {}  # node id -> (when its awaited slots are lost, why)
        self.deadline: float | None = None  # the restore's: nodes that have not registered by then are lost
        # A job requeued while a worker of its old placement may still run (a silent node's, or one an up node
        # is stopping) waits until none may: old pid -> (job, when its own retry is due); confirm: node id ->
        # its old slots it must say are gone.
        self.waiting: dict[str, tuple[Job, float]] = {}
        self.confirm: dict[str, list[tuple[Job, str, WorkerSlot]]] = {}

    def restore(self, records: Iterable[ev.JobRecord], now: float) -> list:
        core, fw = self.core, self.core.fw
        if core.jobs:
            raise RuntimeError("restore() needs a fresh core (jobs already known)")
        out: list = []
        for rec in records:
            spec = rec.spec
            if rec.state not in STATES:
                raise ValueError(f"job {spec.job_id}: unknown state {rec.state!r} in record")
            if spec.job_id in core.jobs:
                raise ValueError(f"job {spec.job_id}: two records")
            job = core.new_job(spec)
            job.attempt, job.failed_starts, job.state = rec.attempt, rec.failed_starts, rec.state
            if rec.state in TERMINAL:
                continue
            job.queue = fw.queue_of(spec)
            pl = rec.placement
            if rec.state in (PLACING, RUNNING) and pl is not None:
                pid = pl.placement_id
                job.placement = pl
                core.holders[pid] = job
                job.begin_attempt(range(spec.workers) if rec.state == RUNNING else ())
                if rec.state == RUNNING:
                    job.running_since = now
                else:
                    job.placed_at = now
                    core.placing[pid] = job
                for slot in pl.slots:
                    self.awaiting.setdefault(slot.node_id, []).append((job, pid, slot))
                fw.placed(job, pl, now)
                if rec.state == RUNNING:
                    fw.running(job, now)
                continue
            bad = fw.pre_enqueue(job)
            if bad is not None:
                core.set_state(job, FAILED, str(bad), out)
                continue
            if rec.state != PENDING:
                core.set_state(job, PENDING, "restored without a placement", out)
            job.state, job.enqueued_at = PENDING, now
            fw.enqueue(job)
        self.deadline = now + core.sched["restore_grace_s"]
        for nid in self.awaiting:
            self.deadlines[nid] = (self.deadline, f"node {nid} did not register after restart")
        core.mark_dirty()
        return out

    def hold(self, nid: str, slots, deadline: float, reason: str) -> None:
        """Node ``nid`` fell silent holding ``slots`` (``Alloc``s, already released): their placements stay
        with their jobs until ``deadline``; the node's return (``joined``, then its report) re-adopts what it
        still runs, else they are lost then."""
        core = self.core
        items = self.awaiting.setdefault(nid, [])
        for a in slots:
            job = core.holders.get(a.pid)
            if job is not None:
                items.append((job, a.pid, WorkerSlot(a.rank, nid, tuple(a.gpus))))
        self.deadlines[nid] = (deadline, reason)

    def fenced_until(self, pid: str) -> float | None:
        """When every worker of (stopped) placement ``pid`` is known gone: the latest hold deadline of the
        silent nodes that held it, ``inf`` while it is still stopping (an up node holds a slot of it until
        that worker's exit is reported) or a returned node has not said its worker exited; ``None`` when no
        node may still run one."""
        if pid in self.core.stopping:
            return float("inf")
        until = None
        for nid, items in self.awaiting.items():
            if nid in self.deadlines and any(p == pid for _, p, _ in items):
                until = max(until or 0.0, self.deadlines[nid][0])
        if any(p == pid for items in self.confirm.values() for _, p, _ in items):
            until = float("inf")
        return until

    def wait(self, job: Job, pid: str, due: float) -> float | None:
        """``job`` is requeued from placement ``pid`` and would be queued at ``due``: the time it may be
        queued (``inf``: not before a node confirms), recorded so that it is queued then."""
        until = self.fenced_until(pid)
        if until is None:
            return None
        self.waiting[pid] = (job, due)
        return max(until, due)

    def settle(self, pid: str, now: float) -> None:
        """A node that held old placement ``pid`` is no longer a reason to wait (its slots released, its hold
        over, its word that the worker is gone): queue its job when none is."""
        if pid not in self.waiting:
            return
        job, due = self.waiting[pid]
        until = self.fenced_until(pid)
        core = self.core
        if job.state != PENDING or not core.is_retrying(job):
            del self.waiting[pid]
            return
        if until is None:
            del self.waiting[pid]
            until = due
        core.retry_at(job, max(until, due), now)

    def joined(self, e: ev.NodeJoined, now: float, out: list) -> None:
        core, state = self.core, self.core.state
        nid = e.spec.node_id
        node = state.nodes.get(nid)
        if node is not None:
            if e.epoch < node.epoch or (node.up and e.epoch == node.epoch):
                return  # stale or repeated registration
            if node.up and e.spec == node.spec:
                state.set_epoch(nid, e.epoch)
                self.reconcile.add(nid)
                core.mark_dirty()
                return
            if node.up:
                core.lose_node(nid, f"node {nid} re-registered with a new spec", now, out)
        state.add_node(e.spec, e.epoch)
        self._adopt(nid, now, out)
        core.mark_dirty()

    def _adopt(self, nid: str, now: float, out: list) -> None:
        """Hold the restored slots that wait for node ``nid``; its next report confirms them."""
        items = self.awaiting.pop(nid, None)
        self.deadlines.pop(nid, None)
        if not items:
            return
        core, state = self.core, self.core.state
        node = state.nodes[nid]
        lost = []
        for pid in dict.fromkeys(p for _, p, _ in items if p in self.waiting):
            self.confirm.setdefault(nid, []).extend(it for it in items if it[1] == pid)
            self.settle(pid, now)  # back: its lease no longer fences the old worker, only its word does
        for job, pid, slot in items:
            if pid in self.waiting:
                continue
            if job.state not in (PLACING, RUNNING) or job.placement_id != pid:
                continue
            spec = job.spec
            assert job.placement is not None  # its placement is pid
            klass = job.placement.klass
            fits = all(0 <= i < len(node.gpus) for i in slot.gpus) and len(slot.gpus) == spec.gpus and (
                klass != JobClass.GUARANTEED or all(gpu_fits_guaranteed(node.gpus[i], spec.gpu_milli, spec.gpu_mem) for i in slot.gpus))
            if not fits:
                lost.append(pid)
                continue
            state.apply(Alloc(pid, slot.rank, nid, slot.gpus, spec.gpu_milli, spec.gpu_mem, spec.cpu_milli,
                              spec.mem_mib, klass, now))
        self.reconcile.add(nid)
        for pid in dict.fromkeys(lost):
            core.placement_lost(pid, f"restored placement does not fit node {nid}", now, out)

    def awaited_on(self, pid: str, rank: int) -> list[str]:
        """The returned nodes whose confirmation that rank ``rank`` of old placement ``pid`` is gone is awaited."""
        return [n for n, items in self.confirm.items() if any((p, s.rank) == (pid, rank) for _, p, s in items)]

    def exited(self, pid: str, rank: int, now: float) -> None:
        """Rank ``rank`` of old placement ``pid`` on a returned node is gone (exited, or no longer listed)."""
        for nid in self.awaited_on(pid, rank):
            self.confirm[nid] = [it for it in self.confirm[nid] if (it[1], it[2].rank) != (pid, rank)]
            if not self.confirm[nid]:
                del self.confirm[nid]
            self.settle(pid, now)

    def reported(self, node: NodeState, listed: set[tuple[str, int]], now: float, out: list,
                 running: frozenset[tuple[str, int]] = frozenset()) -> None:
        """After a report from ``node`` (``running``: the workers it lists running): old placements' workers
        it no longer runs are confirmed gone; if it was awaited, live placements there whose workers it
        does not list are lost."""
        nid = node.node_id
        for _, pid, slot in list(self.confirm.get(nid, ())):
            if (pid, slot.rank) not in running:
                self.exited(pid, slot.rank, now)
        if nid not in self.reconcile:
            return
        self.reconcile.discard(nid)
        core = self.core
        gone = [a.pid for a in node.slots.values()
                if a.pid not in core.stopping and (a.pid, a.rank) not in listed]
        for pid in dict.fromkeys(gone):
            core.placement_lost(pid, f"workers lost on node {nid} (restarted)", now, out, node_id=nid)

    def due(self, now: float) -> bool:
        """Whether ``tick`` at ``now`` would act: the restore's grace or a node's hold has ended."""
        if self.deadline is not None and now >= self.deadline:
            return True
        return any(now >= d for d, _ in self.deadlines.values())

    def tick(self, now: float, out: list) -> None:
        if self.deadline is not None and now >= self.deadline:
            self.deadline = None
        for nid, (deadline, reason) in list(self.deadlines.items()):
            if now < deadline:
                continue
            del self.deadlines[nid]
            for job, pid, _ in self.awaiting.pop(nid, []):
                if job.placement_id == pid and job.state in (PLACING, RUNNING):
                    self.core.placement_lost(pid, reason, now, out)
                else:
                    self.settle(pid, now)

    def forget_node(self, nid: str, now: float, deadline: float | None = None, reason: str = "") -> None:
        """Node ``nid`` is down: old slots it had yet to confirm gone wait for ``deadline`` (its hold) like
        its held ones; without one (no fencing) they are gone now."""
        self.reconcile.discard(nid)
        items = self.confirm.pop(nid, [])
        if items and deadline is not None:
            self.awaiting.setdefault(nid, []).extend(items)
            self.deadlines[nid] = (deadline, reason)
        for pid in dict.fromkeys(p for _, p, _ in items):
            self.settle(pid, now)
