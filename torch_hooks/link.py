"""The job's link to its node coordinator (ZeroMQ DEALER over ``ipc://``).

Each process of a job has its own link and speaks as its worker id (``JobEnv.worker_id``:
``JOB/RANK`` for a torchrun worker, with ``Register.rank``/``world_size``; else ``JOB``).

A background thread owns the DEALER socket. It registers the job, sends one
``BatchReport`` per mini-batch (handed over from the training thread through an
inproc PUSH/PULL pair), sends the job's features (``FeaturesReport``) once they are read at the
first boundary and again after every later ``Welcome``, acknowledges applied limits, and applies ``SetLimits``
to the runtime. Reliability follows the zguide's Paranoid Pirate: the job sends
a ``Heartbeat`` every ``heartbeat_s`` and the node echoes it; after ``liveness``
silent intervals the link drops the socket, reconnects with exponential backoff
and registers again (``epoch`` + 1); so does a node's ``UNKNOWN_JOB`` (it forgot the job), once per heartbeat
period while a Register is unanswered. Both numbers are the node's: its ``Welcome``
carries them (``DEFAULT_HEARTBEAT_S`` and ``DEFAULT_LIVENESS`` hold until then). While
the node is away the job keeps running at its last limits. At ``stop`` the thread sends what the training
thread handed over since its last poll (the job's last reports), then a ``Goodbye``. Messages from a node
incarnation older than the one that welcomed the job are ignored. Limits are acknowledged
(``LimitsApplied``) by the first batch under them, or while paused; a pause (share 0) that
arrives before the job's first device work is acknowledged at once, since the runtime holds
that work until the share is raised. ``Register.priority_yield`` tells the node that the job
yields by low device priority (``COLOCATE_YIELD_VIA`` has it, on the simulated GPU).

``register_first(env)`` is the registration every worker with a node makes before it runs (a refusal stops it;
no answer stops only a fixed partition, a GPU the node picks, ``COLOCATE_NODE_REQUIRED``): it runs at install, before the device is opened (so before CUDA
starts), on a socket of its own, and returns the ``JobEnv`` to run with (the node's GPU for a pick) or raises
``NodeRefused`` with one line. The link then registers again as the same worker (on the welcomed GPU; should the
worker take longer than the node's liveness to get there, the node has forgotten it and admits it anew).

The guaranteed job of a GPU also publishes its device phases on the GPU's gate
(``torch_hooks.gate``). When its limits say ``gate``, an opportunistic job
yields the device in the ways ``COLOCATE_YIELD_VIA`` names: it follows the gate
(sim) and/or asks the device for low priority (``JobDevice.set_low_priority``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

import zmq

from colocate import protocol as P
from colocate.base.env import JobEnv
from colocate.base.vocab import DeviceKind, JobClass, YieldMode
from colocate.gpus.sim import SIM_NAME
from torch_hooks.gate import GateFollower, GatePublisher, gate_path

log = logging.getLogger("colocate.link")

DEFAULT_HEARTBEAT_S = 1.0
DEFAULT_LIVENESS = 3
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0


class NodeRefused(ValueError):
    """The node refused this worker, or did not answer in time where it must (one line)."""


def _register_msg(env, epoch: int, mem_cap: int, sm_share: float) -> P.Register:
    return P.Register(
        job_id=env.worker_id, pid=os.getpid(), gpu=env.gpu, priority=env.klass, mem_request=env.gpu_mem,
        sm_share=sm_share, mem_cap=mem_cap, epoch=epoch, token=env.token[:128], sm_request=env.sm_share,
        rank=env.rank, world_size=max(env.world_size or 1, (env.rank or 0) + 1), partition=env.partition,
        pick_gpu=env.pick_gpu,
        priority_yield=(env.klass == JobClass.OPPORTUNISTIC and YieldMode.PRIORITY in env.yield_via
                        and env.device == DeviceKind.SIM),  # CUDA has no process priority yet
    )


def register_first(env: JobEnv, clock=time.monotonic) -> JobEnv:
    """Register with the node at ``env.node`` and wait up to ``env.node_wait_s`` for its answer.

    Returns ``env`` bound to the GPU the node welcomed it on (a pick: that GPU, its memory and sim core, and
    ``pick_gpu`` off, so the link registers on that GPU). Raises ``NodeRefused`` (one line) when the node
    refuses, or when it does not answer and the worker cannot run without it (``node_required``, a pick);
    a worker that is not required runs on with its own limits when no node answers (the link registers again
    once one does)."""
    assert env.node, "register_first needs a node endpoint"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(env.node)
        sock.send(P.encode(_register_msg(env, 0, env.gpu_mem or 0, env.sm_share)))
        deadline = clock() + env.node_wait_s
        while (left := deadline - clock()) > 0:
            if not sock.poll(max(1, int(left * 1000))):
                continue
            try:
                msg = P.decode(sock.recv())
            except P.ProtocolError:
                continue
            if isinstance(msg, P.Welcome) and msg.job_id == env.worker_id:
                return _bound(env, msg)
            if isinstance(msg, P.Error) and msg.code != P.UNKNOWN_JOB:
                raise NodeRefused(f"the node coordinator at {env.node} refused worker {env.worker_id}: "
                                  f"{msg.message.splitlines()[0] if msg.message else msg.code}")
    except zmq.ZMQError as exc:
        raise NodeRefused(f"cannot reach the node coordinator at {env.node}: {exc}") from None
    finally:
        sock.close(linger=0)
        ctx.term()
    if env.node_required or env.pick_gpu:
        why = "COLOCATE_NODE_REQUIRED=1" if env.node_required else "COLOCATE_GPUS=node"
        raise NodeRefused(f"no node coordinator answered at {env.node} within {env.node_wait_s:g} s: start "
                          f"`colocate node` on this machine ({why}: this worker does not run without it)")
    log.warning("no node coordinator answered at %s within %g s: this worker runs on at its own limits",
                env.node, env.node_wait_s)
    return env


def _bound(env: JobEnv, welcome: P.Welcome) -> JobEnv:
    if welcome.gpu is None or not env.pick_gpu:
        return env
    gpu = welcome.gpu
    return dataclasses.replace(env, gpu=gpu, gpus=(gpu,), pick_gpu=False, sim_core=welcome.sim_core,
                               sim_gpu_mem=welcome.mem_total or env.sim_gpu_mem)


class NodeLink:
    def __init__(self, env, rt, clock=time.monotonic):
        self.env = env
        self.rt = rt
        self.worker_id = env.worker_id  # JOB/RANK for a torchrun worker, else JOB: this process on the link
        self._clock = clock
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="colocate-link", daemon=True)
        self._inbox_addr = f"inproc://colocate-link-{id(self)}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self._inbox_addr)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(self._inbox_addr)
        self._push_lock = threading.Lock()
        self.epoch = 0
        self._registered_at = float("-inf")  # when the last Register went out (the link's clock)
        self._first_register_at: float | None = None  # when the first did
        self.node_epoch: int | None = None
        self.heartbeat_s = DEFAULT_HEARTBEAT_S  # the node's, from its Welcome
        self.liveness = DEFAULT_LIVENESS
        self.registered = threading.Event()
        self.welcomes = 0
        self.rejected = False  # the node refused the registration: stop asking
        self._last_acked = 0
        self.publisher = None
        self.follower = None
        self.yielding = False  # the node asked this (opportunistic) job to yield, and it does
        path = gate_path(env.node, env.gpu)
        if env.klass == JobClass.GUARANTEED:
            self.publisher = GatePublisher(path)
            rt.add_start_hook(self.publisher.start)
            rt.add_end_hook(self.publisher.end)
        elif env.device == DeviceKind.SIM and YieldMode.GATE in env.yield_via:
            from torch_hooks import _ext

            self.follower = GateFollower(path, _ext.load())
        rt.add_listener(self._on_record)
        rt.add_paused_apply_hook(self._on_paused_apply)
        rt.add_features_hook(self._on_features)
        self.features_sent = 0  # FeaturesReports sent

    # ---- training thread ----------------------------------------------------
    def _on_record(self, rec) -> None:
        with self._push_lock:
            try:
                self._push.send_pyobj(rec, zmq.NOBLOCK)
            except zmq.ZMQError:  # link stopped or queue full: drop the report
                pass

    def _on_paused_apply(self, seq: int, now: float) -> None:
        self._on_record(("applied", seq, now))

    def _on_features(self, features) -> None:
        self._on_record(("features", features))

    # ---- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str = "exit", timeout: float = 1.0) -> None:
        if self.publisher is not None:
            self.publisher.close()
        self._goodbye_reason = reason
        self._stop.set()
        self._thread.join(timeout)
        first = self._first_register_at
        if (first is not None and not self.welcomes and not self.rejected  # a mistyped endpoint, say
                and self._clock() - first >= self.heartbeat_s):  # a node answers in ms: a job that ends sooner may
            # end before the Welcome on its way is read
            log.warning("no node coordinator at %s answered this job in %.1f s: it ran at its own limits, outside "
                        "any node's policy", self.env.node, self._clock() - first)

    # ---- link thread ------------------------------------------------------------
    def _connect(self):
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 200)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.connect(self.env.node)
        return sock

    def _register(self, sock) -> None:
        self.epoch += 1
        self._registered_at = self._clock()
        if self._first_register_at is None:
            self._first_register_at = self._registered_at
        limits = self.rt.limits()
        self._send(sock, _register_msg(self.env, self.epoch, limits["mem_cap"], limits["sm_share"]))

    def _send(self, sock, msg) -> None:
        try:
            sock.send(P.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.debug("node link: send queue full, dropped %s", msg.TYPE)

    def _run(self) -> None:
        mark = getattr(self.rt.device, "control_thread", None)  # the sim device keeps this thread off its core
        if mark is not None:
            mark()
        sock = self._connect()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        self._register(sock)
        last_heard = last_beat = self._clock()
        backoff = BACKOFF_MIN_S
        while not self._stop.is_set():
            events = dict(poller.poll(timeout=max(1, int(self.heartbeat_s * 1000 / 4))))
            now = self._clock()
            if sock in events:
                while True:
                    try:
                        data = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    last_heard = now
                    backoff = BACKOFF_MIN_S
                    self._handle(sock, data)
            if self._pull in events:
                self._forward(sock)
            if self.rejected:
                last_heard = now  # not a silent node: it said no
            elif now - last_beat >= self.heartbeat_s:  # the node echoes it: proof of life both ways
                self._send(sock, P.Heartbeat(job_id=self.worker_id, sent_at=now))
                last_beat = now
            if now - last_heard > self.heartbeat_s * self.liveness:
                log.warning("node %s silent for %.1fs: reconnecting", self.env.node, now - last_heard)
                self.registered.clear()
                poller.unregister(sock)
                sock.close(linger=0)
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                sock = self._connect()
                poller.register(sock, zmq.POLLIN)
                self._register(sock)
                last_heard = last_beat = self._clock()
        self._forward(sock)  # what the training thread handed over after the last poll: its last batches
        reason = getattr(self, "_goodbye_reason", "exit")
        self._send(sock, P.Goodbye(job_id=self.worker_id, exit_code=None, reason=reason))
        sock.close(linger=200)

    def _forward(self, sock) -> None:
        """Send what the training thread has handed over (reports, features, acknowledgements), until its queue
        is empty; dropped while unregistered (the node would not know the job)."""
        while True:
            try:
                rec = self._pull.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not self.registered.is_set():
                continue
            if isinstance(rec, tuple) and rec[0] == "features":  # read at the first boundary
                self._send_features(sock, rec[1])
            elif isinstance(rec, tuple):  # ("applied", seq, t): limits in force while paused
                self._ack(sock, rec[1], rec[2])
            else:
                self._report(sock, rec)

    def _report(self, sock, rec) -> None:
        self._send(sock, P.BatchReport(
            job_id=self.worker_id, seq=rec.index, t_end=rec.t_end, duration_s=rec.duration_s,
            busy_s=max(0.0, rec.busy_s), device_start_s=rec.device_start_s or 0.0,
            mem_allocated_peak=rec.mem_allocated_peak, mem_reserved=rec.mem_reserved, mem_floor=rec.mem_floor,
            host_bytes=rec.host_bytes, host_bytes_touched=rec.host_bytes_touched, limits_seq=rec.limits_seq,
            mem_reserved_peak=rec.mem_reserved_peak,
        ))
        self._ack(sock, rec.limits_seq, rec.t_end)

    def _send_features(self, sock, features) -> None:
        if features.hardware.kind == DeviceKind.SIM:  # the type the node said last (its Welcome may come late)
            features = self._with_sim_type(features)
        self.features_sent += 1  # before the send: whoever receives it sees the count
        self._send(sock, P.FeaturesReport(job_id=self.worker_id, features=features))

    def _with_sim_type(self, features):
        """``features`` with the simulated GPU's type and speed as the device has them now."""
        dev = self.rt.device
        name, speed = getattr(dev, "type_name", "") or SIM_NAME, float(getattr(dev, "speed", 1.0))
        hw = features.hardware
        if (hw.name, hw.sim_speed) == (name, speed):
            return features
        return dataclasses.replace(features, hardware=dataclasses.replace(hw, name=name, sim_speed=speed))

    def _ack(self, sock, seq: int, applied_at: float) -> None:
        """Tell the node that limits ``seq`` are in force (once per seq)."""
        if seq > self._last_acked:
            self._last_acked = seq
            self._send(sock, P.LimitsApplied(job_id=self.worker_id, limits_seq=seq, applied_at=applied_at))

    def _handle(self, sock, data: bytes) -> None:
        try:
            msg = P.decode(data)
        except P.ProtocolError as exc:
            log.warning("node link: bad message from node (%s): %s", exc.code, exc)
            return
        if isinstance(msg, P.Welcome):
            if self.node_epoch is not None and msg.node_epoch < self.node_epoch:
                return  # a stale incarnation
            # Every Welcome starts a registration, and its limits are what is in force from now on: a restarted
            # node numbers them from scratch, and so does a node that dropped this worker's record (silent, lost)
            # and made a new one. Held to the old numbers, the job would ignore them as stale and keep its last
            # limits (a paused job, promoted meanwhile, stayed at share 0 for good).
            self.rt.rebase_seq()
            self._last_acked = 0
            self.node_epoch = msg.node_epoch
            self.heartbeat_s, self.liveness = msg.heartbeat_s, msg.liveness
            set_speed = getattr(self.rt.device, "set_speed", None)  # a simulated GPU's type
            if set_speed is not None:
                set_speed(msg.sim_speed, msg.sim_type)
            self.welcomes += 1
            self._apply(msg.limits)
            self.registered.set()
            self._ack_before_device_work(sock, msg.limits)
            if self.rt.features is not None:  # a restarted node has forgotten them
                self._send_features(sock, self.rt.features)
        elif isinstance(msg, P.SetLimits):
            if self.registered.is_set() and msg.job_id == self.worker_id:
                self._apply(msg.limits)
                self._ack_before_device_work(sock, msg.limits)
        elif isinstance(msg, P.Error):
            if msg.code == P.REJECTED:
                if not self.rejected:
                    log.warning("node rejected this job (%s); running on at the current limits", msg.message)
                self.rejected = True
            elif msg.code == P.UNKNOWN_JOB:
                if not self.rejected and self._register_again():
                    self.registered.clear()
                    self._register(sock)
            else:
                log.warning("node error (%s): %s", msg.code, msg.message)

    def _register_again(self) -> bool:
        """Whether a node's ``UNKNOWN_JOB`` calls for a new Register: yes while registered (the node forgot the
        job), and while a Register is pending only once it is a heartbeat period old (it may be lost). A restarted
        node answers each message the job sent before its Register reached it (up to the socket's queue: reports
        and heartbeats queued while the node was down) with ``UNKNOWN_JOB``: those answers are one Register in
        all, at most one per heartbeat period, not one each (a storm that would hold the node's loop)."""
        return self.registered.is_set() or self._clock() - self._registered_at >= self.heartbeat_s

    def _ack_before_device_work(self, sock, limits) -> None:
        """A pause (share 0) reaching a job before its first device work is in force at once: the job
        will wait before any device work (``Runtime``), so the node need not wait for a boundary."""
        if limits.sm_share <= 0.0 and not self.rt.device_work_started():
            self._ack(sock, limits.seq, self._clock())

    def _set_yield(self, on: bool) -> None:
        """Start or stop yielding the device to the guaranteed job (idempotent)."""
        if self.env.klass != JobClass.OPPORTUNISTIC or on == self.yielding:
            return
        self.yielding = on
        if self.follower is not None:
            self.follower.set_enabled(on)
        if "priority" in self.env.yield_via and not self.rt.device.set_low_priority(on):
            log.warning("the %s device could not %s low priority", self.env.device, "take" if on else "leave")

    def _apply(self, limits) -> None:
        applied = self.rt.set_limits(mem_cap=limits.mem_cap, sm_share=limits.sm_share, seq=limits.seq)
        self._set_yield(limits.gate)
        if applied:
            log.info("applied limits seq=%d cap=%d share=%.3f gate=%s", limits.seq, limits.mem_cap,
                     limits.sm_share, limits.gate)
