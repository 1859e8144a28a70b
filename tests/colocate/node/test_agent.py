"""SchedulerAgent against a fake scheduler ROUTER (tests/support.FakeScheduler) on real TCP sockets.

The agent runs on a fake clock the test moves, so liveness and backoff are exact; the ZeroMQ traffic is
real, and every wait is ``FakeScheduler.expect`` (a deadline) while the test pumps the agent the way the
node's loop does (input, then a tick). The worker manager is a recording fake: what the agent does with
scheduler messages is the subject here (tests/colocate/node/test_workers.py covers the real one).
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import zmq

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node.agent import SchedulerAgent
from tests.colocate.node.test_progress import core, features, register, report
from tests.support import FakeScheduler, GiB, wait_for

GPU_STATUS = [P.GpuStatus(index=0, utilization=0.25, mem_used=123), P.GpuStatus(index=1, utilization=0.0, mem_used=0)]
REQUEST = P.JobRequest(command=("python", "t.py"), cwd="/", env={})


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeWorkers:
    """Records what the agent asks; returns what the test sets."""

    cfg = SimpleNamespace(lease_file=None)

    def __init__(self):
        self.calls, self.recovered, self.events, self.placed = [], [], [], []

    def recover(self):
        return list(self.recovered)

    def start(self, msg):
        self.calls.append(("start", msg.placement_id))
        return [P.WorkerStarted(node_id="n1", epoch=7, job_id=msg.job_id, placement_id=msg.placement_id, rank=w.rank,
                                pid=100 + w.rank, log_path=f"/logs/{w.rank}") for w in msg.workers]

    def stop(self, placement_id, grace_s, job_id="", cluster_id=""):
        self.calls.append(("stop", placement_id, grace_s, job_id))
        return []

    def promote(self, placement_id, cluster_id=""):
        self.calls.append(("promote", placement_id))
        if placement_id == "p1":
            return "job-a"
        return None

    def welcomed(self, cluster_id):
        self.calls.append(("welcomed", cluster_id))
        return []

    def fence(self, lapsed):
        return []

    def poll(self, now):
        out, self.events = self.events, []
        return out

    def status(self):
        return [P.WorkerStatus(job_id="job-a", placement_id="p1", rank=0, pid=100, running=True)]

    def placements(self):
        return list(self.placed)

    def close(self):
        self.calls.append(("close",))


class Rig:
    def __init__(self, keys_dir=None, start=True, workers=None):
        self.sched = FakeScheduler()
        self.clock = Clock()
        self.workers = workers or FakeWorkers()
        self.agent = SchedulerAgent(
            self.sched.endpoint, "n1", epoch=7, host="10.0.0.7",
            gpus=[GpuSpec(0, "sim", GiB, "colocate-sim", 1), GpuSpec(1, "sim", GiB, "colocate-sim", 0)],
            workers=self.workers, gpu_status=lambda now: list(GPU_STATUS),
            keys_dir=keys_dir, clock=self.clock, wall=self.clock, backoff_min_s=0.5, backoff_max_s=4.0)
        if start:
            self.agent.start()

    def pump(self) -> None:
        """One turn of the node's loop: the agent's input, then its tick."""
        if self.agent.sock is not None and self.agent.sock.poll(0):
            self.agent.on_readable()
        self.agent.tick()

    def expect(self, cls, timeout_s=10.0, **kw):
        return self.sched.expect(cls, timeout_s, between=self.pump, **kw)

    def joined(self, heartbeat_s=1.0, liveness=3) -> bytes:
        """Hello, welcome, and the full status that follows; returns the node's identity."""
        ident, _ = self.expect(P.NodeHello)
        self.sched.welcome(ident, "n1", heartbeat_s=heartbeat_s, liveness=liveness)
        self.expect(P.NodeStatus)
        return ident

    def quiet(self, seconds=0.3) -> list:
        """Pump for a while (real time, the fake clock still) and return what the scheduler got."""
        got, deadline = [], __import__("time").monotonic() + seconds
        while __import__("time").monotonic() < deadline:
            self.pump()
            m = self.sched.recv(0.02)
            if m is not None:
                got.append(m[1])
        return got

    def close(self):
        self.agent.close()
        self.sched.close()


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def test_hello_welcome_then_heartbeats_and_status(rig):
    ident, hello = rig.expect(P.NodeHello)
    assert (hello.node_id, hello.epoch, hello.host) == ("n1", 7, "10.0.0.7")
    assert hello.gpus == (P.NodeGpu(0, "colocate-sim", GiB, 1.0), P.NodeGpu(1, "colocate-sim", GiB, 1.0))  # sim: speed
    assert hello.cpu_milli >= 1000 and hello.mem_mib > 0
    rig.clock.t += 2.0  # within the default liveness (1 s x 3) before a welcome
    assert not [m for m in rig.quiet() if isinstance(m, (P.NodeHeartbeat, P.NodeStatus))]  # nothing before a welcome
    rig.sched.welcome(ident, "n1", heartbeat_s=1.0, liveness=3)
    _, status = rig.expect(P.NodeStatus)  # a full status right after the welcome
    assert status.gpus == tuple(GPU_STATUS) and status.epoch == 7
    assert status.workers == (P.WorkerStatus(job_id="job-a", placement_id="p1", rank=0, pid=100, running=True),)
    assert rig.agent.welcomed and (rig.agent.heartbeat_s, rig.agent.liveness) == (1.0, 3)
    assert not [m for m in rig.quiet() if isinstance(m, P.NodeHeartbeat)]  # not due yet
    rig.clock.t += 1.0
    _, beat = rig.expect(P.NodeHeartbeat)
    assert (beat.node_id, beat.epoch) == ("n1", 7)
    rig.sched.send(ident, P.NodeHeartbeat(node_id="n1", epoch=1))
    rig.expect(P.NodeStatus)  # and a status every second


def test_silence_reconnects_with_a_doubling_backoff_and_hello_again(rig):
    first = rig.joined(heartbeat_s=1.0, liveness=3)
    sock = rig.agent.sock
    rig.clock.t += 2.9
    rig.quiet(0.1)
    assert rig.agent.sock is sock  # 2.9 s of silence < heartbeat_s x liveness
    rig.clock.t += 0.2
    rig.pump()
    assert rig.agent.sock is None and not rig.agent.welcomed  # dropped after 3.1 s
    rig.quiet(0.2)
    assert rig.agent.sock is None  # waiting out the backoff (0.5 s on the agent's clock)
    rig.clock.t += 0.5
    second, hello = rig.expect(P.NodeHello)
    assert second != first and hello.epoch == 7  # a new connection, the same incarnation
    rig.clock.t += 3.1  # no welcome: silent again
    rig.pump()
    assert rig.agent.sock is None
    rig.clock.t += 0.9
    rig.quiet(0.2)
    assert rig.agent.sock is None  # the backoff doubled to 1.0 s
    rig.clock.t += 0.2
    third, _ = rig.expect(P.NodeHello)
    rig.sched.welcome(third, "n1")
    rig.expect(P.NodeStatus)
    assert rig.agent.backoff_s == 0.5 and rig.agent.connects == 3 and rig.agent.welcomes == 2  # reset by a welcome


def test_unknown_node_error_means_hello_again_and_a_full_status(rig):
    ident = rig.joined()
    rig.sched.send(ident, P.Error(code=P.UNKNOWN_NODE, message="node n1 is not registered: say hello", job_id=None))
    again, hello = rig.expect(P.NodeHello)
    assert again == ident and hello.epoch == 7 and not rig.agent.welcomed
    rig.sched.welcome(ident, "n1")
    _, status = rig.expect(P.NodeStatus)
    assert status.workers and status.gpus == tuple(GPU_STATUS)


def test_a_burst_of_unknown_node_answers_makes_one_hello_and_an_unanswered_one_is_said_again(rig):
    """A restarted scheduler answers each message the node sent before its hello reached it with UNKNOWN_NODE:
    the node says hello again once, not once per answer, and again only once a heartbeat period (1 s) passed."""
    ident = rig.joined(heartbeat_s=1.0)
    unknown = P.Error(code=P.UNKNOWN_NODE, message="node n1 is not registered: say hello", job_id=None)
    for _ in range(5):
        rig.sched.send(ident, unknown)
    rig.expect(P.NodeHello)
    assert [m for m in rig.quiet(0.5) if isinstance(m, P.NodeHello)] == []  # the other 4 answers: no hello
    rig.clock.t += 1.0
    rig.sched.send(ident, unknown)
    rig.expect(P.NodeHello)  # unanswered for a heartbeat period: said again


def test_start_stop_and_promote_reach_the_worker_manager(rig):
    ident = rig.joined()
    start = P.StartPlacement(placement_id="p1", job_id="job-a", priority="opportunistic", request=REQUEST,
                             workers=(P.WorkerLaunch(0, 0, (0,)), P.WorkerLaunch(1, 1, (1,))), world_size=2,
                             group_rank=0, master_addr="10.0.0.7", master_port=29500)
    rig.sched.send(ident, start)
    _, started = rig.expect(P.WorkerStarted, pred=lambda m: m.rank == 1)
    assert started.placement_id == "p1" and started.log_path == "/logs/1"
    rig.sched.send(ident, P.StopPlacement(placement_id="p1", job_id="job-a", reason="preempted", grace_s=3.0))
    # the handshake is the call itself: a periodic status may go out before the stop is read
    wait_for(lambda: (rig.pump(), ("stop", "p1", 3.0, "job-a") in rig.workers.calls)[1], 10,
             what="the stop to reach the worker manager")
    rig.expect(P.NodeStatus)  # a change: a status goes out
    rig.sched.send(ident, P.PromotePlacement(placement_id="p1", job_id="job-a"))
    wait_for(lambda: (rig.pump(), ("promote", "p1") in rig.workers.calls)[1], 10, what="the promotion")
    rig.sched.send(ident, P.PromotePlacement(placement_id="nope", job_id="job-b"))
    wait_for(lambda: (rig.pump(), ("promote", "nope") in rig.workers.calls)[1], 10, what="the second promote")
    rig.workers.events = [P.WorkerExited(node_id="n1", epoch=7, job_id="job-a", placement_id="p1", rank=0,
                                         exit_code=143)]
    _, gone = rig.expect(P.WorkerExited)
    assert gone.exit_code == 143


def test_bad_input_is_answered_and_the_link_carries_on(rig):
    ident = rig.joined()
    rig.sched.send(ident, b"\xc1 not msgpack")
    _, err = rig.expect(P.Error)
    assert err.code == P.MALFORMED
    rig.sched.send(ident, P.Submit(request=REQUEST))
    _, err = rig.expect(P.Error)
    assert err.code == P.FORBIDDEN and "submit" in err.message
    rig.sched.sock.send_multipart([ident, b"a", b"b"])
    _, err = rig.expect(P.Error)
    assert err.code == P.MALFORMED
    rig.sched.send(ident, P.NodeWelcome(node_id="someone-else", scheduler_epoch=9, heartbeat_s=0.01, liveness=1))
    rig.quiet(0.2)
    assert rig.agent.heartbeat_s == 1.0 and rig.agent.scheduler_epoch == 1  # ignored
    rig.clock.t += 1.0
    rig.expect(P.NodeHeartbeat)  # still beating


def test_events_wait_for_the_welcome():
    workers = FakeWorkers()
    workers.recovered = [P.WorkerExited(node_id="n1", epoch=7, job_id="job-a", placement_id="p0", rank=1, exit_code=-1)]
    r = Rig(workers=workers)
    try:
        ident, _ = r.expect(P.NodeHello)
        workers.events = [P.WorkerExited(node_id="n1", epoch=7, job_id="job-a", placement_id="p0", rank=2, exit_code=0)]
        assert not r.sched.of(P.WorkerExited) and not [m for m in r.quiet() if isinstance(m, P.WorkerExited)]
        r.sched.welcome(ident, "n1")
        r.expect(P.WorkerExited, pred=lambda m: m.rank == 2)
        assert [m.rank for m in r.sched.of(P.WorkerExited)] == [1, 2]  # in order, after the welcome
    finally:
        r.close()


def test_events_sent_into_silence_are_sent_again_after_the_next_welcome(rig):
    ident = rig.joined()
    rig.workers.events = [P.WorkerExited(node_id="n1", epoch=7, job_id="job-a", placement_id="p1", rank=0, exit_code=0)]
    rig.expect(P.WorkerExited)
    rig.clock.t += 3.5  # the scheduler never answered after that: maybe it never got it
    rig.pump()
    assert rig.agent.sock is None and len(rig.agent.pending) == 1
    rig.clock.t += 0.5
    ident, _ = rig.expect(P.NodeHello)
    rig.sched.welcome(ident, "n1")
    rig.expect(P.WorkerExited)
    assert len(rig.sched.of(P.WorkerExited)) == 2


def test_curve_the_node_connects_with_its_own_certificate(tmp_path):
    from colocate.base import keys as K

    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    keys = tmp_path / "keys"
    K.generate(str(keys), K.NODE, "n1")
    ctx = zmq.Context()
    auth = K.start_authenticator(ctx, str(keys))
    sched = FakeScheduler(ctx=ctx, keys_dir=str(keys))
    try:
        for admitted in (True, False):
            if not admitted:  # no longer admitted (read again as it changes): nothing of the node arrives
                os.unlink(keys / "authorized" / "node-n1.key")
            r = Rig(keys_dir=str(keys), start=False)
            r.sched.close()
            r.sched, r.agent.endpoint = sched, sched.endpoint
            r.agent.start()
            if admitted:
                _, hello = r.expect(P.NodeHello)
                assert hello.node_id == "n1" and r.agent._key_name() == "node-n1"
            else:
                assert not [m for m in r.quiet(1.0) if isinstance(m, P.NodeHello)]
            r.agent.close()
    finally:
        sched.close()
        auth.stop()
        ctx.term()


def test_a_missing_key_folder_fails_at_once(tmp_path):
    with pytest.raises(ValueError, match="missing key file"):
        Rig(keys_dir=str(tmp_path / "nokeys"), start=False)


def test_a_refused_hello_is_said_again_and_a_log_tail_is_answered_from_its_own_folder(tmp_path, caplog):
    r = Rig(start=False)
    r.agent.log_dir = str(tmp_path)
    (tmp_path / "unnamed" / "job-a").mkdir(parents=True)  # LOG_DIR/CLUSTER/JOB: a welcome naming no cluster
    (tmp_path / "unnamed" / "job-a" / "worker-1.p1.log").write_text("x" * 100 + "\nlast line\n")
    os.symlink("/etc/passwd", tmp_path / "unnamed" / "job-a" / "worker-2.p1.log")
    try:
        r.agent.start()
        ident, _ = r.expect(P.NodeHello)
        r.sched.send(ident, P.Error(code=P.FORBIDDEN, message="node id n1 is held by another live connection",
                                    job_id=None))
        r.clock.t += 2.9  # heard (the refusal): no reconnect, and no second hello yet
        assert not [m for m in r.quiet() if isinstance(m, P.NodeHello)]
        r.clock.t += 0.2  # past heartbeat x liveness (1 s x 3) without a welcome: hello again
        again, _ = r.expect(P.NodeHello)
        assert again == ident and r.agent.sock is not None
        r.sched.send(ident, P.Error(code=P.FORBIDDEN, message="node id n1 is held by another live connection",
                                    job_id=None))
        r.quiet()
        assert [m for m in caplog.messages if "refused this node" in m] == [  # logged once, however often
            "the scheduler refused this node: node id n1 is held by another live connection (hello again every 3.0 s)"]
        r.sched.welcome(ident, "n1")
        for rank, job in ((1, "job-a"), (2, "job-a"), (0, "../../etc")):
            r.sched.send(ident, P.LogTailRequest(request_id=f"q{rank}", job_id=job, rank=rank, max_bytes=11))
        tails = {}
        while len(tails) < 3:
            _, tail = r.expect(P.LogTail)
            tails[tail.request_id] = tail
        assert (tails["q1"].text, tails["q1"].truncated, tails["q1"].error) == ("\nlast line\n", True, "")
        assert tails["q2"].text == "" and "no log of worker 2 of job job-a on node n1" in tails["q2"].error
        assert tails["q0"].text == "" and tails["q0"].error  # the id is one safe path component: nothing found
    finally:
        r.close()


class LostTableWorkers(FakeWorkers):
    """A worker manager whose table was lost (``table.lost``), holding the epochs of ``held``."""

    def __init__(self, lease_file, lost: bool, held=()):
        super().__init__()
        self.cfg = SimpleNamespace(lease_file=str(lease_file))
        self.table = SimpleNamespace(lost=lost, restore=lambda: False, save=lambda: None)
        self.held = set(held)

    def epochs(self):
        return {7} | self.held


@pytest.mark.parametrize("lost", [True, False])
def test_a_node_revokes_the_last_lease_at_start_and_waits_it_out_after_a_lost_table(tmp_path, lost):
    """Issue 22, item 2: at start the lease file is rewritten with this incarnation's epoch and those it holds (the
    launchers of any other incarnation stop); after a lost table, no hello before that revoked lease has run out."""
    from colocate.base.endpoints import FENCE_GRACE_S, LEASE_CHECK_S
    from colocate.base.lease import lease_clock, read_lease, write_lease

    lease = tmp_path / "lease"
    write_lease(str(lease), lease_clock() + 300.0, FENCE_GRACE_S, epoch=3)
    r = Rig(workers=LostTableWorkers(lease, lost, held={5}))
    try:
        written = read_lease(str(lease))
        assert written.epoch == 7 and written.epochs == {5, 7} and written.until > lease_clock() + 200
        if lost:
            assert r.agent.sock is None and [m for m in r.quiet() if isinstance(m, P.NodeHello)] == []
            r.clock.t += FENCE_GRACE_S + 2 * LEASE_CHECK_S + 0.01
        r.expect(P.NodeHello)
    finally:
        r.close()


class LearningWorkers(FakeWorkers):
    """A node core with one registered worker that has reported its features."""

    def __init__(self):
        super().__init__()
        self.core = core()
        register(self.core)
        report(self.core, 0, 0.1, 0.05)
        self.core.handle(P.FeaturesReport(job_id="job-1", features=features(total=300)), 0.0)
        self.features = features(total=300)

    def progress(self, told):
        return self.core.progress(1.0, told)


def test_progress_rides_every_status_and_features_the_first_after_each_welcome():
    rig = Rig(workers=LearningWorkers())
    try:
        ident, _ = rig.expect(P.NodeHello)
        rig.sched.welcome(ident, "n1", heartbeat_s=1.0, liveness=3)
        _, first = rig.expect(P.NodeStatus)
        (p,) = first.progress
        assert (p.job_id, p.iterations, p.total_iterations) == ("job-1", 1, 300)
        assert p.features == rig.workers.features
        rig.clock.t += 1.0
        _, later = rig.expect(P.NodeStatus)
        assert later.progress[0].features is None and later.progress[0].total_iterations == 300
        rig.sched.send(ident, P.Error(code=P.UNKNOWN_NODE, message="restarted", job_id=None))  # it forgot the node
        ident, _ = rig.expect(P.NodeHello)
        rig.sched.welcome(ident, "n1", heartbeat_s=1.0, liveness=3)
        _, again = rig.expect(P.NodeStatus)
        assert again.progress[0].features == rig.workers.features
    finally:
        rig.close()


class LeavingWorkers(LearningWorkers):
    def left_with_progress(self):
        return bool(self.core.final)


def test_a_workers_last_progress_goes_out_before_its_exit():
    """job-1 says goodbye (the core keeps its last progress) and its process exits (reaped at the next poll):
    the next status, with that progress, reaches the scheduler before the exit."""
    rig = Rig(workers=LeavingWorkers())
    try:
        rig.joined()
        report(rig.workers.core, 1, 0.1, 0.05, reserved=300 << 20)  # its last mini-batch
        rig.workers.core.handle(P.Goodbye(job_id="job-1", exit_code=None, reason="exit"), 0.5)
        rig.workers.events = [P.WorkerExited(node_id="n1", epoch=7, job_id="job-1", placement_id="p1", rank=0,
                                             exit_code=0)]
        got = []
        while not any(isinstance(m, P.WorkerExited) for m in got):
            got.append(rig.expect((P.NodeStatus, P.WorkerExited))[1])
        assert isinstance(got[0], P.NodeStatus), got
        (p,) = got[0].progress
        assert (p.iterations, p.mem_reserved_peak) == (2, 300 << 20)
    finally:
        rig.close()


def test_a_log_tail_is_answered_for_the_welcoming_cluster_only(tmp_path):
    """QA: job ids restart at 1 with a new scheduler state file; the node answered the new cluster's `colocate logs
    1` with the old cluster's job 1 (another user's output). It reads the welcoming cluster's files only: the
    worker table's path first (``log_of``), else its folder."""

    class Workers(FakeWorkers):
        def log_of(self, job_id, rank, cluster_id):
            self.calls.append(("log_of", job_id, rank, cluster_id))
            return str(tmp_path / "table.log") if job_id == "2" else None

    (tmp_path / "c-old" / "1").mkdir(parents=True)
    (tmp_path / "c-old" / "1" / "worker-0.1.1.log").write_text("secret=alices-token\n")
    (tmp_path / "c-new" / "1").mkdir(parents=True)
    (tmp_path / "c-new" / "1" / "worker-0.1.1.log").write_text("bob was here\n")
    (tmp_path / "table.log").write_text("from the table\n")
    r = Rig(start=False, workers=Workers())
    r.agent.log_dir = str(tmp_path)
    try:
        r.agent.start()
        ident, _ = r.expect(P.NodeHello)
        r.sched.send(ident, P.NodeWelcome(node_id="n1", scheduler_epoch=1, heartbeat_s=0.2, liveness=3,
                                          cluster_id="c-new"))
        for job in ("1", "2"):
            r.sched.send(ident, P.LogTailRequest(request_id=f"q{job}", job_id=job, rank=0))
        tails = {}
        while len(tails) < 2:
            _, tail = r.expect(P.LogTail)
            tails[tail.request_id] = tail
        assert (tails["q1"].text, tails["q1"].error) == ("bob was here\n", "")
        assert (tails["q2"].text, tails["q2"].error) == ("from the table\n", "")
        assert ("log_of", "1", 0, "c-new") in r.workers.calls
    finally:
        r.close()
