"""The placement half of the node core (``colocate.node.core.NodeCore``): its rules about the scheduler's
placements. Pure: no clock, no files, no processes, no sockets; ``colocate.node.workers.WorkerManager`` is the edge
that feeds the core these events and carries out its commands (spawning, signals, reaping, the table file, the
scheduler link).

Every placement rule of the node, each in one place:
  * identity and idempotence: a placement is ``(cluster_id, placement_id)`` (``scoped``); one the node has
    seen (running, ended, refused, stopped before it started) never starts a worker again, across restarts
    too (the table is persisted by the edge on ``Save``); a repeated start of a refused placement gets the
    same refusal, a start after its own stop a refusal, any other repeat nothing;
  * refusals, with a code: ``P.REFUSED`` (this request cannot run here) or ``P.REFUSED_STALE`` (a GPU is
    still held by a placement this node is stopping: our own stale state, never the job's failure);
  * GPU exclusivity: guaranteed shares per GPU sum to at most 1 (``colocate.node.claims``), over the claims of
    placements and of registered workers alike (````placement_claims``, ``worker_claims````): a worker started by hand counts;
  * promotion: the placement's ``promoted`` flag, and the job's promotion in the node core (on at ``Promoted``
    and ``Recovered``; off when a new placement of the job starts or the placement ends);
  * retirement: an ended placement stays in the table (and in the node's status) until the scheduler says it has
    journaled its end (``Settled``), or ``keep_ended_s`` after it ended when no scheduler says so; then only its id
    is remembered;
  * fencing: ``Fence(lapsed)`` says whether the node's lease has lapsed (its launchers are stopping their
    workers); a worker that ends with a non-zero code while it has is reported ``fenced``. ``Welcomed(cluster)``
    names the scheduler's cluster: placements of any other cluster are stopped and no longer reported.

Times: kill deadlines and end times are on the wall clock (events' ``wall``: they are persisted with the table and
outlive the node process).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from colocate import protocol as P
from colocate.base.vocab import JobClass
from colocate.node import events as E
from colocate.node.claims import Claim, conflict
from colocate.node.commands import Command, Launch, Note, Report, Save, Signal
from colocate.node.table import LocalPlacement, PlacementTable, scoped

STOPPED_BEFORE_START = "the placement was stopped before it started"
OTHER_CLUSTER = "a placement of another cluster (the scheduler's state file changed)"
RECLAIMED = "the guaranteed job on its GPU needs the memory it holds and cannot give back"


def fence_cause(p, lapsed: bool) -> str:
    """Why a worker of ``p`` that ended non-zero is reported fenced (lost through no fault of its own)."""
    return "the lease lapsed" if lapsed and p.stop_reason != OTHER_CLUSTER else "stopped as " + OTHER_CLUSTER
KEEP_ENDED_S = 300.0  # ended placements stay in status() this long, then only their id is remembered
MAX_OOM_NOTES = 1024  # workers that said they ran out of memory, awaiting their exit


class PlacementRules:
    """The placement events of ``NodeCore`` (a base class of it: one core, one state). ``table`` is plain data
    here (the edge loads and saves it)."""

    node_id: str
    node_epoch: int
    table: PlacementTable
    keep_ended_s: float
    cluster: str | None
    fenced: bool
    _held: list[tuple[str, P.Message]]

    def _init_placements(self) -> None:
        # a node without a scheduler link until the edge calls ``take_placements``
        self.node_id, self.table, self.keep_ended_s, self.cluster = "local", PlacementTable(), KEEP_ENDED_S, ""
        self.fenced = False
        self._oom: dict[tuple[str, int], bool] = {}  # (job, rank) -> said it is ending out of memory, until its exit
        self._held = []  # (cluster, message) produced before the first welcome
        self._reclaim_said: set[str] = set()  # workers started by hand the node would have reclaimed (said once)

    def take_placements(self, node_id: str, table: PlacementTable, keep_ended_s: float = KEEP_ENDED_S,
                        cluster: str | None = "") -> None:
        """Hold ``table`` (loaded by the edge) as this node ``node_id``'s placements. Called by the edge once, before
        any placement event. ``cluster``: the cluster whose placements are reported until a ``Welcomed`` names one;
        None: none yet (a node with a scheduler link: messages wait for the first welcome, which decides)."""
        self.node_id, self.table, self.keep_ended_s, self.cluster = node_id, table, keep_ended_s, cluster

    def _placement_handlers(self) -> dict[type, Callable[..., Any]]:
        return {E.Start: self._start, E.Launched: self._launched, E.LaunchFailed: self._launch_failed,
                E.Stop: self._stop, E.Promoted: self._promote, E.Settled: self._settled, E.Exited: self._exited, E.WallTick: self._wall_tick,
                E.Fence: self._fence, E.Welcomed: self._welcomed, E.Recovered: self._recovered}

    # ------------------------------------------------------------------ what the core provides
    def worker_claims(self, except_job: str | None = None) -> Iterator[Claim]:
        raise NotImplementedError

    def _guarantee(self, job: str, on: bool, now: float) -> list[Command]:
        raise NotImplementedError

    def _resume_to_stop(self, job: str, now: float) -> list[Command]:
        """The limits that let job ``job``'s registered workers run to their stop (none paused)."""
        raise NotImplementedError

    def reclaimable(self, now: float) -> tuple[float, list[tuple[str, str]]]:
        """(grace seconds, [(job, worker id)]): the registered opportunistic workers whose memory the guaranteed job
        on their GPU has wanted back long enough (``NodeConfig.reclaim_after_s``)."""
        raise NotImplementedError

    def start_point(self, job: str) -> tuple[int, float]:
        """(memory, share) the scheduler recommended as job ``job``'s starting point ((0, 0.0): none)."""
        for p in self.table.placements.values():
            if p.job_id == job and p.running:
                return p.start_mem, p.start_share
        return 0, 0.0

    def note_oom(self, job: str, rank: int) -> None:
        """Worker ``rank`` of ``job`` said it is ending for want of GPU memory: its exit is reported so."""
        self._oom[(job, rank)] = True
        while len(self._oom) > MAX_OOM_NOTES:  # a worker that said so and never exited here
            del self._oom[next(iter(self._oom))]

    # ------------------------------------------------------------------ views
    def status(self) -> list[P.WorkerStatus]:
        """``WorkerStatus`` of every worker of this cluster's running and recently ended placements."""
        return [P.WorkerStatus(job_id=p.job_id, placement_id=p.placement_id, rank=w.rank, pid=w.pid,
                               running=w.running, exit_code=w.exit_code, fenced=w.fenced, oom=w.oom,
                               reclaimed=w.reclaimed)
                for p in self.table.placements.values() if self._ours(p) for w in p.workers]

    def placement_claims(self, except_job: str | None = None) -> Iterator[Claim]:
        """Every running guaranteed (or promoted) placed worker's GPUs, owned by its placement's key (the
        placements of job ``except_job`` left out)."""
        for key, p in self.table.placements.items():
            if p.klass == JobClass.GUARANTEED and p.job_id != except_job:
                for w in p.workers:
                    if w.running:
                        yield from (Claim(g, key) for g in w.gpus)

    def _report(self, cluster: str, msg: P.Message) -> list[Command]:
        """A message about a placement of ``cluster`` for the scheduler: sent when that is the welcoming
        scheduler's cluster, dropped when it is another, held until the first welcome decides."""
        if self.cluster is None:
            self._held.append((cluster, msg))
            return []
        return [Report(msg)] if cluster == self.cluster else []

    def _ours(self, p: LocalPlacement) -> bool:
        return self.cluster is None or p.cluster == self.cluster

    # ------------------------------------------------------------------ starting
    def _start(self, e: E.Start, now: float) -> list[Command]:
        msg, t = e.msg, self.table
        key = scoped(msg.cluster_id, msg.placement_id)
        if key in t.refused:
            return self._report(msg.cluster_id, self._refusal(msg, t.refused[key][1]))
        if key in t.stopped_unknown:
            return self._report(msg.cluster_id, self._refusal(msg, STOPPED_BEFORE_START))
        if t.known(key):
            return [Note("info", f"placement {msg.placement_id} is known: nothing started again")]
        reason = self._check(msg)
        if reason is None:
            return [Launch(msg, key)]
        if isinstance(reason, tuple):  # a GPU held by a placement we are stopping: not remembered, retry later
            return [Note("warning", f"placement {msg.placement_id} of job {msg.job_id} must wait: {reason[0]}"),
                    *self._report(msg.cluster_id, self._refusal(msg, reason[0], P.REFUSED_STALE))]
        return self._refuse(msg, key, reason)

    def _check(self, msg: P.StartPlacement) -> str | tuple[str] | None:
        """Why the placement cannot start (a str), a tuple (reason,) when only our own stopping placements are
        in the way, or None. The file-system checks (cwd, command, port) are the edge's, at launch."""
        gpus = [g for w in msg.workers for g in w.gpus]
        if not msg.placement_id:
            return "the placement has no id"
        if not msg.workers:
            return "no workers for this node"
        for what, values in (("rank", [w.rank for w in msg.workers]),
                             ("local rank", [w.local_rank for w in msg.workers])):
            if len(set(values)) != len(values):
                return f"two workers have the same {what}"
        if any(w.rank >= msg.world_size for w in msg.workers):
            return f"a rank is outside the world size {msg.world_size}"
        if any(not w.gpus for w in msg.workers):
            return "a worker without a GPU: this node runs workers on GPUs only"
        have = self._gpu_indices()
        missing = sorted({g for g in gpus if g not in have})
        if missing:
            return f"GPU {missing[0]} is not on this node (it has {','.join(map(str, sorted(have))) or 'none'})"
        if len(set(gpus)) != len(gpus):
            return "two workers share a GPU"
        if msg.priority == JobClass.GUARANTEED:
            return self._exclusive(msg, gpus)
        return None

    def _exclusive(self, msg: P.StartPlacement, gpus: list[int]) -> str | tuple[str] | None:
        key = scoped(msg.cluster_id, msg.placement_id)
        held = conflict(chain(self.placement_claims(), self.worker_claims(except_job=msg.job_id)), gpus, key)
        if held is None:
            return None
        p = self.table.placements.get(held.owner)
        if p is None:  # a registered worker no placement of this node started
            return f"GPU {held.gpu} already runs guaranteed job {self._worker_holder(held.owner)}"
        if p.stopping:
            return (f"GPU {held.gpu} is busy with placement {p.placement_id} of job {p.job_id}, which this "
                    f"node is stopping",)
        return f"GPU {held.gpu} already runs guaranteed job {p.job_id} (placement {p.placement_id})"

    def _gpu_indices(self) -> set[int]:
        raise NotImplementedError

    def _worker_holder(self, owner: str) -> str:
        raise NotImplementedError

    def _launched(self, e: E.Launched, now: float) -> list[Command]:
        msg = e.msg
        key = scoped(msg.cluster_id, msg.placement_id)
        p = LocalPlacement(placement_id=msg.placement_id, job_id=msg.job_id, klass=msg.priority,
                           workers=list(e.workers), cluster=msg.cluster_id, start_mem=msg.start_mem,
                           start_share=msg.start_share)
        self.table.placements[key] = p
        started = ", ".join(f"rank {w.rank} pid {w.pid} GPU {','.join(map(str, w.gpus))}" for w in p.workers)
        out: list[Command] = [Save(), Note("info", f"started placement {p.placement_id} of job {p.job_id}: {started}")]
        out += self._guarantee(p.job_id, False, now)  # a new placement starts as placed
        for w in p.workers:
            out += self._report(p.cluster, P.WorkerStarted(
                node_id=self.node_id, epoch=self.node_epoch, job_id=p.job_id, placement_id=p.placement_id,
                rank=w.rank, pid=w.pid, log_path=w.log_path))
        return out

    def _launch_failed(self, e: E.LaunchFailed, now: float) -> list[Command]:
        return self._refuse(e.msg, scoped(e.msg.cluster_id, e.msg.placement_id), e.reason)

    def _refuse(self, msg: P.StartPlacement, key: str, reason: str) -> list[Command]:
        self.table.remember(self.table.refused, key, [msg.job_id, reason])
        return [Save(), Note("warning", f"refused placement {msg.placement_id} of job {msg.job_id}: {reason}"),
                *self._report(msg.cluster_id, self._refusal(msg, reason))]

    def _refusal(self, msg: P.StartPlacement, reason: str, code: P.Refusal = P.REFUSED) -> P.StartRefused:
        return P.StartRefused(node_id=self.node_id, epoch=self.node_epoch, job_id=msg.job_id,
                              placement_id=msg.placement_id, reason=reason[: P.MAX_TEXT_CHARS], code=code)

    # ------------------------------------------------------------------ stopping, promotion
    def _stop(self, e: E.Stop, now: float) -> list[Command]:
        t, key = self.table, scoped(e.cluster_id, e.placement_id)
        p = t.placements.get(key)
        if p is None:
            if t.known(key):
                return []
            t.remember(t.stopped_unknown, key, e.job_id)
            return [Save()]
        return [*self._stop_placement(key, p, e.grace_s, e.wall, now), Save()]

    def _stop_placement(self, key: str, p: LocalPlacement, grace_s: float, wall: float, now: float) -> list[Command]:
        """SIGTERM each running worker now, SIGKILL at ``wall + grace_s`` (a repeat only brings that forward); a
        paused worker resumes, so that what the signal asks of it (a checkpoint) runs before the SIGKILL."""
        out: list[Command] = [] if p.stopping else self._resume_to_stop(p.job_id, now)
        p.stopping = True
        deadline = wall + max(0.0, grace_s)
        for w in p.workers:
            if not w.running:
                continue
            if w.kill_at is None:
                out += [Note("info", f"stopping {p.job_id} rank {w.rank} (pid {w.pid}): SIGTERM, SIGKILL in "
                                     f"{grace_s:.1f} s"), Signal(key, w.rank, signal.SIGTERM)]
                w.kill_at = deadline
            else:
                w.kill_at = min(w.kill_at, deadline)
        return out

    def _settled(self, e: E.Settled, now: float) -> list[Command]:
        if e.cluster_id != self.cluster:
            return []  # another scheduler's word about its own placements
        moved = self.table.retire_ended([scoped(e.cluster_id, pid) for pid in e.placement_ids])
        return [Save()] if moved else []

    def _promote(self, e: E.Promoted, now: float) -> list[Command]:
        p = self.table.placements.get(scoped(e.cluster_id, e.placement_id))
        if p is None or not p.running:
            return [Note("warning", f"promote: placement {e.placement_id} is not running here")]
        out: list[Command] = []
        if not p.promoted:
            p.promoted, p.klass = True, JobClass.GUARANTEED
            out.append(Save())
        out.append(Note("info", f"placement {p.placement_id} of job {p.job_id} promoted: guaranteed from now on"))
        return out + self._guarantee(p.job_id, True, now)

    # ------------------------------------------------------------------ watching
    def _exited(self, e: E.Exited, now: float) -> list[Command]:
        p = self.table.placements.get(e.key)
        if p is None:
            return []
        w = next((w for w in p.workers if w.rank == e.rank), None)
        if w is None or not w.running:
            return []
        w.exit_code, w.kill_at = e.code, None
        w.fenced = (self.fenced or p.stop_reason == OTHER_CLUSTER) and e.code != 0
        w.oom = self._oom.pop((p.job_id, w.rank), False) and e.code != 0
        w.reclaimed = p.stop_reason == RECLAIMED and not w.fenced
        out: list[Command] = [Save(), Note("info", f"{p.job_id} rank {w.rank} (pid {w.pid}) of placement "
                                                   f"{p.placement_id} exited with {e.code}"
                                                   f"{f' (fenced: {fence_cause(p, self.fenced)})' if w.fenced else ''}"
                                                   f"{' (out of GPU memory)' if w.oom else ''}"
                                                   f"{' (stopped: its memory was reclaimed)' if w.reclaimed else ''}")]
        if not p.running:
            p.ended_at = e.wall
            out += self._guarantee(p.job_id, False, now)
        return out + self._report(p.cluster, P.WorkerExited(
            node_id=self.node_id, epoch=self.node_epoch, job_id=p.job_id, placement_id=p.placement_id, rank=w.rank,
            exit_code=e.code, fenced=w.fenced, oom=w.oom, reclaimed=w.reclaimed))

    def _wall_tick(self, e: E.WallTick, now: float) -> list[Command]:
        out: list[Command] = self._reclaim(e.wall, now)
        for key, p in self.table.placements.items():
            for w in p.workers:
                if w.running and w.kill_at is not None and e.wall >= w.kill_at and not w.killed:
                    w.killed = True
                    out += [Note("warning", f"{p.job_id} rank {w.rank} (pid {w.pid}) outlived its grace period: "
                                            "SIGKILL"), Signal(key, w.rank, signal.SIGKILL)]
        if self.table.retire(e.wall, self.keep_ended_s) or out:
            out.append(Save())
        return out

    def _reclaim(self, wall: float, now: float) -> list[Command]:
        """Stop the opportunistic placements whose worker holds memory the guaranteed job beside it needs and cannot
        give it back (``reclaimable``); their ends are reported ``reclaimed``: the scheduler queues them again. A
        worker started by hand stays paused (said once)."""
        out: list[Command] = []
        grace_s, workers = self.reclaimable(now)
        for job, worker in workers:
            found = [(k, p) for k, p in self.table.placements.items() if p.job_id == job and p.running
                     and p.klass == JobClass.OPPORTUNISTIC and not p.promoted and self._ours(p)]
            for key, p in found:
                if p.stopping:
                    continue
                p.stop_reason = RECLAIMED
                out += [Note("warning", f"placement {p.placement_id} of job {job} stopped: worker {worker} is paused "
                                        "holding GPU memory the guaranteed job beside it needs; it goes back to the "
                                        "scheduler's queue")]
                out += self._stop_placement(key, p, grace_s, wall, now)
            if not found and worker not in self._reclaim_said:
                if len(self._reclaim_said) >= MAX_OOM_NOTES:  # a long-lived node's hand-started workers
                    self._reclaim_said.clear()
                self._reclaim_said.add(worker)
                out.append(Note("warning", f"worker {worker} is paused holding GPU memory the guaranteed job beside "
                                           "it needs, and it was started by hand, not placed: it stays paused"))
        return out

    def _fence(self, e: E.Fence, now: float) -> list[Command]:
        if e.lapsed == self.fenced:
            return []
        self.fenced = e.lapsed
        if not any(p.running for p in self.table.placements.values()):
            return []
        if e.lapsed:
            return [Note("warning", "the lease lapsed: the launchers stop every placed worker")]
        return [Note("info", "the lease is held again")]

    def _welcomed(self, e: E.Welcomed, now: float) -> list[Command]:
        self.cluster = e.cluster_id
        out: list[Command] = [Report(m) for c, m in self._held if c == e.cluster_id]
        self._held = []
        for key, p in self.table.placements.items():
            if p.cluster != e.cluster_id and p.running and not p.stopping:
                out += [Note("warning", f"placement {p.placement_id} of job {p.job_id}: {OTHER_CLUSTER}: stopped")]
                p.stop_reason = OTHER_CLUSTER  # its workers' ends are reported fenced: lost, not failed, should
                out += self._stop_placement(key, p, e.grace_s, e.wall, now)  # their scheduler come back
        return out + ([Save()] if any(isinstance(c, Signal) for c in out) else [])

    def _recovered(self, e: E.Recovered, now: float) -> list[Command]:
        out: list[Command] = []
        for p in self.table.placements.values():
            if p.promoted and p.running:
                out += self._guarantee(p.job_id, True, now)
        return out
