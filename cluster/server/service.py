"""What the live scheduler does with each decoded message: journal, core, replies. No sockets.

``SchedulerService.on_message(ident, msg, now) -> [(ident, msg), ...]`` and ``tick(now)`` are the
whole interface; the ZeroMQ edge (``cluster.server.server``) decodes frames, calls them, and sends
what they return. ``now`` is the scheduler's wall clock (seconds since the epoch): the same clock
for the core, the journal and the views, so times survive a restart.

Rules it keeps:
  * write-ahead: the core's decisions are committed to the journal (states, placements, stopping
    placements) before any message they cause is returned for sending; a submit is committed
    before it is acknowledged, and a rejected submit leaves no row;
  * a node is known by the connection that said ``NodeHello``; a node message from any other
    connection gets ``Error(unknown_node)`` (the node says hello again) or ``forbidden`` (it
    speaks for another node); a message of an older node epoch is dropped;
  * who a peer is comes from its key (``peer``, the ZAP user id), never from what it says; what it
    may do (register as which node, submit as which user, cancel which jobs) is
    ``cluster.server.identity``; a refused hello gets ``Error(forbidden)``, logged once;
  * logs are relayed from the nodes that hold them (``cluster.server.logs``): no path is opened;
  * a node silent for ``heartbeat_s * liveness`` is down: ``NodeLost`` to the core, whose placements there
    are lost only ``replace_after_s(lease_s)`` after the node was last heard (its workers' launchers have
    stopped them by then: fencing, ``docs/node-placements.md``), unless it comes back before;
  * a node that says hello joins the core with its first ``NodeStatus`` (one batch: ``NodeJoined`` then the
    report), so it is reconciled (orphans stopped, lost placements requeued) before it is given new work;
  * ``NodeWelcome`` and ``StartPlacement`` carry the journal's cluster id (nodes scope placement ids by it)
    and the lease;
  * after a restart (``restore``), placements that were being stopped are stopped again as their
    nodes come back, and running workers are re-adopted from the nodes' reports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter, deque

from colocate import protocol as P
from colocate.endpoints import NODE_HEARTBEAT_S, NODE_LEASE_S, NODE_LIVENESS, replace_after_s
from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.server.identity import ANONYMOUS, Gate, peer_of
from cluster.server.journal import Journal
from cluster.server.launch import PortPool, start_messages
from cluster.server.logs import LogRelay
from cluster.server.views import QueueView, job_view, node_views
from cluster.spec import JobSpec, NodeSpec, SpecError

log = logging.getLogger("colocate.scheduler")

NODE_MESSAGES = P.NODE_TO_SCHEDULER
CLIENT_MESSAGES = P.CLIENT_TO_SCHEDULER
LATENCY_WINDOW = 5000


class SchedulerService:
    def __init__(self, core: SchedulerCore, journal: Journal, epoch: int, heartbeat_s: float = NODE_HEARTBEAT_S,
                 liveness: int = NODE_LIVENESS, lease_s: float = NODE_LEASE_S):
        self.core, self.journal, self.epoch = core, journal, epoch
        self.heartbeat_s, self.liveness, self.lease_s = heartbeat_s, liveness, lease_s
        self.cluster_id = journal.cluster_id()
        self.joining: dict[str, ev.NodeJoined] = {}  # node id -> its join, made with its first NodeStatus
        self.nodes: dict[str, bytes] = {}  # node id -> identity of its connection
        self.idents: dict[bytes, str] = {}  # identity -> node id
        self.hosts: dict[str, str] = {}  # node id -> host (MASTER_ADDR)
        self.epochs: dict[str, int] = {}  # node id -> its current epoch
        self.heard: dict[str, float] = {}  # node id -> last message (scheduler clock)
        self.ports = PortPool()
        self.restop: dict[str, list[tuple[str, str, str]]] = {}  # node -> [(pid, job, reason)] after restore
        self.counts: Counter = Counter()  # messages received by type
        self.bad: Counter = Counter()  # errors replied by code
        self.decided: Counter = Counter()  # decisions by type
        self.latency: deque[float] = deque(maxlen=LATENCY_WINDOW)  # seconds, event in -> messages out
        self.latency_count, self.latency_sum = 0, 0.0
        self.gate, self.peer = Gate(), ANONYMOUS  # peer: the identity of the message being handled
        self.log_relay = LogRelay()
        self._handlers = {
            P.NodeHello: self._hello, P.NodeHeartbeat: self._heartbeat, P.NodeStatus: self._status,
            P.WorkerStarted: self._worker_started, P.WorkerExited: self._worker_exited,
            P.StartRefused: self._refused, P.Submit: self._submit, P.JobsRequest: self._jobs,
            P.NodesRequest: self._nodes, P.Cancel: self._cancel, P.LogsRequest: self._logs,
            P.LogTail: self._log_tail,
        }

    # ------------------------------------------------------------------ start-up
    def restore(self, now: float) -> None:
        """Rebuild the core from the journal (call once, on a fresh core)."""
        records = self.journal.records()
        out = self.core.restore(records, now)
        for pid, job_id, nodes, reason in self.journal.stopping():
            for n in nodes:
                self.restop.setdefault(n, []).append((pid, job_id, reason))
        self._commit(out, now)
        active = sum(1 for r in records if r.state not in ev.TERMINAL)
        log.info("restored %d jobs (%d active) from %s", len(records), active, self.journal.path)

    # ------------------------------------------------------------------ entry points
    def on_message(self, ident: bytes, msg: P.Message, now: float,
                   peer: str | None = None) -> list[tuple[bytes, P.Message]]:
        """``peer``: the sender's key name with CURVE (the ZAP user id), None without keys."""
        self.peer = peer_of(peer)
        handler = self._handlers.get(type(msg))
        self.counts[msg.TYPE] += 1
        if handler is None:
            return [self._error(ident, P.FORBIDDEN, f"{msg.TYPE} is not accepted by the scheduler")]
        return handler(ident, msg, now)

    def tick(self, now: float) -> list[tuple[bytes, P.Message]]:
        events: list = []
        limit = self.heartbeat_s * self.liveness
        for node_id, t in list(self.heard.items()):
            if now - t > limit:
                events.append(self._silent(node_id, t, now))
        events.append(ev.Tick())
        return self._decide(events, now) + self.log_relay.expire(now)

    # ------------------------------------------------------------------ nodes
    def _node_of(self, ident: bytes, msg, now: float):
        """The node a message comes from, or an Error reply to send instead (None, reply)."""
        node_id = self.idents.get(ident)
        if node_id is None:
            return None, [self._error(ident, P.UNKNOWN_NODE, f"node {msg.node_id} is not registered: say hello")]
        if node_id != msg.node_id:
            return None, [self._error(ident, P.FORBIDDEN, f"this connection is node {node_id}, not {msg.node_id}")]
        if msg.epoch < self.epochs.get(node_id, 0):
            return None, []  # a stale incarnation's message
        self.heard[node_id] = now
        return node_id, None

    def _hello(self, ident: bytes, m: P.NodeHello, now: float):
        held = self.nodes.get(m.node_id) not in (None, ident)  # by another connection
        why = self.gate.hello(self.peer, m.node_id, now - self.heard.get(m.node_id, now) if held else None,
                              self.heartbeat_s * self.liveness)
        if why:
            self.gate.refused(ident, why)
            return [self._error(ident, P.FORBIDDEN, why)]
        spec = NodeSpec(m.node_id, gpus=len(m.gpus), gpu_model=m.gpus[0].model if m.gpus else "",
                        gpu_mem=min((g.mem_total for g in m.gpus), default=0), cpu_milli=m.cpu_milli,
                        mem_mib=m.mem_mib)
        old = self.nodes.get(m.node_id)
        if old is not None and old != ident:
            self.idents.pop(old, None)
        self.nodes[m.node_id], self.idents[ident] = ident, m.node_id
        self.hosts[m.node_id], self.epochs[m.node_id] = m.host or "127.0.0.1", m.epoch
        self.heard[m.node_id] = now
        log.info("node %s (epoch %d, %s) joined: %d GPU(s) %s", m.node_id, m.epoch, m.host, spec.gpus, spec.gpu_model)
        welcome = (ident, P.NodeWelcome(node_id=m.node_id, scheduler_epoch=self.epoch, heartbeat_s=self.heartbeat_s,
                                        liveness=self.liveness, cluster_id=self.cluster_id, lease_s=self.lease_s))
        out = [welcome] + self._join_later(ev.NodeJoined(spec, m.epoch))
        for pid, job_id, reason in self.restop.pop(m.node_id, []):
            out.append((ident, P.StopPlacement(placement_id=pid, job_id=job_id, reason=reason)))
        return out

    def _heartbeat(self, ident: bytes, m: P.NodeHeartbeat, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        return [(ident, P.NodeHeartbeat(node_id=node_id, epoch=self.epoch))]

    def _status(self, ident: bytes, m: P.NodeStatus, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        report = ev.NodeReport(node_id, m.epoch, tuple(ev.GpuReport(g.index, g.utilization, g.mem_used) for g in m.gpus),
                               tuple(ev.WorkerReport(w.job_id, w.placement_id, w.rank, w.running, w.exit_code, w.fenced)
                                     for w in m.workers))
        joined = self.joining.pop(node_id, None)
        return self._decide(([joined] if joined else []) + [report], now)

    def _worker_started(self, ident: bytes, m: P.WorkerStarted, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        with self.journal.transaction():
            self.journal.add_log(m.job_id, m.rank, m.placement_id, node_id, m.log_path, now)
        return self._decide([ev.WorkerStarted(m.job_id, m.placement_id, m.rank)], now)

    def _worker_exited(self, ident: bytes, m: P.WorkerExited, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        job = self.core.job(m.job_id)
        # the job's exit code is its cause: the first worker to end the placement's run (a failing rank, or the
        # last of a successful gang); the ranks we stop because of it (143) come after, when it is over
        if job is not None and job.placement_id == m.placement_id and job.state in (ev.PLACING, ev.RUNNING):
            with self.journal.transaction():
                row = self.journal.job(m.job_id)
                if row is not None and (m.exit_code != 0 or row["exit_code"] is None):
                    self.journal.set_exit_code(m.job_id, m.exit_code)
        return self._decide([ev.WorkerExited(m.job_id, m.placement_id, m.rank, m.exit_code, m.fenced)], now)

    def _refused(self, ident: bytes, m: P.StartRefused, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        log.warning("node %s refused placement %s (%s): %s", node_id, m.placement_id, m.code, m.reason)
        stale = m.code == P.REFUSED_STALE
        return self._decide([ev.StartRefused(m.job_id, m.placement_id, node_id, m.reason, stale)], now)

    def _silent(self, node_id: str, heard: float, now: float) -> ev.NodeLost:
        """Node ``node_id``, last heard at ``heard``, is down; its placements are lost once its lease and the
        stop grace have run out (``replace_after_s``), unless it comes back before."""
        hold = max(0.0, heard + replace_after_s(self.lease_s) - now)
        log.warning("node %s missed %d heartbeats (silent %.1f s): down; its placements are lost in %.1f s unless it "
                    "returns", node_id, self.liveness, now - heard, hold)
        self._forget(node_id)
        self.joining.pop(node_id, None)
        return ev.NodeLost(node_id, f"silent for {now - heard:.1f} s", hold)

    def _join_later(self, joined: ev.NodeJoined) -> list:
        """A node joins the core with its first report (``_status``): reconciled before any new work."""
        self.joining[joined.spec.node_id] = joined
        return []

    def _forget(self, node_id: str) -> None:
        ident = self.nodes.pop(node_id, None)
        if ident is not None:
            self.idents.pop(ident, None)
        self.heard.pop(node_id, None)

    # ------------------------------------------------------------------ clients
    def _submit(self, ident: bytes, m: P.Submit, now: float):
        why = self.gate.client(self.peer, "submit jobs")
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        req = dataclasses.replace(m.request, user=self.gate.user(self.peer, m.request.user))
        try:
            spec = JobSpec("?", submit_time=now, workers=req.workers, gpus=req.gpus, gpu_mem=req.gpu_mem,
                           priority=req.priority, queue=req.queue or "default", user=req.user, name=req.name,
                           estimate_s=req.estimate_s)
        except SpecError as exc:
            return [self._error(ident, P.INVALID, str(exc).replace("?: ", ""))]
        why = self.core.validate(spec)  # duplicate id, unknown queue, a request no known node could take
        if why:
            return [self._error(ident, P.INVALID, why)]
        with self.journal.transaction():
            job_id = self.journal.new_job_id()
            spec = dataclasses.replace(spec, job_id=job_id)
            self.journal.insert_job(spec, json.dumps(P.to_wire(P.Submit(request=req))["request"]), now)
        log.info("job %s submitted: %d x %d GPU(s), %s, queue %s", job_id, spec.workers, spec.gpus, spec.priority,
                 spec.queue)
        return [(ident, P.Submitted(job_id=job_id))] + self._decide([ev.JobSubmitted(spec)], now)

    def _jobs(self, ident: bytes, m: P.JobsRequest, now: float):
        if m.job_id is not None:
            row = self.journal.job(m.job_id)
            if row is None:
                return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
            rows, total = [row], 1
        else:
            rows, total = self.journal.jobs(m.active_only, m.offset, m.limit)
        queues = QueueView(self.core)
        return [(ident, P.JobsReply(jobs=tuple(job_view(r, self.core, queues) for r in rows), total=total,
                                    queued=queues.queued))]

    def _nodes(self, ident: bytes, m: P.NodesRequest, now: float):
        return [(ident, P.NodesReply(nodes=tuple(node_views(self.core, self.hosts)), scheduler_epoch=self.epoch))]

    def _cancel(self, ident: bytes, m: P.Cancel, now: float):
        job = self.core.job(m.job_id)
        if job is None:
            return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
        why = self.gate.cancel(self.peer, m.job_id, job.spec.user)
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        if job.state in ev.TERMINAL:
            return [self._error(ident, P.INVALID, f"job {m.job_id} already {job.state}")]
        out = self._decide([ev.JobCancelled(m.job_id)], now)
        return [(ident, P.Ok(message=f"job {m.job_id} cancelled"))] + out

    def _logs(self, ident: bytes, m: P.LogsRequest, now: float):
        why = self.gate.client(self.peer, "read logs")
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        row = self.journal.job(m.job_id)
        if row is None:
            return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
        workers = json.loads(row["spec"])["workers"]
        if m.rank is not None and m.rank >= workers:
            return [self._error(ident, P.NOT_FOUND, f"job {m.job_id} has no worker {m.rank} (it has {workers}: "
                                                    f"ranks 0 to {workers - 1})")]
        held = [(r, n) for r, n, _ in self.journal.logs(m.job_id) if m.rank is None or r == m.rank]
        if not held:
            return [(ident, P.LogsReply(job_id=m.job_id, logs=()))]
        return self.log_relay.ask(ident, m.job_id, held, self.nodes, now)

    def _log_tail(self, ident: bytes, m: P.LogTail, now: float):
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        return self.log_relay.answer(node_id, m)

    # ------------------------------------------------------------------ decisions
    def _decide(self, events: list, now: float) -> list[tuple[bytes, P.Message]]:
        decisions = self.core.handle_batch(events, now)
        return self._commit(decisions, now)

    def _commit(self, decisions: list, now: float) -> list[tuple[bytes, P.Message]]:
        """Journal the decisions (one transaction), then the messages they cause."""
        if not decisions:
            self._sync_stopping()
            return []
        with self.journal.transaction():
            for d in decisions:
                self.decided[type(d).__name__] += 1
                if isinstance(d, ev.JobChanged):
                    self.journal.set_state(d.job_id, d.state, d.reason, now)
                elif isinstance(d, ev.StartWorkers):
                    job = self.core.job(d.spec.job_id)
                    self.journal.set_placement(d.spec.job_id, d.placement, job.attempt, job.failed_starts)
            self._sync_stopping()
        out = []
        for d in decisions:
            if isinstance(d, ev.StartWorkers):
                out += self._start(d)
            elif isinstance(d, ev.StopWorkers):
                self.ports.release(d.placement_id)
                out += [(self.nodes[n], P.StopPlacement(placement_id=d.placement_id, job_id=d.job_id, reason=d.reason))
                        for n in d.nodes if n in self.nodes]
            elif isinstance(d, ev.Promote):
                out += [(self.nodes[n], P.PromotePlacement(placement_id=d.placement_id, job_id=d.job_id))
                        for n in d.nodes if n in self.nodes]
            elif isinstance(d, ev.JobChanged) and d.state in ev.TERMINAL and d.placement_id:
                self.ports.release(d.placement_id)
        return out

    def _sync_stopping(self) -> None:
        """The journal's stopping table follows the core's stopping placements (inside a transaction
        when called from ``_commit``)."""
        live = {pid: s for pid, s in self.core.stopping.items()}
        known = {pid for pid, *_ in self.journal.stopping()}
        for pid in known - set(live):
            self.journal.drop_stopping(pid)
        for pid in set(live) - known:
            s = live[pid]
            self.journal.add_stopping(pid, s.job.job_id, s.placement.nodes(), s.reason)

    def _start(self, d: ev.StartWorkers) -> list[tuple[bytes, P.Message]]:
        row = self.journal.job(d.spec.job_id)
        request = P.from_wire({"v": P.PROTOCOL_VERSION, "t": "submit", "request": json.loads(row["request"])}).request
        msgs = start_messages(d.spec, d.placement, request, self.hosts, self.ports)
        out = []
        for node_id, msg in msgs.items():
            if node_id in self.nodes:
                out.append((self.nodes[node_id], dataclasses.replace(msg, cluster_id=self.cluster_id)))
            else:  # the node went away between the cycle and now: its NodeLost will requeue the job
                log.warning("placement %s: node %s is not connected", d.placement.placement_id, node_id)
        return out

    def _error(self, ident: bytes, code: str, message: str) -> tuple[bytes, P.Message]:
        self.bad[code] += 1
        return ident, P.Error(code=code, message=message[:P.MAX_TEXT_CHARS], job_id=None)
