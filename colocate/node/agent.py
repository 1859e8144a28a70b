"""The node's link to the global scheduler (zguide Paranoid Pirate over one DEALER).

``SchedulerAgent`` lives inside the node's single poll loop (``NodeServer``): the loop polls
``agent.sock`` with its own sockets, calls ``agent.on_readable()`` when it has input and
``agent.tick()`` every loop tick. Nothing here blocks: sends are non-blocking, a reconnect is
scheduled for later rather than slept for, and worker processes are started by ``WorkerManager``
without waiting.

Behaviour:
  * connect (a CURVE client with ``colocate.base.keys.connect`` when a key folder is given; the node's
    certificate is ``DIR/node-NODE_ID.key_secret``, ``colocate.base.keys.node_cert``) and say
    ``NodeHello`` with this node incarnation's epoch, its host (MASTER_ADDR for others) and GPUs;
    a hello not welcomed (refused: another live connection holds the node id) is said again every
    ``heartbeat_s * liveness``;
  * ``NodeWelcome`` gives ``heartbeat_s`` and ``liveness``; from then on a ``NodeHeartbeat`` goes out
    every ``heartbeat_s`` (the scheduler echoes it) and a full ``NodeStatus`` every ``status_every_s``
    and at once on a change (GPU utilization over the last 10 s and memory in use, every worker, and the
    progress of every worker registered with the node: ``colocate.node.progress``; a worker's features ride
    on the first status after the node learned them and on the first after each welcome);
  * any message from the scheduler is proof of life; silence for ``heartbeat_s * liveness`` (before
    the first welcome: the defaults 1 s x 3) drops the socket and reconnects after a backoff that
    doubles from ``backoff_min_s`` to ``backoff_max_s`` (reset by a welcome), then says hello again;
  * ``Error(code="unknown_node")`` (the scheduler restarted or forgot this node): hello again, and a
    full ``NodeStatus`` right after the welcome;
  * ``StartPlacement``/``StopPlacement``/``PromotePlacement`` go to the ``WorkerManager``; its events
    (``WorkerStarted``, ``WorkerExited``, ``StartRefused``) are sent as they happen. Events produced
    while not welcomed, and those sent since the scheduler was last heard from when the link is
    dropped, are (re)sent after the next welcome: the scheduler may see one twice;
  * promotion is the node core's (``colocate.node.core``): ``PromotePlacement`` goes to the worker manager, whose
    core changes the job's workers' limits at once;
  * fencing: ``NodeWelcome.lease_s`` > 0 makes each answered hello or heartbeat renew the lease file
    (``colocate.base.lease``) until the time the node SENT it plus ``lease_s``; the placed workers' launchers stop
    them when it lapses, and the worker manager is told (``fence``) so their exits are reported ``fenced``. The
    file names this incarnation's epoch and those of the workers it holds: at start it is rewritten so (the
    launchers of any other incarnation stop), and a node whose table was lost or unreadable connects only once
    that revoked lease has run out (``colocate.node.fencing`` killed the orphans it could see). A state folder
    deleted under the node is made again when the lease is renewed; a renewal that fails is logged once;
  * ``NodeWelcome.cluster_id`` scopes placement ids: placements of another cluster are stopped, and events
    of another cluster are never sent;
  * bad input never stops the node: an undecodable message is logged and answered with ``Error``
    (its code), a valid message the node does not take (a client request) with ``Error(forbidden)``,
    a ``NodeWelcome`` for another node id is logged and ignored;
  * ``LogTailRequest`` is answered from the node's own log folder, for the welcoming scheduler's cluster only
    (``colocate.node.logs``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque

import psutil
import zmq

from colocate import protocol as P
from colocate.base.endpoints import FENCE_GRACE_S
from colocate.base.lease import lease_clock, read_lease, write_lease
from colocate.base.serving import LogLimit
from colocate.base.vocab import DeviceKind
from colocate.node import logs as node_logs
from colocate.node.workers import WorkerManager

log = logging.getLogger("colocate.node.agent")

DEFAULT_HEARTBEAT_S = 1.0
DEFAULT_LIVENESS = 3
MAX_PENDING = 10000
MAX_BAD_LOGS_PER_S = 20
FOREVER_S = 10 * 365 * 86400.0  # the lease written when the scheduler gives none


class SchedulerAgent:
    def __init__(self, endpoint: str, node_id: str, epoch: int, host: str, gpus, workers: WorkerManager,  # noqa: PLR0913 (the edge's collaborators and timers, injected)
                 gpu_status, keys_dir: str | None = None, context: zmq.Context | None = None,
                 clock=time.monotonic, wall=time.time, backoff_min_s: float = 0.25, backoff_max_s: float = 30.0,
                 status_every_s: float = 1.0, log_dir: str | None = None, topology: tuple = ()):
        """``gpus``: the node's ``GpuSpec`` list; ``gpu_status(now) -> [GpuStatus]``; ``topology``: the network
        labels its hello carries (``colocate.protocol.parse_topology``)."""
        self.topology = tuple(topology)
        self.endpoint, self.node_id, self.epoch, self.host = endpoint, node_id, epoch, host
        self.gpus, self.workers, self.gpu_status = list(gpus), workers, gpu_status
        self.keys_dir, self.log_dir = keys_dir, log_dir
        self.ctx = context or zmq.Context.instance()
        self.clock, self.wall = clock, wall
        self.backoff_min_s, self.backoff_max_s, self.status_every_s = backoff_min_s, backoff_max_s, status_every_s
        self.backoff_s = backoff_min_s
        self.heartbeat_s, self.liveness = DEFAULT_HEARTBEAT_S, DEFAULT_LIVENESS
        self.sock = None
        self.welcomed = False
        self.scheduler_epoch: int | None = None
        self.connects = self.welcomes = 0
        self.pending: deque = deque(maxlen=MAX_PENDING)  # (cluster, event) to send after the next welcome
        self._since_heard: list = []  # (cluster, event) sent since the scheduler was last heard from
        self.cluster_id: str | None = None  # the welcoming scheduler's cluster
        self.lease_s = 0.0
        self.lease_file = workers.cfg.lease_file
        lease = read_lease(self.lease_file) if self.lease_file else None
        self.lease_until = lease.until if lease else 0.0  # on lease_clock()
        self._asks: deque = deque(maxlen=1000)  # lease_clock() when each unanswered hello/heartbeat was sent
        self._lapsed: bool | None = None
        self._reconnect_at = 0.0
        self._last_heard = self._last_beat = self._last_status = self._hello_at = 0.0
        self._dirty = True
        self._refusal = ""  # the last refusal of a hello, logged once
        self._bad_logs = LogLimit(MAX_BAD_LOGS_PER_S)
        self._lease_error = ""  # the last failure to write the lease, logged once
        self._features_told: dict[str, int] = {}  # worker id -> features_seq sent since the last welcome
        self._check_keys()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Recover the worker table (its events wait for the welcome; orphans of this folder are killed), write
        this incarnation's epoch into the lease (launchers of incarnations it does not hold stop) and connect;
        after a lost or unreadable table, only once that lease has been waited out."""
        self._check_lease()  # first: a worker found dead while the lease had lapsed is reported fenced
        self._queue(self.workers.recover())  # the node core is new: the table's promotions hold again
        revoked = self._publish_lease()
        wait_s = self._lost_table_wait(revoked)
        if wait_s > 0:
            log.warning("the worker table was lost or unreadable: waiting out the last incarnation's lease "
                        "(%.1f s) before taking work", wait_s)
            self._reconnect_at = self.clock() + wait_s  # tick() connects then
            return
        self._connect(self.clock())

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        self.workers.close()

    def _check_keys(self) -> None:
        if self.keys_dir:
            from colocate.base import keys as K

            probe = self.ctx.socket(zmq.DEALER)
            try:
                K.connect(probe, self.keys_dir, self._key_name())  # raises KeyError_ (a ValueError) now, not later
            finally:
                probe.close(linger=0)

    def _key_name(self) -> str:
        from colocate.base import keys as K

        assert self.keys_dir is not None  # called only with a key folder
        return K.node_cert(self.keys_dir, self.node_id)

    def _connect(self, now: float) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME_BYTES)  # a bigger frame drops the link, unread
        if self.keys_dir:
            from colocate.base import keys as K

            K.connect(sock, self.keys_dir, self._key_name())
        sock.connect(self.endpoint)
        self.sock, self.connects = sock, self.connects + 1
        self._last_heard = now
        self._asks.clear()
        self._hello()

    def _hello(self) -> None:
        self.welcomed, self._hello_at = False, self.clock()
        gpus = tuple(P.NodeGpu(index=g.index, model=(g.name or g.kind)[: P.MAX_ID_CHARS], mem_total=g.mem_total,
                               speed=g.speed if g.kind == DeviceKind.SIM else 0.0)
                     for g in self.gpus)  # a simulated GPU declares its speed (the scheduler recommends types by it)
        self._asks.append(lease_clock())
        self._send(P.NodeHello(node_id=self.node_id, epoch=self.epoch, host=self.host, gpus=gpus,
                               cpu_milli=(os.cpu_count() or 1) * 1000, mem_mib=psutil.virtual_memory().total >> 20,
                               topology=self.topology))
        log.info("hello to the scheduler at %s as node %s (epoch %d)", self.endpoint, self.node_id, self.epoch)

    def _drop(self, now: float, why: str) -> None:
        log.warning("scheduler link: %s; reconnecting in %.2f s", why, self.backoff_s)
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock, self.welcomed = None, False
        self.pending.extendleft(reversed(self._since_heard))  # possibly lost with the socket
        self._since_heard = []
        self._reconnect_at = now + self.backoff_s
        self.backoff_s = min(self.backoff_max_s, self.backoff_s * 2)

    # ------------------------------------------------------------------ loop entry points
    def tick(self) -> None:
        now = self.clock()
        if self.sock is None and now >= self._reconnect_at:
            self._connect(now)
        self._check_lease()
        if self.welcomed and getattr(self.workers, "left_with_progress", lambda: False)():
            # a worker said goodbye: its last progress goes out before its exit is reaped and reported, so the
            # scheduler records what the job did to its end (its history), not what a status a second before said
            self.send_status(now)
        self._queue(self.workers.poll(self.wall()))
        if self.sock is None:
            return
        if now - self._last_heard > self.heartbeat_s * self.liveness:
            self._drop(now, f"no word from {self.endpoint} for {now - self._last_heard:.1f} s")
            return
        if not self.welcomed:
            if now - self._hello_at >= self.heartbeat_s * self.liveness:
                self._hello()
            return
        if now - self._last_beat >= self.heartbeat_s:
            self._asks.append(lease_clock())
            self._send(P.NodeHeartbeat(node_id=self.node_id, epoch=self.epoch))
            self._last_beat = now
        if self._dirty or now - self._last_status >= self.status_every_s:
            self.send_status(now)

    def on_readable(self) -> None:
        for _ in range(1000):  # bounded: the job endpoint gets its turn under a flood
            if self.sock is None:
                return
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_heard = self.clock()
            self._since_heard = []
            if len(frames) != 1:
                self._bad(P.ProtocolError(P.MALFORMED, f"expected 1 frame, got {len(frames)}"))
                continue
            try:
                msg = P.decode(frames[0])
            except P.ProtocolError as exc:
                self._bad(exc)
                continue
            try:
                self._handle(msg)
            except Exception:  # a bug must not take the node down: log it and go on
                log.exception("scheduler link: handling %s failed", msg.TYPE)

    def send_status(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        workers = tuple(self.workers.status())[: P.MAX_LIST_ITEMS]
        progress = getattr(self.workers, "progress", None)
        told = self._features_told
        shown = tuple(progress(told))[: P.MAX_LIST_ITEMS] if progress is not None else ()
        self._send(P.NodeStatus(node_id=self.node_id, epoch=self.epoch, gpus=tuple(self.gpu_status(now)),
                                workers=workers, progress=shown))
        self._last_status, self._dirty = now, False

    # ------------------------------------------------------------------ messages
    def _handle(self, msg) -> None:
        if isinstance(msg, P.NodeWelcome):
            if msg.node_id != self.node_id:
                log.warning("scheduler welcomed node %r, but this is node %r: ignored", msg.node_id, self.node_id)
                return
            if self.scheduler_epoch is not None and msg.scheduler_epoch != self.scheduler_epoch:
                log.info("the scheduler restarted (epoch %d -> %d)", self.scheduler_epoch, msg.scheduler_epoch)
            self.scheduler_epoch = msg.scheduler_epoch
            self.heartbeat_s, self.liveness, self.lease_s = msg.heartbeat_s, msg.liveness, msg.lease_s
            self.welcomed, self.welcomes, self.backoff_s = True, self.welcomes + 1, self.backoff_min_s
            self._refusal = ""
            log.info("welcomed by the scheduler (epoch %d, cluster %s): heartbeat %.2f s, liveness %d, lease %.1f s",
                     msg.scheduler_epoch, msg.cluster_id or "unnamed", msg.heartbeat_s, msg.liveness, msg.lease_s)
            self._renew(self._asks[0] if self._asks else None)
            self._asks.clear()
            if self.cluster_id is not None and msg.cluster_id != self.cluster_id:
                log.warning("the scheduler's cluster changed (%s -> %s): this node's events of the old one are "
                            "dropped", self.cluster_id or "unnamed", msg.cluster_id or "unnamed")
            self.cluster_id = msg.cluster_id
            self.pending = deque(((c, e) for c, e in self.pending if c is None or c == msg.cluster_id),
                                 maxlen=MAX_PENDING)
            self.pending.extend((msg.cluster_id, e) for e in self.workers.welcomed(msg.cluster_id))
            while self.pending:
                self._send(self.pending.popleft()[1])
            self._last_beat = self.clock()
            self._features_told.clear()  # the scheduler may have forgotten them: they ride on this status again
            self.send_status()
        elif isinstance(msg, P.NodeHeartbeat):  # the echo: proof of life (counted), and the lease renewed
            if self.welcomed:
                self._renew(self._asks.popleft() if self._asks else None)
        elif isinstance(msg, (P.StartPlacement, P.StopPlacement, P.PromotePlacement, P.PlacementsSettled)):
            self._placement_message(msg)
        elif isinstance(msg, P.LogTailRequest):
            log_of = getattr(self.workers, "log_of", None)  # the worker table's paths (a fake may have none)
            known = log_of(msg.job_id, msg.rank, self.cluster_id) if log_of and self.cluster_id is not None else None
            self._send(node_logs.answer(msg, self.node_id, self.epoch, self.log_dir, self.cluster_id, known))
        elif isinstance(msg, P.Error):
            if msg.code == P.UNKNOWN_NODE:
                # a restarted scheduler answers each message this node sent before its hello reached it: one hello
                # again, and another only once a pending one is a heartbeat period old (it may be lost)
                if self.welcomed or self.clock() - self._hello_at >= self.heartbeat_s:
                    log.warning("the scheduler does not know this node (%s): hello again", msg.message)
                    self._hello()
            elif not self.welcomed and msg.code == P.FORBIDDEN:  # a refused hello: logged once, said again later
                if msg.message != self._refusal:
                    log.warning("the scheduler refused this node: %s (hello again every %.1f s)", msg.message,
                                self.heartbeat_s * self.liveness)
                self._refusal = msg.message
            else:
                log.warning("scheduler error (%s): %s", msg.code, msg.message)
        else:
            self._bad(P.ProtocolError(P.FORBIDDEN, f"{msg.TYPE} is not accepted by a node"))

    def _placement_message(self, msg: P.StartPlacement | P.StopPlacement | P.PromotePlacement
                           | P.PlacementsSettled) -> None:
        """The scheduler's word about its placements, carried out by the worker manager."""
        if isinstance(msg, P.StartPlacement):
            if not self.welcomed or msg.cluster_id != self.cluster_id:
                log.warning("start of placement %s for cluster %s ignored: this node is welcomed by %s",
                            msg.placement_id, msg.cluster_id or "unnamed", self.cluster_id or "none")
                return
            self._queue(self.workers.start(msg))
        elif isinstance(msg, P.StopPlacement):
            log.info("stop placement %s of job %s (%s), grace %.1f s", msg.placement_id, msg.job_id,
                     msg.reason or "no reason given", msg.grace_s)
            self._queue(self.workers.stop(msg.placement_id, msg.grace_s, msg.job_id, self.cluster_id or ""))
            self._dirty = True
        elif isinstance(msg, P.PromotePlacement):
            if self.workers.promote(msg.placement_id, self.cluster_id or "") is not None:
                self._dirty = True
        elif isinstance(msg, P.PlacementsSettled):
            if self.welcomed and self.workers.settled(msg.placement_ids, self.cluster_id or ""):
                self._dirty = True

    def _queue(self, events) -> None:
        for event in events:
            if self.welcomed:
                self._send(event)
            else:
                self.pending.append((self.cluster_id, event))
            self._dirty = True

    # ------------------------------------------------------------------ the lease
    def _renew(self, sent_at: float | None) -> None:
        """An answer to what the node sent at ``sent_at`` (lease_clock): the lease runs to ``sent_at + lease_s``
        (without a lease from the scheduler: for good)."""
        if not self.lease_file or sent_at is None:
            return
        until = sent_at + self.lease_s if self.lease_s > 0 else lease_clock() + FOREVER_S
        if until <= self.lease_until:
            return
        if not self._write_lease(until):
            return
        self.lease_until = until
        self._check_lease()

    def _write_lease(self, until: float) -> bool:
        """Write the lease file (this epoch, and those of the workers the node holds); a state folder deleted under
        the node is made again first. A failure is logged once until it changes or ends (a lease that cannot be
        renewed lapses: safe)."""
        assert self.lease_file
        try:
            try:
                write_lease(self.lease_file, until, FENCE_GRACE_S, self.epoch, self.workers.epochs())
            except FileNotFoundError:
                if not self.workers.table.restore():
                    raise
                self.workers.table.save()
                write_lease(self.lease_file, until, FENCE_GRACE_S, self.epoch, self.workers.epochs())
        except OSError as exc:
            why = exc.strerror or str(exc)
            if why != self._lease_error:
                log.error("cannot renew the lease %s: %s (said once; the placed workers stop when it lapses)",
                          self.lease_file, why)
            self._lease_error = why
            return False
        if self._lease_error:
            log.info("the lease %s is renewed again", self.lease_file)
        self._lease_error = ""
        return True

    def _publish_lease(self) -> bool:
        """At start: the last incarnation's lease, rewritten with this incarnation's epoch and those of the workers
        it re-adopted (the launchers of any other epoch stop within a lease check); True when written. Nothing to
        write when there is no lease yet."""
        if not self.lease_file or not os.path.exists(self.lease_file):
            return False
        return self._write_lease(self.lease_until)

    def _lost_table_wait(self, revoked: bool) -> float:
        """Seconds to wait before taking work after the table was lost: until the workers it held are fenced. The
        last lease ends for them when ``revoked`` (this epoch is in the file: they stop within a lease check and
        the grace), else at its ``until``; 0 when nothing was lost or the lease already ended."""
        from colocate.base.endpoints import LEASE_CHECK_S

        if not self.lease_file or not getattr(self.workers.table, "lost", False):
            return 0.0
        now = lease_clock()
        if not revoked and self.lease_until - now > FOREVER_S / 2:
            return 0.0  # a lease "for good" (a scheduler without leases): no fencing to wait out
        ends = min(self.lease_until, now) if revoked else self.lease_until
        return max(0.0, ends + FENCE_GRACE_S + 2 * LEASE_CHECK_S - now)

    def _check_lease(self) -> None:
        if not self.lease_file:
            return
        lapsed = lease_clock() > self.lease_until
        if lapsed != self._lapsed:
            self._lapsed = lapsed
            self._queue(self.workers.fence(lapsed))

    def _send(self, msg) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send(P.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("scheduler link: send queue full, dropped %s", msg.TYPE)
            return
        if isinstance(msg, (P.WorkerStarted, P.WorkerExited, P.StartRefused)):
            self._since_heard.append((self.cluster_id, msg))

    def _bad(self, exc: P.ProtocolError) -> None:
        if self._bad_logs.allow(self.clock()):
            log.warning("bad message from the scheduler (%s): %s", exc.code, exc)
        self._send(exc.to_error())
