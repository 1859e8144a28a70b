"""The scheduler core's node events: a node joining (``cluster.recovery`` reconciles it), lost, its
periodic report (GPU utilization, and the workers it holds: started, exited, stopping, or orphans to stop),
and the progress of the running jobs it holds (``JobProgressed``: to the plugins' ``on_progress``; a cycle
follows only when an estimate moved and a job is pending, so progress costs no cycle on a quiet cluster).

``NodeEvents`` is a part of ``cluster.core.SchedulerCore`` (its base class), kept apart by what it owns: it
uses the core's job lifecycle (declared below for the type checker) and changes nothing the core does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cluster import events as ev
from cluster.events import PENDING, PLACING, RUNNING
from colocate.base.vocab import JobClass, JobState

if TYPE_CHECKING:
    from cluster.framework import Framework
    from cluster.jobs import Job
    from cluster.recovery import Recovery
    from cluster.spec import Placement
    from cluster.state import ClusterState


class NodeEvents:
    if TYPE_CHECKING:  # the core's, which this part uses
        state: ClusterState
        fw: Framework
        recovery: Recovery
        holders: dict[str, Job]
        stopping: dict[str, Any]
        stats: dict[str, int]
        jobs: dict[str, Job]
        _dirty: bool

        def set_state(self, job: Job, state: JobState, reason: str, out: list, pid: str | None = None) -> None: ...
        def _current(self, job_id: str, pid: str) -> Job | None: ...
        def _stop(self, job: Job, reason: str, now: float, out: list, gone_ranks=(),
                  gone_node: str | None = None) -> None: ...
        def _requeue(self, job: Job, now: float, delay_s: float = 0.0) -> None: ...
        def _released(self, job: Job, placement: Placement, now: float) -> None: ...
        def _release_slot(self, pid: str, rank: int | None, now: float, node_id: str | None = None) -> None: ...
        def _rank_started(self, job: Job, rank: int, now: float, out: list) -> None: ...
        def _rank_exited(self, job: Job, rank: int, code: int, now: float, out: list, fenced: bool = False,
                         oom: bool = False, reclaimed: bool = False) -> None: ...

    def _progressed(self, e: ev.JobProgressed, now: float, out: list) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.state != RUNNING:
            return
        if self.fw.progressed(job, e, now) and self.fw.pending():
            self._dirty = True

    def _joined(self, e: ev.NodeJoined, now: float, out: list) -> None:
        self.recovery.joined(e, now, out)

    def _lost(self, e: ev.NodeLost, now: float, out: list) -> None:
        node = self.state.nodes.get(e.node_id)
        if node is not None and node.up:
            self.lose_node(e.node_id, f"node {e.node_id} lost: {e.reason}", now, out, e.hold_s)

    def lose_node(self, node_id: str, reason: str, now: float, out: list, hold_s: float = 0.0) -> None:
        """Node down (no new work there): every placement touching it is stopped elsewhere and requeued
        whole, at once or, with ``hold_s``, only if the node has not come back within ``hold_s`` (while its
        lease fences its workers, they may still run: nothing is placed in their stead before)."""
        self.stats["nodes_lost"] += 1
        node = self.state.nodes[node_id]
        slots = list(node.slots.values())
        self.state.node_down(node_id)
        self.recovery.forget_node(node_id, now, now + hold_s if hold_s > 0 else None, reason)
        live = {pid for pid in (a.pid for a in slots) if hold_s > 0 and pid not in self.stopping
                and (job := self.holders.get(pid)) is not None and job.placement_id == pid
                and job.state in (PLACING, RUNNING)}
        # A stopping placement whose requeued job waits for it: its workers here may run until the hold is over.
        fenced = live | {a.pid for a in slots if hold_s > 0 and a.pid in self.stopping
                         and a.pid in self.recovery.waiting}
        if fenced:
            self.recovery.hold(node_id, [a for a in slots if a.pid in fenced], now + hold_s, reason)
        for pid in dict.fromkeys(a.pid for a in slots if a.pid not in live):
            self.placement_lost(pid, reason, now, out)
        self._dirty = True

    def placement_lost(self, pid: str, reason: str, now: float, out: list, node_id: str | None = None) -> None:
        """Some workers of ``pid`` are gone (their slots on ``node_id`` released here, when
        given): a stopping placement may finish; a live one is stopped and its job requeued."""
        if pid in self.stopping:
            if node_id:
                self._release_slot(pid, None, now, node_id)
            else:
                self._finish_if_empty(pid, now)
            return
        job = self.holders.get(pid)
        if job is None or job.placement_id != pid or job.state not in (PLACING, RUNNING):
            if node_id:
                self._release_slot(pid, None, now, node_id)
            return
        self.set_state(job, PENDING, reason, out)
        self._stop(job, "node lost", now, out, gone_node=node_id)
        self._requeue(job, now)

    def _finish_if_empty(self, pid: str, now: float) -> None:
        if pid not in self.state.allocs and pid in self.holders:
            stop = self.stopping.get(pid)
            job = self.holders[pid]
            placement = stop.placement if stop else job.placement
            assert placement is not None  # pid is its placement
            self._released(job, placement, now)

    def _report(self, e: ev.NodeReport, now: float, out: list) -> None:
        node = self.state.nodes.get(e.node_id)
        if node is None or not node.up or e.epoch != node.epoch:
            return
        moved = False
        for g in e.gpus:
            moved |= self.state.report_gpu(e.node_id, g.index, g.utilization, g.mem_used)
        if moved and self.fw.places(JobClass.OPPORTUNISTIC):
            self._dirty = True
        listed: set[tuple[str, int]] = set()
        for w in e.workers:
            pid = w.placement_id
            held = self.state.allocs.get(pid, {}).get(w.rank)
            on_node = held is not None and held.node_id == e.node_id
            if pid in self.stopping:
                if on_node and w.running:
                    listed.add((pid, w.rank))
                elif on_node:
                    self._release_slot(pid, w.rank, now)
                continue
            job = self._current(w.job_id, pid)
            if job is not None and on_node:
                listed.add((pid, w.rank))
                if w.running:
                    self._rank_started(job, w.rank, now, out)
                elif w.exit_code is not None:
                    self._rank_exited(job, w.rank, w.exit_code, now, out, w.fenced, w.oom, w.reclaimed)
                continue
            if w.running and job is None:
                self.stats["orphan_stops"] += 1
                out.append(ev.StopWorkers(w.job_id, pid, (e.node_id,), "orphan"))
        for pid, rank in list(node.slots):
            if pid in self.stopping and (pid, rank) not in listed:
                self._release_slot(pid, rank, now)
        running = frozenset((w.placement_id, w.rank) for w in e.workers if w.running)
        self.recovery.reported(node, listed, now, out, running)
