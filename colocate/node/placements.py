"""The node's placement core: ``PlacementCore.handle(event, now) -> commands``. Pure: no clock, no files, no
processes, no sockets; ``colocate.node.workers.WorkerManager`` is the edge that feeds it events and carries
out its commands (spawning, signals, reaping, the table file, the scheduler link).

It owns every placement rule of the node, each in one place:
  * identity and idempotence: a placement is ``(cluster_id, placement_id)`` (``scoped``); one the node has
    seen (running, ended, refused, stopped before it started) never starts a worker again, across restarts
    too (the table is persisted by the edge on ``Save``); a repeated start of a refused placement gets the
    same refusal, a start after its own stop a refusal, any other repeat nothing;
  * refusals, with a code: ``P.REFUSED`` (this request cannot run here) or ``P.REFUSED_STALE`` (a GPU is
    still held by a placement this node is stopping: our own stale state, never the job's failure);
  * GPU exclusivity: guaranteed shares per GPU sum to at most 1 (``colocate.node.claims``; a placement holds
    share 1.0 of each of its GPUs today);
  * promotion: the placement's ``promoted`` flag, and ``Guarantee(job, on)`` to the node core when it
    changes (on at ``Promote``; off when a new placement of the job starts or the placement ends);
  * fencing: ``Fence(lapsed)`` says whether the node's lease has lapsed (its launchers are stopping their
    workers); a worker that ends with a non-zero code while it has is reported ``fenced``. ``Welcomed(cluster)``
    names the scheduler's cluster: placements of any other cluster are stopped and no longer reported.

Events: ``Start``, ``Launched``, ``LaunchFailed``, ``Stop``, ``Promote``, ``Exited``, ``Tick``, ``Fence``,
``Welcomed``, ``Recovered``. Commands: ``Launch`` (the edge checks what needs the file system, spawns, and
answers ``Launched`` or ``LaunchFailed``), ``Signal``, ``Report`` (a message for the scheduler), ``Guarantee``,
``Save``, ``Note`` (a line for the log). ``now`` is the wall clock in seconds (kill deadlines and end times
are persisted with the table and outlive the node process).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colocate import protocol as P
from colocate.node.claims import Claim, conflict
from colocate.node.worker_table import Placement, WorkerTable, scoped
from colocate.vocab import Priority

STOPPED_BEFORE_START = "the placement was stopped before it started"
OTHER_CLUSTER = "a placement of another cluster (the scheduler's state file changed)"


# ---------------------------------------------------------------- events
@dataclass(frozen=True)
class Start:
    msg: P.StartPlacement


@dataclass(frozen=True)
class Launched:
    """The edge started every worker of ``msg`` (``workers``: their ``Worker`` records)."""

    msg: P.StartPlacement
    workers: tuple


@dataclass(frozen=True)
class LaunchFailed:
    """The edge started nothing: ``reason`` (cwd, command, port, the launcher itself)."""

    msg: P.StartPlacement
    reason: str


@dataclass(frozen=True)
class Stop:
    placement_id: str
    job_id: str = ""
    grace_s: float = 10.0
    cluster_id: str = ""


@dataclass(frozen=True)
class Promote:
    placement_id: str
    cluster_id: str = ""


@dataclass(frozen=True)
class Exited:
    """Worker ``rank`` of placement ``key`` (``scoped``) ended with ``code``."""

    key: str
    rank: int
    code: int


@dataclass(frozen=True)
class Tick:
    """Time passed: kill deadlines, forgetting long-ended placements."""


@dataclass(frozen=True)
class Fence:
    """The node's lease has lapsed (True) or was renewed (False)."""

    lapsed: bool


@dataclass(frozen=True)
class Welcomed:
    """The scheduler of cluster ``cluster_id`` welcomed the node."""

    cluster_id: str


@dataclass(frozen=True)
class Recovered:
    """The table was loaded by a new node process: tell the node core its promotions again."""


# ---------------------------------------------------------------- commands
@dataclass(frozen=True)
class Launch:
    msg: P.StartPlacement
    key: str


@dataclass(frozen=True)
class Signal:
    key: str
    rank: int
    sig: int


@dataclass(frozen=True)
class Report:
    msg: P.Message


@dataclass(frozen=True)
class Guarantee:
    job_id: str
    on: bool = True


@dataclass(frozen=True)
class Save:
    pass


@dataclass(frozen=True)
class Note:
    level: str  # info | warning
    text: str


class PlacementCore:
    """One per node process. ``table`` is plain data here (the edge loads and saves it)."""

    def __init__(self, node_id: str, epoch: int, gpus, table: WorkerTable, keep_ended_s: float = 300.0,
                 cluster: str | None = ""):
        """``cluster``: the cluster whose placements are reported until a ``Welcomed`` names one; None: none
        yet (a node with a scheduler link: messages wait for the first welcome, which decides)."""
        self.node_id, self.epoch, self.gpus = node_id, epoch, set(gpus)
        self.table, self.keep_ended_s = table, keep_ended_s
        self.cluster = cluster
        self.fenced = False
        self._held: list = []  # (cluster, message) produced before the first welcome
        self._handlers: dict[type, Callable[..., Any]] = {Start: self._start, Launched: self._launched, LaunchFailed: self._launch_failed,
                          Stop: self._stop, Promote: self._promote, Exited: self._exited, Tick: self._tick,
                          Fence: self._fence, Welcomed: self._welcomed, Recovered: self._recovered}

    def handle(self, event, now: float) -> list:
        return self._handlers[type(event)](event, now)

    # ------------------------------------------------------------------ views
    def status(self) -> list:
        """``WorkerStatus`` of every worker of this cluster's running and recently ended placements."""
        return [P.WorkerStatus(job_id=p.job_id, placement_id=p.placement_id, rank=w.rank, pid=w.pid,
                               running=w.running, exit_code=w.exit_code, fenced=w.fenced)
                for p in self.table.placements.values() if self._ours(p) for w in p.workers]

    def _report(self, cluster: str, msg: P.Message) -> list:
        """A message about a placement of ``cluster`` for the scheduler: sent when that is the welcoming
        scheduler's cluster, dropped when it is another, held until the first welcome decides."""
        if self.cluster is None:
            self._held.append((cluster, msg))
            return []
        return [Report(msg)] if cluster == self.cluster else []

    def _ours(self, p: Placement) -> bool:
        return self.cluster is None or p.cluster == self.cluster

    # ------------------------------------------------------------------ starting
    def _start(self, e: Start, now: float) -> list:
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
            return [Note("warning", f"placement {msg.placement_id} of job {msg.job_id} must wait: {reason[0]}")
                    ] + self._report(msg.cluster_id, self._refusal(msg, reason[0], P.REFUSED_STALE))
        return self._refuse(msg, key, reason)

    def _check(self, msg: P.StartPlacement):
        """Why the placement cannot start (a str), a tuple (reason,) when only our own stopping placements are
        in the way, or None. The file-system checks (cwd, command, port) are the edge's, at launch."""
        gpus = [g for w in msg.workers for g in w.gpus]
        if not msg.placement_id:
            return "the placement has no id"
        if not msg.workers:
            return "no workers for this node"
        for what, values in (("rank", [w.rank for w in msg.workers]), ("local rank", [w.local_rank for w in msg.workers])):
            if len(set(values)) != len(values):
                return f"two workers have the same {what}"
        if any(w.rank >= msg.world_size for w in msg.workers):
            return f"a rank is outside the world size {msg.world_size}"
        if any(not w.gpus for w in msg.workers):
            return "a worker without a GPU: this node runs workers on GPUs only"
        missing = sorted({g for g in gpus if g not in self.gpus})
        if missing:
            have = ",".join(map(str, sorted(self.gpus))) or "none"
            return f"GPU {missing[0]} is not on this node (it has {have})"
        if len(set(gpus)) != len(gpus):
            return "two workers share a GPU"
        if msg.priority == Priority.GUARANTEED:
            key = scoped(msg.cluster_id, msg.placement_id)
            held = conflict(self._claims(), gpus, key)
            if held is not None:
                p = self.table.placements[held.owner]
                why = f"GPU {held.gpu} already runs guaranteed job {p.job_id} (placement {p.placement_id})"
                if p.stopping:
                    return (f"GPU {held.gpu} is busy with placement {p.placement_id} of job {p.job_id}, which this "
                            f"node is stopping",)
                return why
        return None

    def _claims(self):
        """Every running guaranteed (or promoted) worker's GPUs, owned by its placement's key."""
        for key, p in self.table.placements.items():
            if p.priority == Priority.GUARANTEED:
                for w in p.workers:
                    if w.running:
                        yield from (Claim(g, key) for g in w.gpus)

    def _launched(self, e: Launched, now: float) -> list:
        msg = e.msg
        key = scoped(msg.cluster_id, msg.placement_id)
        p = Placement(placement_id=msg.placement_id, job_id=msg.job_id, priority=msg.priority,
                      workers=list(e.workers), cluster=msg.cluster_id)
        self.table.placements[key] = p
        started = ", ".join(f"rank {w.rank} pid {w.pid} GPU {','.join(map(str, w.gpus))}" for w in p.workers)
        return [Save(), Note("info", f"started placement {p.placement_id} of job {p.job_id}: {started}"),
                Guarantee(p.job_id, on=False)] + [  # a new placement starts as placed
            r for w in p.workers for r in self._report(p.cluster, P.WorkerStarted(
                node_id=self.node_id, epoch=self.epoch, job_id=p.job_id, placement_id=p.placement_id, rank=w.rank,
                pid=w.pid, log_path=w.log_path))]

    def _launch_failed(self, e: LaunchFailed, now: float) -> list:
        return self._refuse(e.msg, scoped(e.msg.cluster_id, e.msg.placement_id), e.reason)

    def _refuse(self, msg: P.StartPlacement, key: str, reason: str) -> list:
        self.table.remember(self.table.refused, key, [msg.job_id, reason])
        return [Save(), Note("warning", f"refused placement {msg.placement_id} of job {msg.job_id}: {reason}")
                ] + self._report(msg.cluster_id, self._refusal(msg, reason))

    def _refusal(self, msg: P.StartPlacement, reason: str, code: str = P.REFUSED) -> P.StartRefused:
        return P.StartRefused(node_id=self.node_id, epoch=self.epoch, job_id=msg.job_id,
                              placement_id=msg.placement_id, reason=reason[: P.MAX_TEXT_CHARS], code=code)

    # ------------------------------------------------------------------ stopping, promotion
    def _stop(self, e: Stop, now: float) -> list:
        t, key = self.table, scoped(e.cluster_id, e.placement_id)
        p = t.placements.get(key)
        if p is None:
            if t.known(key):
                return []
            t.remember(t.stopped_unknown, key, e.job_id)
            return [Save()]
        return self._stop_placement(key, p, e.grace_s, now) + [Save()]

    def _stop_placement(self, key: str, p: Placement, grace_s: float, now: float) -> list:
        """SIGTERM each running worker now, SIGKILL at ``now + grace_s`` (a repeat only brings that forward)."""
        out: list = []
        p.stopping = True
        deadline = now + max(0.0, grace_s)
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

    def _promote(self, e: Promote, now: float) -> list:
        p = self.table.placements.get(scoped(e.cluster_id, e.placement_id))
        if p is None or not p.running:
            return [Note("warning", f"promote: placement {e.placement_id} is not running here")]
        out: list = []
        if not p.promoted:
            p.promoted, p.priority = True, Priority.GUARANTEED
            out.append(Save())
        return out + [Note("info", f"placement {p.placement_id} of job {p.job_id} promoted: guaranteed from now on"),
                      Guarantee(p.job_id, on=True)]

    # ------------------------------------------------------------------ watching
    def _exited(self, e: Exited, now: float) -> list:
        p = self.table.placements.get(e.key)
        if p is None:
            return []
        w = next((w for w in p.workers if w.rank == e.rank), None)
        if w is None or not w.running:
            return []
        w.exit_code, w.kill_at = e.code, None
        w.fenced = self.fenced and e.code != 0
        out: list = [Save(), Note("info", f"{p.job_id} rank {w.rank} (pid {w.pid}) of placement {p.placement_id} "
                                          f"exited with {e.code}{' (fenced: the lease lapsed)' if w.fenced else ''}")]
        if not p.running:
            p.ended_at = now
            out.append(Guarantee(p.job_id, on=False))
        return out + self._report(p.cluster, P.WorkerExited(
            node_id=self.node_id, epoch=self.epoch, job_id=p.job_id, placement_id=p.placement_id, rank=w.rank,
            exit_code=e.code, fenced=w.fenced))

    def _tick(self, e: Tick, now: float) -> list:
        out: list = []
        for key, p in self.table.placements.items():
            for w in p.workers:
                if w.running and w.kill_at is not None and now >= w.kill_at and not w.killed:
                    w.killed = True
                    out += [Note("warning", f"{p.job_id} rank {w.rank} (pid {w.pid}) outlived its grace period: "
                                            "SIGKILL"), Signal(key, w.rank, signal.SIGKILL)]
        if self.table.retire(now, self.keep_ended_s) or out:
            out.append(Save())
        return out

    def _fence(self, e: Fence, now: float) -> list:
        if e.lapsed == self.fenced:
            return []
        self.fenced = e.lapsed
        if not any(p.running for p in self.table.placements.values()):
            return []
        if e.lapsed:
            return [Note("warning", "the lease lapsed: the launchers stop every placed worker")]
        return [Note("info", "the lease is held again")]

    def _welcomed(self, e: Welcomed, now: float) -> list:
        from colocate.endpoints import FENCE_GRACE_S

        self.cluster = e.cluster_id
        out: list = [Report(m) for c, m in self._held if c == e.cluster_id]
        self._held = []
        for key, p in self.table.placements.items():
            if p.cluster != e.cluster_id and p.running and not p.stopping:
                out += [Note("warning", f"placement {p.placement_id} of job {p.job_id}: {OTHER_CLUSTER}: stopped")]
                out += self._stop_placement(key, p, FENCE_GRACE_S, now)
        return out + ([Save()] if any(isinstance(c, Signal) for c in out) else [])

    def _recovered(self, e: Recovered, now: float) -> list:
        return [Guarantee(p.job_id, on=True) for p in self.table.placements.values() if p.promoted and p.running]
