"""colocate/node/server.py in-process: the node's ZeroMQ edge on real ipc sockets, driven by a fake clock.

A ``NodeServer`` serves in a thread (``tests.support.ServerHarness``); the tests speak to it with DEALER
sockets, frame by frame, and read its core and counters under its lock. Nothing time-driven happens unless a
test moves the clock (``tick``), so every wait is for a message or a tick, with a deadline.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import Counter

import pytest
import zmq

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node import record
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore
from colocate.node.server import NodeServer
from tests.support import GiB, ServerHarness, pack, wait_for

PID = os.getpid()  # registered jobs are this (live) process, so no tick finds them gone


@pytest.fixture
def node(ipc_dir):
    h = ServerHarness(ipc_dir)
    yield h
    h.close()


def register(job_id="j1", pid=PID, priority="opportunistic", gpu=0, epoch=1, share=1.0, token="t"):
    return P.Register(job_id=job_id, pid=pid, gpu=gpu, priority=priority, mem_request=None, sm_share=share,
                      mem_cap=16 * GiB, epoch=epoch, token=token, sm_request=1.0)


def report(job_id="j1", seq=0, limits_seq=1):
    return P.BatchReport(job_id=job_id, seq=seq, t_end=1.0, duration_s=0.1, busy_s=0.05, device_start_s=0.0,
                         mem_allocated_peak=GiB, mem_reserved=GiB, mem_floor=0, host_bytes=0,
                         host_bytes_touched=0, limits_seq=limits_seq)


def error_code(reply) -> str:
    assert isinstance(reply, P.Error), reply
    return reply.code


def sync(conn, job_id="j1"):
    """Handshake: a heartbeat's echo means the server has handled everything this connection sent before."""
    assert isinstance(conn.ask(P.Heartbeat(job_id=job_id, sent_at=1.0)), P.Heartbeat)


def counts(node):
    return node.state(lambda core: (Counter(node.server.counts), Counter(node.server.bad_counts)))


# ---------------------------------------------------------------- frames the node cannot take


BAD_FRAMES = [
    ("garbage", b"\x00\xff\xfe garbage \xc1", P.MALFORMED),
    ("empty", b"", P.MALFORMED),
    ("two frames", [b"a", b"b"], P.MALFORMED),
    ("not a map", pack([1, 2, 3]), P.MALFORMED),
    ("another version", pack({"v": 99, "t": "heartbeat", "job_id": "x", "sent_at": 1.0}), P.VERSION),
    ("unknown type", pack({"v": P.PROTOCOL_VERSION, "t": "launch_missiles"}), P.UNKNOWN_TYPE),
    ("register with share 1.5", pack({**P.to_wire(register()), "sm_share": 1.5}), P.INVALID),
]


def test_bad_frames_are_answered_with_an_error_and_counted_by_code(node):
    conn = node.connect()
    for name, data, code in BAD_FRAMES:
        assert error_code(conn.ask(data)) == code, name
    msgs, bad = counts(node)
    assert bad == Counter(code for _, _, code in BAD_FRAMES)
    assert not msgs  # nothing was decoded, so no message type was counted
    assert node.state(lambda core: dict(core.jobs)) == {}
    # the server carries on: a good message after them is served
    assert isinstance(conn.ask(register()), P.Welcome)


@pytest.mark.parametrize("ctl, msg", [
    (False, P.CtlList()),
    (False, P.CtlSet(job_id="j1", mem_cap=None, sm_share=0.5)),
    (False, P.SetLimits(job_id="j1", limits=P.Limits(seq=9, mem_cap=1, sm_share=1.0, gate=False))),
    (False, P.Welcome(job_id="j1", node_epoch=1, limits=P.Limits(seq=9, mem_cap=1, sm_share=1.0, gate=False))),
    (True, register()),
    (True, P.Heartbeat(job_id="j1", sent_at=1.0)),
    (True, report()),
    (True, P.Goodbye(job_id="j1", exit_code=0, reason="x")),
], ids=lambda v: type(v).__name__ if isinstance(v, P.Message) else ("ctl" if v else "job"))
def test_a_type_not_accepted_on_an_endpoint_is_forbidden(node, ctl, msg):
    owner = node.connect()
    assert isinstance(owner.ask(register(share=0.5)), P.Welcome)
    before = node.state(lambda core: (core.jobs["j1"].limits, core.jobs["j1"].iterations))
    conn = node.connect(ctl=ctl)
    assert error_code(conn.ask(msg)) == P.FORBIDDEN
    msgs, bad = counts(node)
    assert bad == Counter({P.FORBIDDEN: 1})
    assert msgs[msg.TYPE] == (2 if msg.TYPE == "register" else 1)  # decoded and counted, then refused
    # it changed nothing: the job is as it was, no limits were pushed to it
    assert node.state(lambda core: (core.jobs["j1"].limits, core.jobs["j1"].iterations)) == before
    assert isinstance(owner.ask(P.Heartbeat(job_id="j1", sent_at=2.0)), P.Heartbeat)
    assert owner.limits == []


# ---------------------------------------------------------------- a connection is its job


def test_register_binds_the_connection_and_another_cannot_speak_for_the_job(node):
    owner, intruder, ctl = node.connect(), node.connect(), node.connect(ctl=True)
    welcome = owner.ask(register("victim", share=0.25))
    assert isinstance(welcome, P.Welcome) and welcome.job_id == "victim" and welcome.node_epoch == 42
    assert (welcome.heartbeat_s, welcome.liveness) == (NodeConfig().heartbeat_s, NodeConfig().liveness)
    before = node.state(lambda core: (core.jobs["victim"].limits, core.jobs["victim"].iterations,
                                      core.jobs["victim"].last_seen))
    for msg in (P.Heartbeat(job_id="victim", sent_at=1.0),
                report("victim"),
                P.LimitsApplied(job_id="victim", limits_seq=99, applied_at=1.0),
                P.Goodbye(job_id="victim", exit_code=0, reason="hijack")):
        assert error_code(intruder.ask(msg)) == P.FORBIDDEN, msg
    # the same job id claimed for a process that is not the caller's is refused (SO_PEERCRED), the binding stays
    assert error_code(intruder.ask(register("victim", pid=os.getppid()))) == P.FORBIDDEN
    # and for the caller's own pid, by the core (the job id is in use by another connection)
    assert error_code(intruder.ask(register("victim", token="other"))) == P.REJECTED
    assert node.state(lambda core: (core.jobs["victim"].limits, core.jobs["victim"].iterations,
                                    core.jobs["victim"].last_seen)) == before
    # what the node sends the job on its own goes to the bound connection: an operator override
    reply = ctl.ask(P.CtlSet(job_id="victim", mem_cap=None, sm_share=0.125))
    assert isinstance(reply, P.CtlOk) and "share 0.125" in reply.message
    pushed = owner.wait_limits(lambda m: m.limits.sm_share == 0.125)
    assert pushed.job_id == "victim" and pushed.limits.seq > welcome.limits.seq
    assert intruder.limits == []
    echo = owner.ask(P.Heartbeat(job_id="victim", sent_at=2.0))
    assert isinstance(echo, P.Heartbeat) and echo.job_id == "victim"
    _, bad = counts(node)
    assert bad == Counter({P.FORBIDDEN: 5, P.REJECTED: 1})


def test_a_job_that_registers_again_from_a_new_connection_is_bound_to_it(node):
    old, new, ctl = node.connect(), node.connect(), node.connect(ctl=True)
    assert isinstance(old.ask(register(epoch=1)), P.Welcome)
    # its link reconnected (a new DEALER, a new identity): the same job, pid and token register again
    welcome = new.ask(register(epoch=2))
    assert isinstance(welcome, P.Welcome)
    assert node.state(lambda core: list(core.jobs)) == ["j1"]
    assert isinstance(new.ask(P.Heartbeat(job_id="j1", sent_at=1.0)), P.Heartbeat)
    assert error_code(old.ask(P.Heartbeat(job_id="j1", sent_at=1.0))) == P.FORBIDDEN
    assert isinstance(ctl.ask(P.CtlSet(job_id="j1", mem_cap=GiB, sm_share=None)), P.CtlOk)
    assert new.wait_limits(lambda m: m.limits.mem_cap == GiB).limits.seq > welcome.limits.seq
    assert old.limits == []


@pytest.fixture
def child():
    """A live process this one started: a registration may claim it (``colocate.base.peercred.claims``)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_job_that_leaves_is_unbound_and_its_id_free(node, child):
    owner, other = node.connect(), node.connect()
    assert isinstance(owner.ask(register()), P.Welcome)
    owner.send(P.Goodbye(job_id="j1", exit_code=0, reason="done"))
    # (no reply to a goodbye; the next answer comes after it was handled) the former owner speaks for an
    # unknown job now: the core's answer, not the edge's
    assert error_code(owner.ask(P.Heartbeat(job_id="j1", sent_at=1.0))) == P.UNKNOWN_JOB
    assert node.state(lambda core: (dict(core.jobs), core.jobs_exited)) == ({}, 1)
    # nor is any other connection refused for it: the node does not know the job (a link that hears this
    # registers again)
    assert error_code(other.ask(P.Heartbeat(job_id="j1", sent_at=1.0))) == P.UNKNOWN_JOB
    # another process may take the id, from another connection
    assert isinstance(other.ask(register(pid=child.pid)), P.Welcome)
    assert error_code(owner.ask(report())) == P.FORBIDDEN
    _, bad = counts(node)
    assert bad == Counter({P.UNKNOWN_JOB: 2, P.FORBIDDEN: 1})


def test_error_replies_of_the_core_are_counted_by_code(node, caplog, child):
    conn, ctl = node.connect(), node.connect(ctl=True)
    with caplog.at_level(logging.INFO, logger="colocate.node"):
        assert error_code(conn.ask(report("nobody"))) == P.UNKNOWN_JOB
        assert error_code(conn.ask(register(gpu=7))) == P.INVALID  # a GPU the node does not have
        assert error_code(ctl.ask(P.CtlSet(job_id="nobody", mem_cap=GiB, sm_share=None))) == P.UNKNOWN_JOB
        assert isinstance(conn.ask(register("g1", priority="guaranteed")), P.Welcome)
        assert error_code(node.connect().ask(register("g2", priority="guaranteed", pid=child.pid))) \
            == P.REJECTED  # a second guaranteed job on the GPU
    _, bad = counts(node)
    assert bad == Counter({P.UNKNOWN_JOB: 2, P.INVALID: 1, P.REJECTED: 1})
    assert "rejected Register: GPU 0 already runs guaranteed job g1" in caplog.text
    assert "job g1 registered: gpu 0 guaranteed" in caplog.text


# ---------------------------------------------------------------- time: the record and the ticks


def test_the_record_is_on_the_node_clock(node):
    conn, ctl = node.connect(), node.connect(ctl=True)
    t_reg = node.clock()
    welcome = conn.ask(register())
    t_report = node.clock.advance(0.25)
    conn.send(report(limits_seq=welcome.limits.seq))
    sync(conn)
    t_set = node.clock.advance(0.5)
    assert isinstance(ctl.ask(P.CtlSet(job_id="j1", mem_cap=None, sm_share=0.5)), P.CtlOk)
    pushed = conn.wait_limits(lambda m: m.limits.sm_share == 0.5)
    t_applied = node.clock.advance(0.125)
    conn.send(P.LimitsApplied(job_id="j1", limits_seq=pushed.limits.seq, applied_at=77.0))
    sync(conn)
    rec = record.read(node.record_path)
    assert [(b.job_id, b.node_t, b.klass, b.gpu, b.limits_seq) for b in rec.batches] == \
        [("j1", t_report, "opportunistic", 0, welcome.limits.seq)]
    assert [(r["node_t"], r["limits"]["seq"], r["limits"]["sm_share"]) for r in rec.limits] == \
        [(t_set, pushed.limits.seq, 0.5)]
    assert [(r["node_t"], r["limits_seq"], r["applied_at"]) for r in rec.applied] == \
        [(t_applied, pushed.limits.seq, 77.0)]
    assert t_reg < t_report  # the Welcome is no record row: registration is in the log
    assert node.state(lambda core: (core.control_count, core.control_sum_s)) == (1, 0.125)


def test_a_job_whose_process_is_gone_is_lost_at_the_next_tick(node, caplog, child):
    pid = child.pid
    conn = node.connect()
    assert isinstance(conn.ask(register("gone", pid=pid)), P.Welcome)
    child.kill()
    child.wait(10)  # exited and reaped
    assert isinstance(conn.ask(register("alive")), P.Welcome)
    with caplog.at_level(logging.INFO, logger="colocate.node"):
        node.tick()
    assert node.state(lambda core: (sorted(core.jobs), core.jobs_lost, core.jobs_exited)) == (["alive"], 1, 0)
    assert f"job gone left: process {pid} is gone" in caplog.text
    assert error_code(conn.ask(P.Heartbeat(job_id="gone", sent_at=1.0))) == P.UNKNOWN_JOB  # unbound, gone


def test_a_silent_job_is_lost_once_its_liveness_runs_out(node):
    cfg = NodeConfig()
    conn = node.connect()
    assert isinstance(conn.ask(register("quiet")), P.Welcome)
    assert isinstance(conn.ask(register("chatty")), P.Welcome)
    for _ in range(cfg.liveness + 1):  # the chatty one heartbeats every heartbeat_s; the quiet one never
        node.tick(cfg.heartbeat_s)
        assert isinstance(conn.ask(P.Heartbeat(job_id="chatty", sent_at=1.0)), P.Heartbeat)
    assert node.state(lambda core: (sorted(core.jobs), core.jobs_lost)) == (["chatty"], 1)


def test_a_second_server_cannot_take_a_live_endpoint(node):
    core = NodeCore([GpuSpec(index=0, kind="sim", mem_total=GiB)], NodeConfig(), node_epoch=1)
    with pytest.raises(zmq.ZMQError, match="in use"):
        NodeServer(core, node.endpoint)
    assert isinstance(node.connect().ask(register()), P.Welcome)  # the first one still serves


@pytest.mark.parametrize("ctl", [False, True], ids=["jobs", "ctl"])
def test_a_frame_over_the_limit_is_refused_by_the_socket_unread(node, ctl):
    from zmq.utils.monitor import recv_monitor_message

    conn = node.connect(ctl=ctl)
    monitor = conn.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    conn.send(bytes(P.MAX_FRAME_BYTES + 1))  # the socket's limit: a message's, plus room for what CURVE adds
    got = []

    def dropped():
        if monitor.poll(0):
            got.append(recv_monitor_message(monitor))
        if conn.sock.poll(0):
            got.append(P.decode(conn.sock.recv()))  # the old node read it whole and answered "malformed"
        return got
    wait_for(dropped, 10, what="the node to drop the connection")
    assert isinstance(got[0], dict) and got[0]["event"] == zmq.EVENT_DISCONNECTED, got
    conn.sock.disable_monitor()
    assert isinstance(node.connect(ctl=ctl).ask(P.CtlList() if ctl else register()), (P.CtlJobs, P.Welcome))


def test_a_tick_after_a_stalled_loop_reads_the_jobs_waiting_messages_before_it_counts_silence(ipc_dir):
    """The loop was busy elsewhere for longer than a job's liveness (a placement's start, the scheduler's link)
    while the job's heartbeat waited on the socket: the tick takes it in first and the job stays."""
    from tests.support import Conn, FakeClock

    clock = FakeClock()
    core = NodeCore([GpuSpec(index=0, kind="sim", mem_total=16 * GiB)], NodeConfig(), node_epoch=1)
    server = NodeServer(core, f"ipc://{ipc_dir}/node.sock", clock=clock)  # not serving: the test turns its loop
    ctx = zmq.Context()
    conn = Conn(ctx, server.endpoint)
    try:
        conn.send(register("stalled"))
        assert server.jobs_sock.poll(5000, zmq.POLLIN), "the register never arrived"
        server._drain(server.jobs_sock)
        assert isinstance(conn.next(), P.Welcome)
        cfg = NodeConfig()
        clock.advance(cfg.heartbeat_s * cfg.liveness * 2)  # the stall
        conn.send(P.Heartbeat(job_id="stalled", sent_at=1.0))
        assert server.jobs_sock.poll(5000, zmq.POLLIN), "the heartbeat never arrived"
        server._tick()
        assert sorted(core.jobs) == ["stalled"] and core.jobs_lost == 0
        assert isinstance(conn.next(), P.Heartbeat)
    finally:
        conn.sock.close(linger=0)
        ctx.term()
        server.close()


# ---------------------------------------------------------------- what one job cannot do to the node


def report_map(job_id="j1", seq=0, **over):
    """A batch report as a wire map (the protocol refuses to build one out of bounds)."""
    return pack({**P.to_wire(report(job_id, seq)), **over})


@pytest.mark.parametrize("field", ["duration_s", "busy_s", "device_start_s", "t_end"])
def test_report_seconds_beyond_the_protocols_bound_are_refused_and_the_node_goes_on(node, field):
    """QA's crash: reports of 1e308 s, then Goodbye, made a JobProgress of step_mean_s = inf and the node died."""
    conn = node.connect()
    assert isinstance(conn.ask(register()), P.Welcome)
    for seq in range(3):
        assert error_code(conn.ask(report_map(seq=seq, **{field: 1e308}))) == P.INVALID
    conn.send(report_map(seq=3, duration_s=P.MAX_REPORT_S, busy_s=P.MAX_REPORT_S))  # the bound itself is taken
    sync(conn)
    conn.send(P.Goodbye(job_id="j1", exit_code=0, reason="bye"))
    assert error_code(conn.ask(P.Heartbeat(job_id="j1", sent_at=1.0))) == P.UNKNOWN_JOB  # it left
    assert isinstance(node.connect().ask(register("next")), P.Welcome)  # the loop is alive
    final = node.state(lambda core: core.final["j1"])
    assert final.step_mean_s == P.MAX_REPORT_S and final.busy_fraction == 1.0


def test_tiny_durations_leave_the_operators_list_finite(node):
    """QA's crash: reports of 5e-324 s made ``colocate ctl list`` build a throughput of inf, and the node died."""
    conn, ctl = node.connect(), node.connect(ctl=True)
    assert isinstance(conn.ask(register()), P.Welcome)
    for seq in range(20):
        conn.send(report_map(seq=seq, duration_s=5e-324, busy_s=1.0))
    sync(conn)
    jobs = ctl.ask(P.CtlList())
    assert isinstance(jobs, P.CtlJobs) and jobs.jobs[0].throughput == 0.0  # nothing measured
    assert isinstance(conn.ask(P.Heartbeat(job_id="j1", sent_at=1.0)), P.Heartbeat)


def test_one_events_failure_is_one_log_line_and_the_loop_goes_on(node, caplog, monkeypatch):
    """A bug in handling one message or one tick must not stop the node: a line (rate-limited), then the next."""
    from colocate.node.events import NodeTick
    from colocate.node.server import MAX_FAILURE_LOGS_PER_S

    conn, ctl = node.connect(), node.connect(ctl=True)
    assert isinstance(conn.ask(register()), P.Welcome)
    handle = node.core.handle

    def failing(event, now):
        if isinstance(event, (P.CtlList, NodeTick)):
            raise OverflowError("a figure overflowed")
        return handle(event, now)

    monkeypatch.setattr(node.core, "handle", failing)
    with caplog.at_level(logging.INFO, logger="colocate.node"):
        for _ in range(10):
            ctl.send(P.CtlList())
        assert isinstance(ctl.ask(P.CtlSet(job_id="j1", mem_cap=None, sm_share=0.5)), P.CtlOk)  # served after them
        assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == \
            ["a message on the operator endpoint failed (left undone): OverflowError: a figure overflowed"] \
            * MAX_FAILURE_LOGS_PER_S
        node.tick(1.5)  # the loop goes on ticking, a second later its lines are let through again
        node.tick()
        sync(conn)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines[MAX_FAILURE_LOGS_PER_S:] == [
        f"(5 such lines left out: over {MAX_FAILURE_LOGS_PER_S} a second)",
        "the tick failed (left undone): OverflowError: a figure overflowed",
        "the tick failed (left undone): OverflowError: a figure overflowed"], lines
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO)  # one line each, no traceback
    assert node.state(lambda core: core.jobs["j1"].limits.sm_share) == 0.5


FORGED = "x)\n2026-11-29 13:00:00,000 colocate-node WARNING FORGED: node shutting down \x1b[2J("


def test_a_peers_text_is_escaped_in_the_log(node, caplog):
    conn, stranger = node.connect(), node.connect()
    assert isinstance(conn.ask(register()), P.Welcome)
    with caplog.at_level(logging.INFO, logger="colocate.node"):
        stranger.send(P.Error(code=P.MALFORMED, message=FORGED, job_id=None))  # an unregistered connection
        conn.send(P.Error(code=P.MALFORMED, message=FORGED, job_id="j1"))
        conn.send(P.Goodbye(job_id="j1", exit_code=0, reason=FORGED))
        assert error_code(stranger.ask(P.Heartbeat(job_id="nobody", sent_at=1.0))) == P.UNKNOWN_JOB
        assert error_code(conn.ask(P.Heartbeat(job_id="j1", sent_at=1.0))) == P.UNKNOWN_JOB  # it left
    lines = [r.getMessage() for r in caplog.records]
    assert all("\n" not in m and "\x1b" not in m for m in lines), lines
    escaped = "x)\\n2026-11-29 13:00:00,000 colocate-node WARNING FORGED: node shutting down \\x1b[2J("
    assert sum(escaped in m for m in lines) == 3, lines
    assert any(m.startswith("job j1 left: exited (") for m in lines)
    assert any(m.startswith("an unregistered connection (job None) reports error malformed") for m in lines)


def handled(conn):
    """Wait until the node has handled all ``conn`` sent (their replies read and dropped)."""
    conn.send(P.Heartbeat(job_id="nobody", sent_at=1.0))
    while not (isinstance(reply := conn.next(), P.Error) and reply.code == P.UNKNOWN_JOB):
        pass


@pytest.mark.parametrize("flood", ["error", "rejected register", "bad"])
def test_every_line_a_peer_can_cause_is_rate_limited(node, caplog, flood):
    """QA's floods: 20,000 Error messages from an unregistered connection logged 20,000 lines in a second,
    3,000 Registers for a GPU the node lacks 3,000 "rejected" lines."""
    from colocate.node.server import MAX_BAD_LOGS_PER_S

    conn = node.connect()
    msg = {"error": P.encode(P.Error(code=P.MALFORMED, message="flood", job_id=None)),
           "rejected register": P.encode(register(gpu=99)),
           "bad": b"\x00 garbage"}[flood]
    with caplog.at_level(logging.INFO, logger="colocate.node"):
        for _ in range(200):
            conn.send(msg)
        handled(conn)
        assert len(caplog.records) == MAX_BAD_LOGS_PER_S
        node.clock.advance(1.5)  # a second later: the count of what was left out, then the line
        conn.send(msg)
        handled(conn)
    tail = [r.getMessage() for r in caplog.records[MAX_BAD_LOGS_PER_S:]]
    assert len(tail) == 2 and tail[0] == f"(180 such lines left out: over {MAX_BAD_LOGS_PER_S} a second)", tail
