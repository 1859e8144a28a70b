"""torch_hooks/link.py: the job's link to its node.

First without a node: how applied limits turn the job's yielding on and off (the link's socket thread is
never started; ``_apply`` is called as the thread would call it on a ``Welcome`` or ``SetLimits``).

Then against a node played by the test (a ROUTER socket on an ipc path): registration, reconnection after
the node's silence (Paranoid Pirate, with the Welcome's heartbeat and liveness), fencing of an older node
incarnation and of stale limits, and a refused registration. The link runs its real thread on a
``FakeClock``: time moves only when the test says, and the clock's reads tell when the link has looked.
The runtime is the real one over a minimal device, since it is what the link applies limits to.
"""
import logging
import os

import pytest
import zmq

from colocate import protocol as P
from colocate.base.env import JobEnv
from tests.support import FakeClock, GiB, wait_for
from torch_hooks.device.base import MemoryStats
from torch_hooks.gate import gate_path
from torch_hooks.link import NodeLink
from torch_hooks.runtime import Runtime


class FakeDevice:
    def __init__(self, grant=True):
        self.calls, self.grant = [], grant

    def set_low_priority(self, on):
        self.calls.append(on)
        return self.grant


class FakeRuntime:
    def __init__(self, device):
        self.device = device
        self.applied = []

    def set_limits(self, mem_cap=None, sm_share=None, seq=None):
        self.applied.append((mem_cap, sm_share, seq))
        return True

    def limits(self):
        return {"mem_cap": 0, "sm_share": 1.0, "seq": 0}

    def add_listener(self, fn):
        pass

    def add_start_hook(self, fn):
        pass

    def add_end_hook(self, fn):
        pass

    def add_paused_apply_hook(self, fn):
        pass

    def add_features_hook(self, fn):
        pass

    features = None


@pytest.fixture
def make_link(tmp_path):
    links = []

    def make(priority="opportunistic", yield_via=("priority",), device="sim", grant=True):
        env = JobEnv(job_id="j", klass=priority, device=device, node=f"ipc://{tmp_path}/n.sock",
                     yield_via=yield_via)
        rt = FakeRuntime(FakeDevice(grant))
        link = NodeLink(env, rt)
        links.append(link)
        return link, rt

    yield make
    for link in links:
        link._ctx.destroy(linger=0)
    try:
        os.unlink(gate_path(f"ipc://{tmp_path}/n.sock", 0))
    except OSError:
        pass


def limits(seq, gate):
    return P.Limits(seq=seq, mem_cap=1 << 30, sm_share=0.5, gate=gate)


@pytest.mark.parametrize("priority, yield_via, gates, want_calls", [
    ("opportunistic", ("priority",), [True, True, False, False, True], [True, False, True]),  # changes only
    ("opportunistic", ("priority",), [False, False], []),  # never asked to yield
    ("opportunistic", (), [True, False], []),  # COLOCATE_YIELD_VIA=none
    ("guaranteed", ("priority",), [True, False], []),  # a guaranteed job never yields
])
def test_yield_follows_the_gate_limit(make_link, priority, yield_via, gates, want_calls):
    link, rt = make_link(priority, yield_via)
    for seq, gate in enumerate(gates, start=1):
        link._apply(limits(seq, gate))
    assert rt.device.calls == want_calls
    assert [a[2] for a in rt.applied] == list(range(1, len(gates) + 1))  # limits applied every time


def test_gate_follower_only_on_sim_with_gate_in_yield_via(make_link):
    assert make_link(yield_via=("priority",))[0].follower is None
    assert make_link(device="cuda", yield_via=("priority", "gate"))[0].follower is None
    assert make_link(priority="guaranteed")[0].publisher is not None


def test_a_device_that_refuses_low_priority_is_logged(make_link, caplog):
    link, rt = make_link(device="cuda", grant=False)
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        link._apply(limits(1, True))
    assert rt.device.calls == [True]
    assert "cuda device could not take low priority" in caplog.text
    assert link.yielding  # the node's request stands; the gate (where there is one) still applies


# ---------------------------------------------------------------- against a node played by the test


class MiniDevice:
    """Just enough of a JobDevice for ``Runtime`` limits (no boundaries happen in these tests)."""

    kind, index = "sim", 0

    def __init__(self):
        self.cap = 16 * GiB

    def memory(self):
        return MemoryStats(cap=self.cap, allocated=0, reserved=0, host=0, peak_allocated=0, peak_reserved=0,
                           peak_host=0, win_peak_allocated=0, win_peak_reserved=0, win_host_touched=0)

    def busy_time(self):
        return 0.0

    def set_cap(self, cap):
        self.cap = int(cap)

    def set_low_priority(self, on):
        return True


class FakeNode:
    """The node's job endpoint: a ROUTER the test reads and answers by hand."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.seen = []  # (identity, message) in arrival order

    def recv(self, timeout=5.0, skip=(P.Heartbeat,)):
        """The next message that is not of a ``skip`` type: (identity, message)."""
        while True:
            assert self.sock.poll(int(timeout * 1000)), f"the link sent nothing for {timeout}s"
            ident, data = self.sock.recv_multipart()
            msg = P.decode(data)
            self.seen.append((ident, msg))
            if not isinstance(msg, skip):
                return ident, msg

    def send(self, ident, msg):
        self.sock.send_multipart([ident, P.encode(msg)])

    def close(self):
        self.sock.close(0)
        self.ctx.destroy(0)


@pytest.fixture
def wired(ipc_dir):
    """(link, runtime, node, clock): an opportunistic job's link to a fake node, started."""
    endpoint = f"ipc://{ipc_dir}/node.sock"
    node = FakeNode(endpoint)
    clock = FakeClock()
    env = JobEnv(job_id="j", klass="opportunistic", device="sim", node=endpoint, yield_via=(), token="tok")
    rt = Runtime(env, MiniDevice())
    link = NodeLink(env, rt, clock=clock)
    link.start()
    yield link, rt, node, clock
    link.stop(timeout=5)
    assert not link._thread.is_alive(), "the link thread did not stop"
    link._ctx.destroy(linger=0)
    node.close()


def welcome(node_epoch, seq, share, heartbeat_s=0.05, liveness=3):
    return P.Welcome(job_id="j", node_epoch=node_epoch, limits=P.Limits(seq=seq, mem_cap=GiB, sm_share=share, gate=False),
                     heartbeat_s=heartbeat_s, liveness=liveness)


def set_limits(seq, share, job_id="j"):
    return P.SetLimits(job_id=job_id, limits=P.Limits(seq=seq, mem_cap=GiB, sm_share=share, gate=False))


def registered(wired, node_epoch=5, seq=1, share=0.5, **kw):
    """Receive the link's Register and welcome it; returns (identity, register)."""
    link, rt, node, clock = wired
    ident, reg = node.recv()
    assert isinstance(reg, P.Register), reg
    node.send(ident, welcome(node_epoch, seq, share, **kw))
    assert link.registered.wait(5), "the Welcome was not taken"
    return ident, reg


def limits_in_force(link, node, ident):
    """Handshake: the limits the runtime has now, as the link reports them when it registers again (the node
    says it does not know the job); everything the node sent before was handled by then."""
    node.send(ident, P.Error(code=P.UNKNOWN_JOB, message="who?", job_id="j"))
    _, reg = node.recv()
    assert isinstance(reg, P.Register), reg
    return reg


def test_the_link_registers_and_takes_the_welcomes_limits_and_timing(wired):
    link, rt, node, clock = wired
    ident, reg = registered(wired, share=0.5, heartbeat_s=0.05, liveness=3)
    assert (reg.job_id, reg.pid, reg.epoch, reg.priority, reg.token) == ("j", os.getpid(), 1, "opportunistic", "tok")
    assert rt.limits() == {"mem_cap": GiB, "sm_share": 0.5, "seq": 1}
    assert (link.node_epoch, link.heartbeat_s, link.liveness) == (5, 0.05, 3)
    # it heartbeats on the Welcome's period (not the default 1 s): 0.06 s of its clock is enough
    clock.advance(0.06)
    _, beat = node.recv(skip=())
    assert isinstance(beat, P.Heartbeat) and beat.job_id == "j"


def test_the_link_registers_again_with_epoch_plus_1_after_the_node_stays_silent(wired):
    link, rt, node, clock = wired
    ident, reg = registered(wired, heartbeat_s=0.05, liveness=3)
    # 2 heartbeat periods of silence: not yet gone (0.1 s < 0.05 x 3); the link heartbeats each period
    for _ in range(2):
        clock.advance(0.06)
        i, beat = node.recv(skip=())
        assert isinstance(beat, P.Heartbeat) and i == ident
    clock.wait_reads(2)
    assert link.epoch == 1 and link.registered.is_set()
    # past heartbeat_s x liveness without a word from the node: a new socket registers again, epoch + 1
    clock.advance(0.06)
    ident2, reg2 = node.recv()
    assert isinstance(reg2, P.Register) and reg2.epoch == reg.epoch + 1 and ident2 != ident
    assert not link.registered.is_set()
    assert [m.epoch for _, m in node.seen if isinstance(m, P.Register)] == [1, 2]
    assert rt.limits()["sm_share"] == 0.5  # meanwhile the job runs on at its last limits
    node.send(ident2, welcome(5, 2, 0.75))
    assert link.registered.wait(5)


def test_a_welcome_from_an_older_node_incarnation_is_ignored(wired):
    link, rt, node, clock = wired
    ident, _ = registered(wired, node_epoch=5, seq=1, share=0.5)
    node.send(ident, welcome(4, 9, 0.125, heartbeat_s=7.0, liveness=9))  # an older node's late Welcome
    node.send(ident, set_limits(2, 0.75))  # this node's next limits still apply after it
    reg = limits_in_force(link, node, ident)
    assert (reg.sm_share, rt.limits()["seq"]) == (0.75, 2)
    assert (link.node_epoch, link.heartbeat_s, link.liveness) == (5, 0.05, 3)
    # a newer incarnation (the node restarted) numbers its limits from scratch: seq 1 applies again
    node.send(ident, welcome(6, 1, 0.25))
    reg = limits_in_force(link, node, ident)
    assert (reg.sm_share, link.node_epoch, rt.limits()["seq"]) == (0.25, 6, 1)


def test_a_welcome_of_the_same_node_numbering_afresh_is_in_force(wired):
    """The node dropped this worker's record (it was silent) and made a new one when it registered again: the
    same epoch, limits numbered from 1 again. They apply, and so do the next ones (a paused job that was
    promoted meanwhile gets its share back)."""
    link, rt, node, clock = wired
    ident, _ = registered(wired, node_epoch=5, seq=1, share=0.5)
    node.send(ident, set_limits(7, 0.125))  # throttled, at seq 7
    reg = limits_in_force(link, node, ident)
    assert (reg.sm_share, rt.limits()["seq"]) == (0.125, 7)
    node.send(ident, welcome(5, 1, 1.0))  # a new record: seq 1, the whole GPU
    node.send(ident, set_limits(2, 0.75))  # and its next limits
    reg = limits_in_force(link, node, ident)
    assert (reg.sm_share, rt.limits()["seq"]) == (0.75, 2)


def test_set_limits_with_a_stale_seq_or_for_another_job_are_not_applied(wired):
    link, rt, node, clock = wired
    ident, _ = registered(wired, seq=1, share=0.5)
    node.send(ident, set_limits(3, 0.75))
    node.send(ident, set_limits(2, 0.125))  # older than what is in force (reordered or repeated)
    node.send(ident, set_limits(3, 0.25))  # the same seq again
    node.send(ident, set_limits(4, 0.375, job_id="someone-else"))
    reg = limits_in_force(link, node, ident)
    assert reg.sm_share == 0.75 and rt.limits() == {"mem_cap": GiB, "sm_share": 0.75, "seq": 3}


def test_a_burst_of_unknown_job_answers_makes_one_register_and_an_unanswered_one_is_sent_again(wired, caplog):
    """A restarted node answers each message the job queued while it was down with UNKNOWN_JOB: the link
    registers again once, not once per answer; a Register unanswered for a heartbeat period is sent again.
    ``link.epoch`` counts the Registers sent; a logged probe error after the answers is the handshake."""
    link, rt, node, clock = wired
    ident, _ = registered(wired, heartbeat_s=0.05)
    unknown = P.Error(code=P.UNKNOWN_JOB, message="who?", job_id="j")

    def answer(n: int, probe: str) -> int:
        for _ in range(n):
            node.send(ident, unknown)
        node.send(ident, P.Error(code=P.INVALID, message=probe, job_id="j"))
        wait_for(lambda: f"node error (invalid): {probe}" in caplog.text, 5, what="the link to handle the answers")
        return link.epoch

    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        assert answer(20, "burst") == 2 and not link.registered.is_set()
        assert answer(5, "pending") == 2  # the Register is younger than a heartbeat period
        clock.advance(0.06)
        assert answer(1, "unanswered") == 3  # a heartbeat period old: it may be lost, so it is sent again
        node.send(ident, welcome(6, 1, 0.5))
        wait_for(lambda: link.registered.is_set() and link.node_epoch == 6, 5, what="the Welcome")
        assert answer(1, "registered") == 4  # the node forgot a registered job: at once
    assert "node error (unknown_job)" not in caplog.text  # the answers it passes over are not logged one by one
    assert [m.epoch for _, m in node.seen if isinstance(m, P.Register)] == [1]  # the test read no other


def test_a_rejected_job_stops_registering(wired, caplog):
    link, rt, node, clock = wired
    ident, reg = node.recv()
    assert isinstance(reg, P.Register)
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        node.send(ident, P.Error(code=P.REJECTED, message="job id j is in use by pid 1", job_id="j"))
        node.send(ident, P.Error(code=P.UNKNOWN_JOB, message="who?", job_id="j"))  # would make it register again
        node.send(ident, P.Error(code=P.INVALID, message="probe", job_id="j"))  # logged: both before it were handled
        wait_for(lambda: "node error (invalid): probe" in caplog.text, 5, what="the link to handle the errors")
    assert link.rejected and not link.registered.is_set()
    assert "node rejected this job (job id j is in use by pid 1)" in caplog.text
    # far past the default liveness (no Welcome came: 1 s x 3) the link has looked at its clock and stays put
    clock.advance(60.0)
    clock.wait_reads(3)
    assert rt.limits()["seq"] == 0  # it runs on at its own limits
    link.stop(timeout=5)
    _, bye = node.recv()
    assert isinstance(bye, P.Goodbye)
    assert [type(m).__name__ for _, m in node.seen] == ["Register", "Goodbye"]  # no heartbeat, no register again


def test_a_pause_before_the_first_device_work_is_acknowledged_at_once(wired):
    """The node may profile the guaranteed job's baseline while this job starts: a pause (share 0) that
    reaches the job before its first device work is in force at once (the runtime waits before that work),
    so the link says so without a batch; a share above 0 is acknowledged by the first batch as before."""
    link, rt, node, clock = wired
    ident, reg = registered(wired, seq=1, share=0.5)
    assert reg.priority_yield is False  # yield_via=() here: it yields without priority
    node.send(ident, set_limits(2, 0.0))
    _, ack = node.recv()
    assert isinstance(ack, P.LimitsApplied) and ack.limits_seq == 2
    assert not any(isinstance(m, P.LimitsApplied) and m.limits_seq == 1 for _, m in node.seen)


def test_features_go_to_the_node_once_read_and_again_after_each_welcome(wired):
    from tests.colocate.test_protocol import FEATURES

    link, rt, node, clock = wired
    ident, _ = registered(wired)
    rt.features = FEATURES  # what the runtime does at the first boundary: set them, then run the features hooks
    for fn in rt._features_hooks:
        fn(FEATURES)
    _, msg = node.recv(skip=(P.Heartbeat, P.LimitsApplied))
    assert msg == P.FeaturesReport(job_id="j", features=FEATURES)
    node.send(ident, P.Error(code=P.UNKNOWN_JOB, message="who?", job_id="j"))  # a restarted node forgot the job
    _, reg = node.recv(skip=(P.Heartbeat, P.LimitsApplied))
    assert isinstance(reg, P.Register)
    node.send(ident, welcome(6, 1, 0.5))
    _, again = node.recv(skip=(P.Heartbeat, P.LimitsApplied))
    assert again == msg and link.features_sent == 2


@pytest.mark.parametrize("sim_type, speed, name", [("K80", 0.25, "K80"), ("", 1.0, "colocate-sim")])
def test_a_simulated_gpus_features_carry_the_type_and_speed_the_node_said(wired, sim_type, speed, name):
    """Features read before the Welcome (or kept across a node's restart) go out with the GPU's type and speed
    as the node's last Welcome said them."""
    import dataclasses

    from tests.colocate.test_protocol import FEATURES

    link, rt, node, clock = wired
    dev = rt.device

    def set_speed(s, type_name=""):
        dev.speed, dev.type_name = s, type_name

    dev.set_speed = set_speed
    ident, reg = node.recv()
    node.send(ident, dataclasses.replace(welcome(5, 1, 0.5), sim_speed=speed, sim_type=sim_type))
    assert link.registered.wait(5), "the Welcome was not taken"
    hw = dataclasses.replace(FEATURES.hardware, kind="sim", name="colocate-sim", sim_speed=0.5)  # stale
    rt.features = dataclasses.replace(FEATURES, hardware=hw)
    for fn in rt._features_hooks:
        fn(rt.features)
    _, msg = node.recv(skip=(P.Heartbeat, P.LimitsApplied))
    assert (msg.features.hardware.name, msg.features.hardware.sim_speed) == (name, speed)
    assert msg.features.model == FEATURES.model


class HeldClock(FakeClock):
    """A FakeClock that can hold the link thread at its next read (``hold``) until ``release``: the test acts
    while the thread is between its poll and its next look at the stop flag."""

    def __init__(self):
        import threading

        super().__init__()
        self._armed, self.entered, self._go = False, threading.Event(), threading.Event()

    def __call__(self) -> float:
        if self._armed:
            self._armed = False
            self.entered.set()
            assert self._go.wait(5), "the test never released the clock"
        return super().__call__()

    def hold(self) -> None:
        self.entered.clear()
        self._go.clear()
        self._armed = True

    def release(self) -> None:
        self._go.set()


def test_reports_handed_over_just_before_stop_are_sent_before_the_goodbye(ipc_dir):
    """The last mini-batches' reports reach the node even when the job stops while they wait in the link's
    in-process queue: the link thread had polled before they came, and looks at the stop flag next."""
    from torch_hooks.records import BatchRecord

    endpoint = f"ipc://{ipc_dir}/node.sock"
    node, clock = FakeNode(endpoint), HeldClock()
    env = JobEnv(job_id="j", klass="opportunistic", device="sim", node=endpoint, yield_via=(), token="tok")
    rt = Runtime(env, MiniDevice())
    link = NodeLink(env, rt, clock=clock)
    link.start()
    try:
        ident, _ = node.recv()
        node.send(ident, welcome(5, 1, 0.5))
        assert link.registered.wait(5), "the Welcome was not taken"
        clock.hold()
        node.send(ident, P.Error(code=P.INVALID, message="wake up", job_id="j"))  # the poll returns, then the clock
        assert clock.entered.wait(5), "the link thread did not read its clock"
        for i in range(1, 4):  # the training thread's last three batches, then the job's exit
            link._on_record(BatchRecord(index=i, t_end=float(i), duration_s=0.1, busy_s=0.1, idle_s=0.0,
                                        host_penalty_s=0.0, device_start_s=None, mem_allocated_peak=1, mem_reserved=1,
                                        mem_reserved_peak=1, mem_cap=GiB, mem_floor=0, host_bytes=0,
                                        host_bytes_touched=0, sm_share=0.5, limits_seq=1))
        link._stop.set()
        clock.release()
        link.stop(timeout=5)
        assert not link._thread.is_alive(), "the link thread did not stop"
        while not isinstance(node.recv(skip=())[1], P.Goodbye):
            pass
        got = [m.seq for _, m in node.seen if isinstance(m, P.BatchReport)]
        assert got == [1, 2, 3], f"reports the node got before the Goodbye: {got}"
    finally:
        clock.release()
        link._ctx.destroy(linger=0)
        node.close()


def test_a_job_no_node_answered_says_so_when_it_stops(wired, caplog):
    """``colocate run --node`` with a mistyped endpoint ran outside any node's policy without a word. A job that
    ends within a heartbeat period of its Register says nothing: the Welcome may be on its way."""
    link, rt, node, clock = wired
    node.recv()  # the Register went out: the link's clock was read for it
    clock.advance(0.5)
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        link.stop(timeout=5)
    assert "answered" not in caplog.text
    clock.advance(0.5)  # a whole (default) heartbeat period without an answer
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        link.stop(timeout=5)
    assert "no node coordinator at ipc://" in caplog.text and "answered this job in 1.0 s" in caplog.text


def test_a_welcomed_job_stops_without_a_warning(wired, caplog):
    link, rt, node, clock = wired
    registered(wired)
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        link.stop(timeout=5)
    assert "answered" not in caplog.text


def test_a_forked_child_drops_the_parents_link_hooks(ipc_dir):
    """A child ``os.fork`` made runs on with the runtime: the link's hooks go (its ZeroMQ sockets are the
    parent's), the runtime's own stay, and the child counts from the fork."""
    env = JobEnv(job_id="j", klass="guaranteed", device="sim", node=f"ipc://{ipc_dir}/node.sock", yield_via=())
    rt = Runtime(env, MiniDevice())
    mine = []
    rt.add_listener(mine.append)
    link = NodeLink(env, rt)
    try:
        rt.book.iterations = 7
        owned = [f for hooks in (rt._listeners, rt._features_hooks, rt._paused_apply_hooks, rt._start_hooks,
                                 rt._end_hooks) for f in hooks if getattr(f, "__self__", None) in (link, link.publisher)]
        assert len(owned) == 5  # records, features, paused acks, and the guaranteed job's gate phases
        rt.forked((link, link.publisher))
        assert rt._listeners == [mine.append] and not rt._features_hooks and not rt._paused_apply_hooks
        assert not rt._start_hooks and not rt._end_hooks and rt.book.iterations == 0
    finally:
        link.publisher.close()
        link._ctx.destroy(linger=0)
