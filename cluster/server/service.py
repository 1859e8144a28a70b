"""What the live scheduler does with each decoded message: journal, core, replies. No sockets.

``SchedulerService.on_message(ident, msg, now) -> [(ident, msg), ...]`` and ``tick(now)`` are the
whole interface; the ZeroMQ edge (``cluster.server.server``) decodes frames, calls them, and sends
what they return. ``now`` is the scheduler's wall clock (seconds since the epoch): the same clock
for the core, the journal and the views, so times survive a restart. Neither raises, except
``CoreBroken`` (the process must exit non-zero: a supervisor restarts it on the same journal) and
``JournalLockLost`` (another scheduler may hold the journal now: exit, committing nothing more).

Rules it keeps:
  * write-ahead: the core's decisions are committed to the journal (states, placements, stopping
    placements) before any message they cause is returned for sending; a submit is committed
    before it is acknowledged, and a rejected submit leaves no row. Side resources (rendezvous
    ports) are taken before the commit and given back if it fails; a placement with no free port
    is committed and waits for one (retried every tick), it is never an error after the commit;
  * idempotent submit: a ``Submit`` with a ``request_id`` the same user already used is answered
    with that job's id and creates nothing (a client retries a timed-out submit with the same id);
  * the core never runs ahead of the journal. A journal write that fails (disk full, read-only,
    I/O error) is logged once; the core is rebuilt from the journal (``restore``, then the
    connected nodes join again); until a probe (every ``PROBE_S``) finds the file writable,
    submits and cancels get ``Error(unavailable)`` (nothing done), node heartbeats and hellos are
    answered, and the nodes' other messages are kept (at most ``MAX_DEFERRED``) and replayed, in
    order, once the journal is back; a node lost meanwhile is lost to the core on resuming;
  * an exception inside the policy core (a plugin that raises) or anywhere in handling a message
    discards the core: it is rebuilt from the journal the same way (logged once per distinct
    failure), the event is applied again without a scheduling cycle, and the sender of what could
    not be applied gets ``Error(unavailable)``. A rebuild that fails raises ``CoreBroken``;
  * a node is known by the connection that said ``NodeHello``; a node message from any other
    connection gets ``Error(unknown_node)`` (the node says hello again) or ``forbidden`` (it
    speaks for another node); a message of an older node epoch is dropped;
  * who a peer is comes from its key (``peer``, the ZAP user id), never from what it says; what it
    may do (register as which node, submit as which user, cancel which jobs) is
    ``cluster.server.identity``; a refused hello gets ``Error(forbidden)``, logged once;
  * logs are relayed from the nodes that hold them (``cluster.server.logs``): no path is opened;
  * the progress and features a node reports for a job (``NodeStatus.progress``) are kept in memory, the
    latest per job (``cluster.server.views.Progress``), and shown on its ``JobView``; a report that moved a
    job's iterations reaches the core as ``JobProgressed`` (its run-time prediction), after the report;
  * a submit that leaves its memory or share to its recommendation (``JobRequest.auto``, or the site's
    ``scheduler.auto``) gets it (``cluster.server.advice``), journaled with the job; ``RecommendRequest`` answers
    what a job (or a command) would get;
  * a run that ends (the job's end, or an out-of-memory restart) leaves one history record
    (``cluster.server.learning``), journaled in the transaction that journals the end; every core built from the
    journal (start, rebuild) learns the history first; its GPU type is the model of the GPUs the run had, as its
    nodes' hellos listed each GPU (``cluster.server.node_gpus``: a node may hold several models), not the node's
    registered one; a GPU model's speed (what recommendations compare) is the first declared for it;
  * a node silent for ``heartbeat_s * liveness`` is down: ``NodeLost`` to the core, whose placements there
    are lost only ``replace_after_s(lease_s)`` after the node was last heard (its workers' launchers have
    stopped them by then: fencing, ``docs/node-placements.md``), unless it comes back before;
  * a node that says hello joins the core with its first ``NodeStatus`` (one batch: ``NodeJoined`` then the
    report), so it is reconciled (orphans stopped, lost placements requeued) before it is given new work;
  * ``NodeWelcome`` and ``StartPlacement`` carry the journal's cluster id (nodes scope placement ids by it)
    and the lease;
  * after a restart or a rebuild, placements that were being stopped are stopped again as their
    nodes come back (or at once on connected nodes), and running workers are re-adopted from the
    nodes' next reports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, assert_never

from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.server.batch import handle_batch
from cluster.server.faults import MAX_DEFERRED, CoreBroken, Faults, NodeWrite, Replies, _Refused
from cluster.server.identity import ANONYMOUS, Gate, peer_of
from cluster.server.journal import Journal, JournalLockLost, JournalUnavailable
from cluster.server.learning import Learning
from cluster.server.logs import LogRelay
from cluster.server.node_gpus import NodeGpus, node_model, shown_models
from cluster.server.node_reports import NodeReports
from cluster.server.ports import PortPool
from cluster.server.rendezvous import master_host, start_messages
from cluster.server.requests import Requests
from cluster.server.views import Progress
from cluster.spec import NodeSpec
from colocate import protocol as P
from colocate.base.endpoints import NODE_HEARTBEAT_S, NODE_LEASE_S, NODE_LIVENESS, replace_after_s
from colocate.base.vocab import TERMINAL

log = logging.getLogger("colocate.scheduler")

NODE_MESSAGES = P.NODE_TO_SCHEDULER
CLIENT_MESSAGES = P.CLIENT_TO_SCHEDULER
LATENCY_WINDOW = 5000

Handler = Callable[[bytes, Any, float], Replies]  # (ident, a message of the type it is registered for, now)


class SchedulerService(Requests, NodeReports, Faults):
    def __init__(self, core: SchedulerCore, journal: Journal, epoch: int, heartbeat_s: float = NODE_HEARTBEAT_S,
                 liveness: int = NODE_LIVENESS, lease_s: float = NODE_LEASE_S,
                 topology: dict[str, tuple[str, str]] | None = None):
        self.core, self.journal, self.epoch = core, journal, epoch
        # node id -> (switch, rack) from the operator's topology file: overrides what a node's hello says
        self.topology = topology or {}
        self.heartbeat_s, self.liveness, self.lease_s = heartbeat_s, liveness, lease_s
        self.cluster_id = journal.cluster_id()
        if journal.minted_cluster and journal.peek_job_id() == "1":  # a new file (an old one without an id: not)
            log.info("%s is a new cluster (id %s): nodes that ran another cluster's placements stop them when "
                        "this scheduler welcomes them; if this is not the state file you meant, stop now and start "
                        "the scheduler on the right one (those jobs are requeued there)", journal.path, self.cluster_id)
        self.joining: dict[str, ev.NodeJoined] = {}  # node id -> its join, made with its first NodeStatus
        self.nodes: dict[str, bytes] = {}  # node id -> identity of its connection
        self.idents: dict[bytes, str] = {}  # identity -> node id
        self.hosts: dict[str, str] = {}  # node id -> host (MASTER_ADDR)
        self.epochs: dict[str, int] = {}  # node id -> its current epoch
        self.specs: dict[str, NodeSpec] = {}  # node id -> what its hello said (a rebuilt core hears it again)
        self.gpus = NodeGpus()  # each node's GPU models and one speed per model, from the hellos
        self.speeds, self.gpu_models = self.gpus.speeds, self.gpus.models  # (the same dicts, read by name)
        self.heard: dict[str, float] = {}  # node id -> last message (scheduler clock)
        self.ports = PortPool()
        self.portless: dict[str, ev.StartWorkers] = {}  # committed placements waiting for a rendezvous port
        self.restop: dict[str, list[tuple[str, str, str]]] = {}  # node -> [(pid, job, reason)] after restore
        self.unavailable: str | None = None  # why the journal cannot be written; None while it can
        self.deferred: deque[tuple[str, NodeWrite]] = deque(maxlen=MAX_DEFERRED)  # node messages to replay
        self.lost_meanwhile: dict[str, tuple[str, float]] = {}  # node id -> (why, when its placements may be lost)
        # for nodes lost while the journal was down
        self._next_probe = 0.0
        self._outbox: Replies = []  # messages of a rebuild, sent before the reply
        self._failures_logged: set[tuple[str, str]] = set()
        self._foreign_seen: set[tuple[str, str]] = set()  # (node, placement) reports on workers not its own, said
        self.counts: Counter = Counter()  # messages received by type
        self.bad: Counter = Counter()  # errors replied by code
        self.decided: Counter = Counter()  # decisions by type
        self.faults: Counter[str] = Counter()  # core rebuilds by cause: "core" (an exception), "journal" (a write failed)
        self.latency: deque[float] = deque(maxlen=LATENCY_WINDOW)  # seconds, event in -> messages out
        self.latency_count, self.latency_sum = 0, 0.0
        self.gate, self.peer = Gate(), ANONYMOUS  # peer: the identity of the message being handled
        self.log_relay = LogRelay()
        self.progress = Progress()  # the latest progress (and features) nodes reported, per job
        self.learning = Learning(journal)  # history records at each end; the run-time model of the views
        # inside on_batch: the jobs submitted, for one cycle at its end
        self._submitted: list[ev.JobSubmitted] | None = None
        self._submit_logs: list[tuple] = []  # inside on_batch: the submits' log lines, written once committed
        node = self._node_message
        self._handlers: dict[type[P.Message], Handler] = {
            P.NodeHello: self._hello, P.NodeHeartbeat: self._heartbeat, P.NodeStatus: node,
            P.WorkerStarted: node, P.WorkerExited: node, P.StartRefused: node, P.Submit: self._submit,
            P.JobsRequest: self._jobs, P.NodesRequest: self._nodes, P.Cancel: self._cancel, P.LogsRequest: self._logs,
            P.LogTail: self._log_tail, P.RecommendRequest: self._recommend,
        }

    # ------------------------------------------------------------------ start-up
    def restore(self, now: float) -> None:
        """Rebuild the core from the journal (call once, before any message)."""
        self._commit(self._rebuild(now), now)
        records = self.journal.records()
        active = sum(1 for r in records if r.state not in TERMINAL)
        log.info("restored %d jobs (%d active) from %s", len(records), active, self.journal.path)

    # ------------------------------------------------------------------ entry points
    def on_message(self, ident: bytes, msg: P.Message, now: float,
                   peer: str | None = None) -> Replies:
        """``peer``: the sender's key name with CURVE (the ZAP user id), None without keys."""
        self.peer = peer_of(peer)
        handler = self._handlers.get(type(msg))
        self.counts[msg.TYPE] += 1
        if handler is None:
            return [self._error(ident, P.FORBIDDEN, f"{msg.TYPE} is not accepted by the scheduler")]
        try:
            out = handler(ident, msg, now)
        except _Refused as r:
            out = [self._error(ident, r.code, str(r))]
        except (CoreBroken, JournalLockLost):  # fatal: the server stops
            raise
        except JournalUnavailable as exc:  # a write no handler expected to fail
            self._journal_failed(exc, now)
            out = [] if isinstance(msg, NODE_MESSAGES) else [self._error(ident, P.UNAVAILABLE, str(
                self._unwritable("it may not have been done")))]
        except Exception as exc:  # a bug in handling it: memory may be half-updated, the journal is not
            self._failed(exc, msg.TYPE, now)
            out = [] if isinstance(msg, NODE_MESSAGES) else [self._error(
                ident, P.UNAVAILABLE, f"the scheduler failed on {msg.TYPE} and was rebuilt from its journal: "
                "nothing was done; try again")]
        return self._take_outbox() + out

    def on_batch(self, items: list[tuple[bytes, P.Message, str | None]], now: float) -> Replies:
        """``items`` (ident, msg, peer) handled as one journal transaction (group commit,
        ``cluster.server.batch``): what to send once this returns, i.e. after the commit."""
        return handle_batch(self, items, now)

    def tick(self, now: float) -> Replies:
        self.journal.check_lock()  # JournalLockLost: stop now, not at the next commit
        events: list = []
        limit = self.heartbeat_s * self.liveness
        for node_id, t in list(self.heard.items()):
            if now - t > limit:
                events.append(self._silent(node_id, t, now))
        if self.unavailable is not None:  # the core waits; the nodes lost meanwhile are lost to it on resuming
            self.lost_meanwhile.update((e.node_id, (e.reason, now + e.hold_s)) for e in events)
            out = self._resume(now) if now >= self._next_probe else []
            return self._take_outbox() + out + self.log_relay.expire(now)
        events.append(ev.Tick())
        try:
            out = self._decide(events, now) + self._retry_ports()
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
            out = []
        except _Refused:
            out = []
        except (CoreBroken, JournalLockLost):  # fatal: the server stops
            raise
        except Exception as exc:
            self._failed(exc, "tick", now)
            out = []
        return self._take_outbox() + out + self.log_relay.expire(now)

    # ------------------------------------------------------------------ nodes
    def _node_of(self, ident: bytes, msg: P.NodeHeartbeat | P.LogTail | NodeWrite,
                 now: float) -> tuple[str | None, Replies]:
        """The node a message comes from, or None and the Error reply to send instead (node id, [])."""
        node_id = self.idents.get(ident)
        if node_id is None:
            return None, [self._error(ident, P.UNKNOWN_NODE, f"node {msg.node_id} is not registered: say hello")]
        if node_id != msg.node_id:
            return None, [self._error(ident, P.FORBIDDEN, f"this connection is node {node_id}, not {msg.node_id}")]
        if msg.epoch < self.epochs.get(node_id, 0):
            return None, []  # a stale incarnation's message
        self.heard[node_id] = now
        return node_id, []

    def _hello(self, ident: bytes, m: P.NodeHello, now: float) -> Replies:
        held = self.nodes.get(m.node_id) not in (None, ident)  # by another connection
        why = self.gate.hello(self.peer, m.node_id, now - self.heard.get(m.node_id, now) if held else None,
                              self.heartbeat_s * self.liveness)
        if why:
            self.gate.refused(ident, why)
            return [self._error(ident, P.FORBIDDEN, why)]
        said = dict(m.topology)
        switch, rack = self.topology.get(m.node_id, (said.get("switch", ""), said.get("rack", "")))
        self.gpus.hello(m.node_id, m.gpus)
        models = self.gpus.models[m.node_id]
        spec = NodeSpec(m.node_id, gpus=len(m.gpus), gpu_model=node_model(models),
                        gpu_mem=min((g.mem_total for g in m.gpus), default=0), cpu_milli=m.cpu_milli,
                        mem_mib=m.mem_mib, switch=switch, rack=rack)
        old = self.nodes.get(m.node_id)
        if old is not None and old != ident:
            self.idents.pop(old, None)
        self.nodes[m.node_id], self.idents[ident] = ident, m.node_id
        self.hosts[m.node_id], self.epochs[m.node_id] = m.host or "127.0.0.1", m.epoch
        self.specs[m.node_id] = spec
        self.heard[m.node_id] = now
        log.info("node %s (epoch %d, %s) joined: %d GPU(s) %s%s", m.node_id, m.epoch, m.host, spec.gpus,
                 spec.gpu_model or shown_models(models),
                 f" (switch {switch or '-'}, rack {rack or '-'})" if switch or rack else "")
        welcome = (ident, P.NodeWelcome(node_id=m.node_id, scheduler_epoch=self.epoch, heartbeat_s=self.heartbeat_s,
                                        liveness=self.liveness, cluster_id=self.cluster_id, lease_s=self.lease_s))
        out: Replies = [welcome] + self._join_later(ev.NodeJoined(spec, m.epoch))
        for pid, job_id, reason in self.restop.pop(m.node_id, []):
            out.append((ident, P.StopPlacement(placement_id=pid, job_id=job_id, reason=reason)))
        return out

    def _heartbeat(self, ident: bytes, m: P.NodeHeartbeat, now: float) -> Replies:
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        return [(ident, P.NodeHeartbeat(node_id=node_id, epoch=self.epoch))]

    def _node_message(self, ident: bytes, m: NodeWrite, now: float) -> Replies:
        """NodeStatus, WorkerStarted, WorkerExited, StartRefused: applied now, or kept for later
        while the journal cannot be written."""
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        if self.unavailable is not None:
            self._defer(node_id, m)
            return []
        try:
            return self._apply(node_id, m, now)
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
            self._defer(node_id, m)
        except _Refused:
            pass  # logged by _failed; the node's next report tells the core again
        return []

    def _silent(self, node_id: str, heard: float, now: float) -> ev.NodeLost:
        """Node ``node_id``, last heard at ``heard``, is down; its placements are lost once its lease and the
        stop grace have run out (``replace_after_s``), unless it comes back before."""
        hold = max(0.0, heard + replace_after_s(self.lease_s) - now)
        log.warning("node %s missed %d heartbeats (silent %.1f s): down; its placements are lost in %.1f s unless it "
                    "returns", node_id, self.liveness, now - heard, hold)
        self._forget(node_id)
        self.joining.pop(node_id, None)
        return ev.NodeLost(node_id, f"silent for {now - heard:.1f} s", hold)

    def _join_later(self, joined: ev.NodeJoined) -> Replies:
        """A node joins the core with its first report (``_status``): reconciled before any new work."""
        self.joining[joined.spec.node_id] = joined
        return []

    def _forget(self, node_id: str) -> None:
        ident = self.nodes.pop(node_id, None)
        if ident is not None:
            self.idents.pop(ident, None)
        self.heard.pop(node_id, None)

    # ------------------------------------------------------------------ clients
    def _log_tail(self, ident: bytes, m: P.LogTail, now: float) -> Replies:
        node_id, err = self._node_of(ident, m, now)
        if node_id is None:
            return err
        return self.log_relay.answer(node_id, m)

    # ------------------------------------------------------------------ decisions
    def _decide(self, events: list, now: float) -> Replies:
        """The core's decisions on ``events``, committed, as messages. If the core raises, it is rebuilt
        from the journal and the events applied again without a cycle; if that raises too, ``_Refused``."""
        try:
            decisions = self.core.handle_batch(events, now)
        except Exception as exc:
            what = ", ".join(dict.fromkeys(type(e).__name__ for e in events))
            self._failed(exc, what, now)
            try:
                decisions = self.core.handle_batch(events, now, schedule=False)
            except Exception as again:
                self._failed(again, what, now)
                raise _Refused(P.UNAVAILABLE, f"the scheduler's policy failed on this request "
                               f"({type(again).__name__}) and was rebuilt from its journal: nothing was done") from None
        return self._commit(decisions, now)

    def _journal_decision(self, d: ev.Decision, now: float) -> list:
        """Write what decision ``d`` changes of its job's row (inside the caller's transaction); the history
        records a job's end makes."""
        if isinstance(d, ev.JobChanged):
            return self._journal_change(d, now)
        if isinstance(d, ev.StartWorkers):
            job = self.core.job(d.spec.job_id)
            assert job is not None, d.spec.job_id  # the core has just placed it
            self.journal.set_placement(d.spec.job_id, d.placement, job.attempt, job.failed_starts)
        elif isinstance(d, ev.Promote):
            job = self.core.job(d.job_id)
            if job is not None and job.placement is not None:
                self.journal.promote_placement(d.job_id, job.placement)
        return []

    def _commit(self, decisions: list[ev.Decision], now: float) -> Replies:
        """Take the ports of new placements, journal the decisions (one transaction; on failure the
        ports are given back and ``JournalUnavailable`` raised), then the messages they cause."""
        starts = [d for d in decisions if isinstance(d, ev.StartWorkers)]
        taken = {d.placement.placement_id: self.ports.take(d.placement.placement_id,
                                                            master_host(d.placement, self.hosts)) for d in starts}
        try:
            drop, add = self._stopping_changes()
            records: list = []
            if decisions or drop or add:
                with self.journal.transaction():
                    for d in decisions:
                        records += self._journal_decision(d, now)
                    for pid in drop:
                        self.journal.drop_stopping(pid)
                    for pid, job_id, nodes, reason in add:
                        self.journal.add_stopping(pid, job_id, nodes, reason)
        except JournalUnavailable:
            for pid in taken:
                self.ports.release(pid)
            raise
        out: Replies = []
        for d in decisions:
            self.decided[type(d).__name__] += 1
            match d:
                case ev.StartWorkers():
                    pid = d.placement.placement_id
                    port = taken[pid]
                    if port is None:
                        log.warning("placement %s waits for a free rendezvous port on %s", pid,
                                    master_host(d.placement, self.hosts))
                        self.portless[pid] = d
                    else:
                        out += self._start(d, port)
                case ev.StopWorkers():
                    self._release(d.placement_id)
                    out += [(self.nodes[n], P.StopPlacement(placement_id=d.placement_id, job_id=d.job_id,
                                                            reason=d.reason)) for n in d.nodes if n in self.nodes]
                case ev.Promote():
                    out += [(self.nodes[n], P.PromotePlacement(placement_id=d.placement_id, job_id=d.job_id))
                            for n in d.nodes if n in self.nodes]
                case ev.JobChanged():
                    self.learning.changed(d, self.core, now)
                    if d.state in TERMINAL and d.placement_id:
                        self._release(d.placement_id)
                case _:
                    assert_never(d)
        for rec in records:
            self.learning.ended(rec)
        if any(isinstance(d, ev.JobChanged) and d.state == ev.PENDING for d in decisions):
            self._release_abandoned()
        return out

    def _journal_change(self, d: ev.JobChanged, now: float) -> list:
        """Journal a job's change (inside the caller's transaction), with the history record of the run it ends."""
        rec = self.learning.record(d, self.core, self.progress.of(d.job_id, True), now, self.gpu_models, self.speeds)
        self.journal.set_state(d.job_id, d.state, d.reason, now)
        if d.spec is not None:
            self.journal.set_spec(d.spec)
        if rec is None:
            return []
        self.journal.add_history(rec, oom_restart=d.state == ev.PENDING)  # what the run taught, with its end
        return [rec]

    def _release_abandoned(self) -> None:
        """Give back the ports of placements a requeued job left without a stop (a refused start: no worker
        ran, so no ``StopWorkers``); a stopping placement keeps its port until its workers are gone."""
        core = self.core
        for pid in list(self.ports.held):
            job = core.holders.get(pid)
            if pid in core.stopping or (job is not None and job.placement_id == pid
                                        and job.state in (ev.PLACING, ev.RUNNING)):
                continue
            self._release(pid)

    def _stopping_changes(self) -> tuple[list[str], list[tuple[str, str, tuple[str, ...], str]]]:
        """What the journal's stopping table lacks and holds beyond the core's stopping placements."""
        live = self.core.stopping
        known = {pid for pid, *_ in self.journal.stopping()}
        add = [(pid, s.job.job_id, s.placement.nodes(), s.reason) for pid, s in live.items() if pid not in known]
        return [pid for pid in known if pid not in live], add

    def _release(self, placement_id: str) -> None:
        self.ports.release(placement_id)
        self.portless.pop(placement_id, None)

    def _retry_ports(self) -> Replies:
        out: Replies = []
        for pid, d in list(self.portless.items()):
            if pid not in self.core.placing:  # stopped, requeued or failed meanwhile
                del self.portless[pid]
                continue
            port = self.ports.take(pid, master_host(d.placement, self.hosts))
            if port is not None:
                del self.portless[pid]
                out += self._start(d, port)
        return out

    def _start(self, d: ev.StartWorkers, port: int) -> Replies:
        row = self.journal.job(d.spec.job_id)
        assert row is not None, d.spec.job_id  # journaled with the placement (_commit) before it starts
        wire = json.loads(row["request"])
        for key in ("name", "user", "queue"):  # a journal written before control characters were refused
            if isinstance(wire.get(key), str):
                wire[key] = P.printable(wire[key])
        for key in ("iterations", "epochs"):  # a journal written before the total's hints
            wire.setdefault(key, None)
        advice = json.loads(row["advice"]) if row.get("advice") else {}
        if advice.get("gpu_mem") and d.spec.guaranteed:  # its recommended cap, or its fallback after running out
            wire["gpu_mem"] = d.spec.gpu_mem
        submit = P.from_wire({"v": P.PROTOCOL_VERSION, "t": "submit", "request": wire, "request_id": ""})
        assert isinstance(submit, P.Submit)  # "t": "submit"
        msgs = start_messages(d.spec, d.placement, submit.request, self.hosts, port)
        start_mem, start_share = int(advice.get("start_mem") or 0), float(advice.get("start_share") or 0.0)
        recommended = d.spec.mem_fallback is not None and d.spec.gpu_mem > 0
        out: Replies = []
        for node_id, msg in msgs.items():
            if node_id in self.nodes:
                out.append((self.nodes[node_id], dataclasses.replace(
                    msg, cluster_id=self.cluster_id, start_mem=start_mem, start_share=start_share,
                    cap_recommended=recommended)))
            else:  # the node went away between the cycle and now: its NodeLost will requeue the job
                log.warning("placement %s: node %s is not connected", d.placement.placement_id, node_id)
        return out

    def _take_outbox(self) -> Replies:
        out, self._outbox = self._outbox, []
        return out

    def _error(self, ident: bytes, code: P.ErrorCode, message: str) -> tuple[bytes, P.Message]:
        self.bad[code] += 1
        return ident, P.Error(code=code, message=message[:P.MAX_TEXT_CHARS], job_id=None)
