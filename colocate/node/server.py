"""The node coordinator's ZeroMQ edge: sockets, clock, liveness, logging, recording.

Two ROUTER sockets: the job endpoint (``ipc://``; jobs' DEALER links) and the
operator endpoint (``colocate ctl`` / ``colocate top``). Every frame is decoded
by ``colocate.protocol``; anything malformed, of another version, of a type not
accepted on that socket, or claiming another connection's job is answered with
``Error`` and logged, and the daemon carries on. A job's connection is bound to
its job id at registration, so a job cannot speak (or set limits) for another.

Logging what peers send: text a peer chose (an ``Error``'s message, a ``Goodbye``'s reason, what a refusal quotes)
is logged with its control characters escaped (``shown``: one log line stays one line, a job cannot forge
another), and every line a peer's message causes is rate-limited (``PeerLog``): bad messages and refusals at
``MAX_BAD_LOGS_PER_S`` lines a second, jobs' own reports of trouble likewise, registrations and departures at
``MAX_JOB_LOGS_PER_S``; the lines left out are counted in the next line let through.

One event's failure never stops the loop: a message, a tick's event or the scheduler link's work that raises is
logged in one line (``MAX_FAILURE_LOGS_PER_S`` a second; the traceback at debug level) and the loop goes on.

Who calls is the kernel's word (``SO_PEERCRED``, ``colocate.base.peercred``), never the message's, on ipc
endpoints:
  * the operator endpoint admits this node's own uid and root; anyone else gets ``Error(forbidden)``;
  * a ``Register`` is bound to the caller's uid and pid: the pid it claims must be the caller or a
    process the caller started, of the caller's uid; a job id this node's worker manager placed
    (``launchers``: ``JOB`` of ``JOB/RANK``) must be claimed by a process below one of that job's
    launchers, of the account the node started them as; a job id registered by one uid is refused to
    every other uid while it is held (root may take any).

The ipc folders are made private and checked before binding (``colocate.base.endpoints.private_dir``: a
folder another user owns or may write is refused in one line). A root node, whose jobs run as other
accounts, makes its job endpoint's folder 0711 and the socket 0666 (the checks above decide who may do
what), the operator socket 0600.

With a scheduler (``agent``: ``colocate.node.agent.SchedulerAgent``), the same single loop also
polls the agent's socket and ticks it every ``TICK_S``; its worker manager shares this server's core (and
``lock``) and hands it the limits a promotion changed (``send_to_job``). Nothing in the loop blocks, so the job
endpoint stays responsive whatever the scheduler link does.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, assert_never

import psutil
import zmq

from colocate import protocol as P
from colocate.base import peercred
from colocate.base.endpoints import ctl_endpoint as default_ctl_endpoint
from colocate.base.endpoints import ipc_path, private_dir
from colocate.base.serving import LogLimit
from colocate.base.text import shown as _shown
from colocate.node import record
from colocate.node.commands import Command, Launch, Note, Reply, Report, Save, Send, Signal
from colocate.node.core import NodeCore
from colocate.node.events import JobLost, NodeTick

if TYPE_CHECKING:
    from colocate.node.agent import SchedulerAgent

log = logging.getLogger("colocate.node")

TICK_S = 0.1
MAX_BAD_LOGS_PER_S = 20  # bad messages and refusals, and (apart) jobs' Error reports
MAX_JOB_LOGS_PER_S = 200  # registrations and departures (a node of 64 GPUs may see them all at once)
MAX_FAILURE_LOGS_PER_S = 5  # events that failed
SHOWN_CHARS = 300  # of a peer's text in one log line


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` (a peer's) fit for one log line (``colocate.base.text.shown``)."""
    return _shown(text, limit)


class PeerLog:
    """Log lines that peers' messages cause, at most ``per_s`` a second (``LogLimit``); how many were left out
    is said once, before the next line let through."""

    def __init__(self, per_s: int):
        self._limit = LogLimit(per_s)
        self.left_out = 0

    def log(self, now: float, level: int, fmt: str, *args) -> None:
        if not self._limit.allow(now):
            self.left_out += 1
            return
        if self.left_out:
            log.warning("(%d such lines left out: over %d a second)", self.left_out, self._limit.per_s)
            self.left_out = 0
        log.log(level, fmt, *args)


class NodeServer:
    def __init__(self, core: NodeCore, endpoint: str, ctl_endpoint: str | None = None,
                 record_path: str | None = None, clock=time.monotonic):
        self.core = core
        self.agent: SchedulerAgent | None = None  # set before serve_forever when the node has a scheduler
        self.endpoint = endpoint
        self.ctl_endpoint = ctl_endpoint or default_ctl_endpoint(endpoint)
        self.clock = clock
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.bad_counts: Counter = Counter()
        self._identity: dict[str, bytes] = {}  # job id -> ROUTER identity
        self._uids: dict[str, int] = {}  # job id -> the uid that registered it (ipc only)
        # job id -> pids of the launchers this node started for it (set with an agent)
        self.launchers: Callable[[str], list[int]] | None = None
        self._stop = threading.Event()
        self._bad_logs = PeerLog(MAX_BAD_LOGS_PER_S)  # bad messages, refusals
        self._error_logs = PeerLog(MAX_BAD_LOGS_PER_S)  # jobs' Error reports
        self._job_logs = PeerLog(MAX_JOB_LOGS_PER_S)  # registrations, departures
        self._failure_logs = PeerLog(MAX_FAILURE_LOGS_PER_S)
        for ep in (endpoint, self.ctl_endpoint):
            if _ipc_in_use(ep):  # libzmq would silently unlink a live node's socket and take its place
                raise zmq.ZMQError(errno.EADDRINUSE, f"{ep} is in use by a running process (another node?)")
        self._record = open(record_path, "a", buffering=1) if record_path else None
        self.ctx: zmq.Context = zmq.Context.instance()
        self.jobs_sock = self._bind(endpoint, 0o666)
        self.ctl_sock = self._bind(self.ctl_endpoint, 0o600)

    def _bind(self, endpoint: str, mode: int):
        path = ipc_path(endpoint)
        shared = os.geteuid() == 0 and mode != 0o600  # others' jobs connect here
        if path:
            private_dir(os.path.dirname(os.path.abspath(path)), 0o711 if shared else 0o700)
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting job may reuse its identity
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME_BYTES)  # a bigger frame drops its sender, unread
        sock.bind(endpoint)
        if path:
            os.chmod(path, mode if shared else 0o600)
        return sock

    # ------------------------------------------------------------------ loop
    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.jobs_sock, zmq.POLLIN)
        poller.register(self.ctl_sock, zmq.POLLIN)
        agent_sock = None
        next_tick = self.clock()
        log.info("node epoch %d: jobs on %s, operators on %s, policy %s", self.core.node_epoch, self.endpoint,
                 self.ctl_endpoint, self.core.cfg.policy)
        try:
            while not self._stop.is_set():
                if self.agent is not None and self.agent.sock is not agent_sock:  # the agent reconnected
                    if agent_sock is not None:
                        poller.unregister(agent_sock)
                    agent_sock = self.agent.sock
                    if agent_sock is not None:
                        poller.register(agent_sock, zmq.POLLIN)
                timeout = max(0.0, next_tick - self.clock())
                for sock, _ in poller.poll(timeout=int(timeout * 1000) + 1):
                    if sock is agent_sock and self.agent is not None:
                        self._guarded("scheduler link: reading", self.agent.on_readable)
                    else:
                        self._drain(sock)
                if self.clock() >= next_tick:
                    self._tick()
                    next_tick = self.clock() + TICK_S
        finally:
            self.close()

    def send_to_job(self, cmd: Send) -> None:
        """Send a command of the core that another edge received (a promotion's new limits) to its job."""
        self._carry_out(cmd, self.clock(), None, None, None)

    def gpu_status(self, now: float | None = None) -> list:
        """Each GPU's utilization over the last 10 s and memory in use, from the core (sim GPUs)."""
        from colocate.node.gpustatus import core_gpu_status

        with self.lock:
            return core_gpu_status(self.core, self.clock() if now is None else now)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        for sock in (self.jobs_sock, self.ctl_sock):
            sock.close(linger=0)
        for ep in (self.endpoint, self.ctl_endpoint):
            path = ipc_path(ep)
            if path and os.path.exists(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if self._record:
            self._record.close()

    def _drain(self, sock) -> None:
        for _ in range(1000):  # bounded, so ticks still run under a flood
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            where = "operator" if sock is self.ctl_sock else "job"
            self._guarded(f"a message on the {where} endpoint", self._take, sock, parts)

    def _take(self, sock, parts: list) -> None:
        """One message received on ``sock`` (its frames, ``parts``): decoded, counted and handled."""
        cred = peercred.of_frame(parts[-1])
        frames = [f.bytes for f in parts]
        if len(frames) != 2:
            self._bad(sock, frames[0], P.ProtocolError(P.MALFORMED, f"expected 1 frame, got {len(frames) - 1}"))
            return
        ident, data = frames
        try:
            msg = P.decode(data)
        except P.ProtocolError as exc:
            self._bad(sock, ident, exc)
            return
        with self.lock:  # the metrics thread reads the counters under the lock
            self.counts[msg.TYPE] += 1
        if sock is self.ctl_sock:
            self._on_ctl(ident, msg, cred)
        else:
            self._on_job(ident, msg, cred)

    def _guarded(self, what: str, fn: Callable, *args) -> None:
        """``fn(*args)``, one event's work: its failure is logged in one line (rate-limited; the traceback at debug
        level) and the loop goes on."""
        try:
            fn(*args)
        except Exception as exc:
            self._failure_logs.log(self.clock(), logging.ERROR, "%s failed (left undone): %s: %s", what,
                                   type(exc).__name__, shown(str(exc)))
            log.debug("%s failed", what, exc_info=True)

    def _on_job(self, ident: bytes, msg, cred: peercred.Cred | None = None) -> None:
        if not isinstance(msg, P.JOB_TO_NODE):
            self._bad(self.jobs_sock, ident, P.ProtocolError(
                P.FORBIDDEN, f"{msg.TYPE} is not accepted on the job endpoint"))
            return
        job_id = getattr(msg, "job_id", None)
        bound = self._identity.get(job_id) if job_id else None
        if isinstance(msg, P.Register):
            why = self._register_problem(msg, cred)  # binding happens once the core accepts it
            if why:
                self._bad(self.jobs_sock, ident, P.ProtocolError(P.FORBIDDEN, why))
                return
        elif bound is not None and bound != ident:
            self._bad(self.jobs_sock, ident, P.ProtocolError(
                P.FORBIDDEN, f"this connection is not registered as job {job_id}"))
            return
        if isinstance(msg, P.Error):
            who = f"job {msg.job_id}" if bound == ident else f"an unregistered connection (job {msg.job_id})"
            self._error_logs.log(self.clock(), logging.WARNING, "%s reports error %s: %s", who, msg.code,
                                 shown(msg.message))
        self._run(msg, ident, self.jobs_sock)
        if isinstance(msg, P.Register) and cred is not None and self._identity.get(msg.job_id) == ident:
            self._uids[msg.job_id] = cred.uid

    def _register_problem(self, msg: P.Register, cred: peercred.Cred | None) -> str | None:
        """Why the caller ``cred`` may not register as ``msg`` claims (None: it may; no credentials: tcp)."""
        if cred is None:
            return None
        why = peercred.claims(cred, msg.pid)
        if why:
            return f"Register {msg.job_id} refused: {why}"
        held = self._uids.get(msg.job_id)
        if held is not None and held != cred.uid and cred.uid != 0 and msg.job_id in self.core.jobs:
            return f"Register {msg.job_id} refused: that job id is registered by uid {held}, the caller is uid {cred.uid}"
        job = msg.job_id.rsplit("/", 1)[0] if msg.rank is not None else msg.job_id
        launchers = self.launchers(job) if self.launchers is not None else []
        if launchers:
            if not any(peercred.descends(msg.pid, pid) for pid in launchers):
                return (f"Register {msg.job_id} refused: job {job} was placed on this node and pid {msg.pid} is "
                        "not below its launcher")
            owner = peercred.uid_of(launchers[0])
            if cred.uid not in (0, owner):
                return f"Register {msg.job_id} refused: job {job} runs as uid {owner}, the caller is uid {cred.uid}"
        return None

    def _on_ctl(self, ident: bytes, msg, cred: peercred.Cred | None = None) -> None:
        if cred is not None and cred.uid not in (0, os.geteuid()):
            self._bad(self.ctl_sock, ident, P.ProtocolError(
                P.FORBIDDEN, f"the operator endpoint admits uid {os.geteuid()} and root only, not uid {cred.uid}"))
            return
        if not isinstance(msg, P.CTL_TO_NODE):
            self._bad(self.ctl_sock, ident, P.ProtocolError(
                P.FORBIDDEN, f"{msg.TYPE} is not accepted on the operator endpoint"))
            return
        if isinstance(msg, P.CtlSet):
            log.info("operator override: %s cap=%s share=%s", msg.job_id, msg.mem_cap, msg.sm_share)
        self._run(msg, ident, self.ctl_sock)

    def _run(self, event, ident: bytes | None, sock) -> None:
        now = self.clock()
        with self.lock:
            before = set(self.core.jobs)
            commands = self.core.handle(event, now)
            after = set(self.core.jobs)
        if isinstance(event, P.Register) and event.job_id in after:
            if any(isinstance(c, Send) and c.job_id == event.job_id and isinstance(c.msg, P.Welcome)
                   for c in commands):
                if ident is not None:
                    self._identity[event.job_id] = ident
                job = self.core.jobs[event.job_id]
                self._job_logs.log(now, logging.INFO, "job %s registered: gpu %d%s %s%s pid %d (epoch %d)",
                                   event.job_id, job.gpu, " (picked)" if event.pick_gpu else "", job.klass,
                                   " partition" if job.partition else "", event.pid, event.epoch)
        for job_id in before - after:
            self._identity.pop(job_id, None)
            self._uids.pop(job_id, None)
            reason = next((r for j, r in reversed(self.core.left) if j == job_id), "left")
            self._job_logs.log(now, logging.INFO, "job %s left: %s", job_id, shown(reason))
        if isinstance(event, P.BatchReport) and self._record:
            self._write_record(record.REPORT, now, event)
        elif isinstance(event, P.LimitsApplied) and self._record:
            self._write_record(record.APPLIED, now, event)
        for cmd in commands:
            self._carry_out(cmd, now, event, ident, sock)

    def _carry_out(self, cmd: Command, now: float, event: object, ident: bytes | None, sock) -> None:
        """Carry out one command of the core, answering ``ident`` on ``sock`` (no one: ``ident`` None)."""
        match cmd:
            case Send():
                target = self._identity.get(cmd.job_id)
                if target is not None:
                    self.jobs_sock.send_multipart([target, P.encode(cmd.msg)])
                if isinstance(cmd.msg, P.SetLimits) and self._record:
                    self._write_record(record.LIMITS, now, cmd.msg)
                elif isinstance(cmd.msg, P.Welcome) and self._record:
                    self._write_record(record.WELCOME, now, cmd.msg)
            case Reply():
                if ident is None:
                    return
                if isinstance(cmd.msg, P.Error):
                    with self.lock:
                        self.bad_counts[cmd.msg.code] += 1
                    if cmd.msg.code != P.UNKNOWN_JOB:
                        self._bad_logs.log(now, logging.WARNING, "rejected %s: %s", type(event).__name__,
                                           shown(cmd.msg.message))
                sock.send_multipart([ident, P.encode(cmd.msg)])
            case Note():
                log.log(logging.WARNING if cmd.level == "warning" else logging.INFO, "%s", shown(cmd.text, 2000))
            case Launch() | Signal() | Report() | Save():  # placement commands: no job event makes one
                log.error("a job event made placement command %s: ignored", cmd)
            case _:
                assert_never(cmd)

    def _tick(self) -> None:
        """Liveness and replanning. What the jobs sent while the loop was busy elsewhere (a placement's start, the
        scheduler's link) is taken in first, so a job whose messages wait unread is never counted silent."""
        self._drain(self.jobs_sock)
        for job in list(self.core.jobs.values()):
            if not _pid_alive(job.pid):
                self._guarded(f"job {job.job_id} lost", self._run, JobLost(job.job_id, f"process {job.pid} is gone"),
                              None, self.jobs_sock)
        self._guarded("the tick", self._run, NodeTick(), None, self.jobs_sock)
        if self.agent is not None:  # a bug in the scheduler link must not stop the jobs' node
            self._guarded("scheduler link: tick", self.agent.tick)

    def _bad(self, sock, ident: bytes, exc: P.ProtocolError) -> None:
        with self.lock:
            self.bad_counts[exc.code] += 1
        self._bad_logs.log(self.clock(), logging.WARNING, "bad message (%s): %s", exc.code, shown(str(exc)))
        try:
            sock.send_multipart([ident, P.encode(P.Error(code=exc.code, message=str(exc)[:4000], job_id=None))],
                                zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _write_record(self, kind: str, now: float, msg) -> None:
        if self._record is None:
            return
        extra = {}
        job = self.core.jobs.get(msg.job_id)
        if job is not None and kind == record.REPORT:
            extra = {"gpu": job.gpu, "priority": job.klass}
        elif job is not None and kind in (record.LIMITS, record.WELCOME):
            extra = {"slo_state": job.slo_state}
        self._record.write(record.row(kind, now, msg, **extra) + "\n")


def _ipc_in_use(endpoint: str) -> bool:
    """True when ``endpoint`` is an ipc path that a live process accepts connections on (a socket file left
    behind by a killed node refuses them, and may be bound again)."""
    path = ipc_path(endpoint)
    if not path or not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _pid_alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    except Exception:
        return True
