"""The scheduler's ZeroMQ edge: one ROUTER for nodes and clients, the clock, decoding, sending.

Every frame is decoded by ``colocate.protocol``; anything malformed, of another version, of an
unknown type, or a message only the scheduler sends, is answered with ``Error`` and logged (at most
``MAX_BAD_LOGS_PER_S`` lines a second), and the daemon carries on. A frame over
``P.MAX_FRAME_BYTES`` (a message's limit plus what CURVE adds) is refused by the socket itself (``ZMQ_MAXMSGSIZE``: libzmq drops the
connection when it reads the frame's header), so it never takes the scheduler's memory. With CURVE
(``keys``), a peer whose public key is not admitted never gets past the handshake: nothing of it
reaches this loop; every message that does reaches the service with its peer's identity (the ZAP
user id, the name of its key: ``node-gpu7``, ``user-alice``, ``operator-bob``). Without keys
(``--insecure``, loopback only) there is no identity (None). Peers refused at the handshake are
logged by ``HandshakeWatch``.

The service never raises but for ``CoreBroken`` (its core failed and cannot be rebuilt from the
journal) and ``JournalLockLost`` (the state file's lock file was removed or replaced, so another scheduler may
hold the file: ``cluster.server.journal``): the loop then stops and ``exit_code`` is 1.

The loop: poll the socket until the next tick (``TICK_S``), handle the waiting frames (at most
``MAX_DRAIN``) in batches of ``cluster.server.batch.MAX_BATCH``, each one journal transaction whose
replies are sent after its commit (group commit), then tick the service (liveness, the core's Tick). The service is called under ``lock`` so the metrics thread
never reads half an update.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

import zmq

from cluster.server.batch import MAX_BATCH
from cluster.server.faults import Replies
from cluster.server.handshakes import HandshakeWatch
from cluster.server.journal import JournalLockLost
from cluster.server.service import CoreBroken, SchedulerService
from colocate import protocol as P
from colocate.base import keys as K
from colocate.base.serving import LogLimit

log = logging.getLogger("colocate.scheduler")

FREEZE_EVERY = 10_000  # submits after which the survivors (the jobs' records) are frozen out of the collector's reach
MAX_DRAIN = 1024  # messages handled between two ticks at most
TICK_S = 0.1  # liveness checks: a silent node is down at most this long after its 3rd missed heartbeat
MAX_BAD_LOGS_PER_S = 20


class SchedulerServer:
    def __init__(self, service: SchedulerService, bind: str, keys_dir: str | None = None,
                 clock: Callable[[], float] = time.time):
        K.require_keys(bind, keys_dir)
        self.service = service
        self.bind = bind
        self.clock = clock
        self.lock = threading.Lock()
        self.exit_code = 0
        self._stop = threading.Event()
        self._bad_logs = LogLimit(MAX_BAD_LOGS_PER_S)
        self._submits_unfrozen = 0
        self.ctx = zmq.Context()
        self.auth = K.start_authenticator(self.ctx, keys_dir) if keys_dir else None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting node may reuse its identity
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone peer raises, it is not dropped silently
        self.sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME_BYTES)  # a bigger frame drops its sender, unread
        self.handshakes = None
        if keys_dir:
            K.serve(self.sock, keys_dir)
            self.handshakes = HandshakeWatch(self.sock, time.monotonic)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError:
            self.close()
            raise

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.handshakes is not None:
            poller.register(self.handshakes.monitor, zmq.POLLIN)
        next_tick = time.monotonic()
        log.info("scheduler epoch %d listening on %s%s", self.service.epoch, self.bind,
                 " (CURVE)" if self.auth else "")
        try:
            self._loop(poller, next_tick)
        except CoreBroken as exc:
            log.critical("%s: stopping (exit 1) for a supervisor to start it again", exc)
            self.exit_code = 1
        except JournalLockLost as exc:
            log.critical("%s: stopping (exit 1), with nothing more committed or sent", exc)
            self.exit_code = 1
        finally:
            self.close()

    def _loop(self, poller: zmq.Poller, next_tick: float) -> None:
        while not self._stop.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            ready = dict(poller.poll(timeout=int(timeout * 1000) + 1))
            if self.sock in ready:
                self._drain()
            if self.handshakes is not None and self.handshakes.monitor in ready:
                self.handshakes.drain()
            if time.monotonic() >= next_tick:
                with self.lock:
                    out = self.service.tick(self.clock())
                self._send(out)
                next_tick = time.monotonic() + TICK_S

    def close(self) -> None:
        if self.handshakes is not None:
            self.sock.disable_monitor()
            self.handshakes.close()
            self.handshakes = None
        self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        self.ctx.term()

    def _drain(self) -> None:
        """Handle what waits on the socket, ``MAX_BATCH`` messages per journal transaction (group commit:
        the replies go out after the commit); bounded, so ticks still run under a flood."""
        for _ in range(MAX_DRAIN // MAX_BATCH):
            items, more = self._receive(MAX_BATCH)
            if items:
                t0 = time.perf_counter()
                with self.lock:
                    out = self.service.on_batch(items, self.clock())
                self._send(out)
                if any(not isinstance(m, (P.NodeHeartbeat, P.Error)) for _, m in out):
                    self._latency(time.perf_counter() - t0)
                self._freeze_after(sum(isinstance(m, P.Submit) for _, m, _ in items))
            if not more:
                return

    def _freeze_after(self, submits: int) -> None:
        """After ``FREEZE_EVERY`` submits: collect the young generations and freeze the survivors, so full
        collections never walk the jobs' records (``cluster.server.startup.settle_memory``)."""
        self._submits_unfrozen += submits
        if self._submits_unfrozen >= FREEZE_EVERY:
            self._submits_unfrozen = 0
            gc.collect(1)
            gc.freeze()

    def _receive(self, limit: int) -> tuple[list, bool]:
        """Up to ``limit`` decoded messages waiting (bad frames answered at once), and whether more may wait."""
        items: list = []
        while len(items) < limit:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return items, False
            if len(frames) != 2:
                self._bad(frames[0].bytes, P.ProtocolError(P.MALFORMED, f"expected 1 frame, got {len(frames) - 1}"))
                continue
            ident, data, peer = frames[0].bytes, frames[1].bytes, self._peer(frames[1])
            if peer == "":  # its key was removed or replaced since the handshake: the connection is refused
                self._bad(ident, P.ProtocolError(P.FORBIDDEN, "this connection's key is no longer admitted: "
                                                 "connect again with an admitted key"))
                continue
            try:
                items.append((ident, P.decode(data), peer))
            except P.ProtocolError as exc:
                self._bad(ident, exc)
        return items, True

    def _peer(self, frame: zmq.Frame) -> str | None:
        """The sender's key name with CURVE (its ZAP user id, while that key is still admitted under that
        name; "" once it was removed or replaced); None without keys."""
        if self.auth is None:
            return None
        try:
            return self.auth.admitted.current(frame.get("User-Id") or "") or ""
        except zmq.ZMQError:
            return ""

    def _latency(self, seconds: float) -> None:
        s = self.service
        with self.lock:
            s.latency.append(seconds)
            s.latency_count += 1
            s.latency_sum += seconds

    def _send(self, out: Replies) -> None:
        for ident, msg in out:
            try:
                data = P.encode(msg)
            except P.ProtocolError as exc:  # a reply over the size limit: the peer hears why, in one line
                log.warning("could not send %s: %s", msg.TYPE, exc)
                data = P.encode(P.Error(code=exc.code, message=f"the reply ({msg.TYPE}) is too large: {exc}",
                                        job_id=None))
            try:
                self.sock.send_multipart([ident, data], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the peer is gone (ROUTER_MANDATORY) or its queue is full
                log.warning("could not send %s: %s", msg.TYPE, exc)

    def _bad(self, ident: bytes, exc: P.ProtocolError) -> None:
        with self.lock:
            self.service.bad[exc.code] += 1
        if self._bad_logs.allow(time.monotonic()):
            log.warning("bad message (%s): %s", exc.code, exc)
        self._send([(ident, exc.to_error())])
