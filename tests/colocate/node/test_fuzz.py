"""Bad input on the node's sockets: every bad message is answered with an Error, logged, and the daemon stays up.

A real `colocate node` process; raw ZeroMQ DEALER sockets in the test process send hand-made frames (the
protocol module refuses to build invalid messages, so those are packed with msgpack directly).
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colocate import protocol as P
from tests.support import NodeProc, Procs, ask, dealer, examples, pack, wait_for

GiB = 1 << 30


@pytest.fixture(scope="module")
def node():
    import shutil
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="clf-"))
    procs = Procs(tmp)
    try:
        yield NodeProc(procs, tmp, metrics=False, record=False).start()
    finally:
        procs.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture(scope="module")
def job_sock(ctx, node):
    s = dealer(ctx, node.endpoint)
    yield s
    s.close(0)


@pytest.fixture(scope="module")
def ctl_sock(ctx, node):
    s = dealer(ctx, node.ctl)
    yield s
    s.close(0)


def register_map(**over):
    m = {"v": P.PROTOCOL_VERSION, "t": "register", "job_id": "fz-job", "pid": os.getpid(), "gpu": 0,
         "priority": "opportunistic", "mem_request": None, "sm_share": 0.5, "mem_cap": GiB, "epoch": 1, "token": "",
         "sm_request": 1.0, "rank": None, "world_size": 1, "partition": False, "pick_gpu": False,
         "priority_yield": False}
    m.update(over)
    return m


REPORT = P.BatchReport(job_id="nobody-here", seq=0, t_end=1.0, duration_s=0.1, busy_s=0.05, device_start_s=0.0,
                       mem_allocated_peak=1, mem_reserved=1, mem_floor=0, host_bytes=0, host_bytes_touched=0,
                       limits_seq=0)

CASES = [
    ("garbage bytes", b"\x00\xff\xfe garbage \xc1", "malformed"),
    ("empty frame", b"", "malformed"),
    ("msgpack that is not a map", pack([1, 2, 3]), "malformed"),
    ("no type", pack({"v": P.PROTOCOL_VERSION}), "malformed"),
    ("wrong version", pack({"v": 99, "t": "heartbeat", "job_id": "x", "sent_at": 1.0}), "version"),
    ("no version", pack({"t": "heartbeat", "job_id": "x", "sent_at": 1.0}), "version"),
    ("unknown type", pack({"v": P.PROTOCOL_VERSION, "t": "launch_missiles"}), "unknown_type"),
    ("report for an unknown job", P.encode(REPORT), "unknown_job"),
    ("heartbeat for an unknown job", P.encode(P.Heartbeat(job_id="nobody-here", sent_at=1.0)), "unknown_job"),
    ("register with share 1.5", pack(register_map(sm_share=1.5)), "invalid"),
    ("register with a negative memory cap", pack(register_map(mem_cap=-1)), "invalid"),
    ("register with a negative memory request", pack(register_map(mem_request=-(1 << 30))), "invalid"),
    ("register with a negative pid", pack(register_map(pid=-5)), "invalid"),
    ("register with an unknown priority", pack(register_map(priority="vip")), "invalid"),
    ("register with an extra field", pack(register_map(root=True)), "invalid"),
    ("register on a GPU the node does not have", pack(register_map(gpu=7)), "invalid"),
    ("register with a NaN share", pack(register_map(sm_share=float("nan"))), "invalid"),
    ("ctl_set on the job endpoint", P.encode(P.CtlSet(job_id="fz-job", mem_cap=None, sm_share=1.0)), "forbidden"),
    ("ctl_list on the job endpoint", P.encode(P.CtlList()), "forbidden"),
    ("a node-to-job message sent to the node",
     P.encode(P.SetLimits(job_id="x", limits=P.Limits(seq=9, mem_cap=1, sm_share=1.0, gate=False))), "forbidden"),
    ("two frames", [b"a", b"b"], "malformed"),
]


@pytest.mark.parametrize("case, data, code", CASES, ids=[c[0] for c in CASES])
def test_bad_input_on_the_job_endpoint_gets_an_error(job_sock, case, data, code):
    reply = ask(job_sock, data)
    assert isinstance(reply, P.Error), reply
    assert reply.code == code, reply.message


@pytest.mark.parametrize("data, code", [
    (P.encode(P.Heartbeat(job_id="x", sent_at=1.0)), "forbidden"),
    (pack(register_map()), "forbidden"),
    (b"\x93garbage", "malformed"),
    (P.encode(P.CtlSet(job_id="nobody-here", mem_cap=GiB, sm_share=None)), "unknown_job"),
    (pack({"v": P.PROTOCOL_VERSION, "t": "ctl_set", "job_id": "x", "mem_cap": None, "sm_share": None}), "invalid"),
], ids=["heartbeat", "register", "garbage", "ctl_set for an unknown job", "ctl_set with nothing to set"])  # one id
# in every process (xdist's workers must collect the same tests; the register frame holds this process's pid)
def test_bad_input_on_the_operator_endpoint_gets_an_error(ctl_sock, data, code):
    reply = ask(ctl_sock, data)
    assert isinstance(reply, P.Error) and reply.code == code, reply


def test_a_connection_cannot_speak_for_another_job(ctx, node):
    owner, intruder = dealer(ctx, node.endpoint), dealer(ctx, node.endpoint)
    try:
        welcome = ask(owner, pack(register_map(job_id="victim", sm_share=0.25)))
        assert isinstance(welcome, P.Welcome) and welcome.job_id == "victim"
        limits = node.jobs()["victim"]
        for msg in (P.Heartbeat(job_id="victim", sent_at=1.0),
                    P.Goodbye(job_id="victim", exit_code=0, reason="hijack"),
                    P.LimitsApplied(job_id="victim", limits_seq=99, applied_at=1.0),
                    P.BatchReport(job_id="victim", seq=0, t_end=1.0, duration_s=0.1, busy_s=0.0, device_start_s=0.0,
                                  mem_allocated_peak=0, mem_reserved=10 * GiB, mem_floor=10 * GiB, host_bytes=0,
                                  host_bytes_touched=0, limits_seq=0)):
            reply = ask(intruder, P.encode(msg))
            assert isinstance(reply, P.Error) and reply.code == "forbidden", (msg, reply)
        # the same job id claimed for a process that is not the caller's is refused (SO_PEERCRED) ...
        reply = ask(intruder, pack(register_map(job_id="victim", pid=os.getppid())))
        assert isinstance(reply, P.Error) and reply.code == "forbidden", reply
        # ... and for the caller's own, by the node's core (the id is another connection's)
        reply = ask(intruder, pack(register_map(job_id="victim", token="other")))
        assert isinstance(reply, P.Error) and reply.code == "rejected", reply
        after = node.jobs()["victim"]
        assert (after.pid, after.iterations, after.mem_cap, after.sm_share) == \
            (limits.pid, limits.iterations, limits.mem_cap, limits.sm_share)
        # the owner still is the job
        echo = ask(owner, P.encode(P.Heartbeat(job_id="victim", sent_at=2.0)))
        assert isinstance(echo, P.Heartbeat) and echo.job_id == "victim"
        owner.send(P.encode(P.Goodbye(job_id="victim", exit_code=0, reason="done")))
        wait_for(lambda: "victim" not in node.jobs(), 5, what="the goodbye to be handled")
    finally:
        owner.close(0)
        intruder.close(0)


# ---------------------------------------------------------------- fuzz

_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
            | st.text(max_size=24) | st.binary(max_size=24))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_field_names = sorted({n for cls in P.MESSAGE_TYPES.values() for n in cls.__dataclass_fields__})
_keys = st.sampled_from(_field_names) | st.text(max_size=10)
_version = st.integers(0, 9).flatmap(lambda i: _scalars if i == 0 else st.just(P.PROTOCOL_VERSION))  # mostly right
_maps = st.builds(
    lambda head, body: {**body, **head},
    st.fixed_dictionaries({}, optional={
        "v": _version,
        "t": st.sampled_from(sorted(P.MESSAGE_TYPES)) | st.text(max_size=12),
    }),
    st.dictionaries(_keys, _values, max_size=14),
)
# every field of a real message type present, each with an arbitrary (often ill-typed or out-of-range) value
_plausible_value = _values | st.integers(-10, 10) | st.floats(-2.0, 2.0) | st.sampled_from(
    ["guaranteed", "opportunistic", "sim", "fz", ""])
_shaped = st.sampled_from(sorted(P.MESSAGE_TYPES)).flatmap(lambda t: st.fixed_dictionaries({
    "v": _version, "t": st.just(t),
    **{f: _plausible_value for f in P.MESSAGE_TYPES[t].__dataclass_fields__},
}))
_valid = st.sampled_from([
    P.encode(REPORT),
    P.encode(P.Heartbeat(job_id="fz", sent_at=0.5)),
    P.encode(P.Goodbye(job_id="fz", exit_code=None, reason="")),
    P.encode(P.CtlList()),
    P.encode(P.CtlSet(job_id="fz", mem_cap=1, sm_share=None)),
])
FRAMES = st.one_of(st.binary(max_size=600), _maps.map(pack), _shaped.map(pack), _valid)

_state = {"sent": 0, "expected": Counter(), "errors": Counter(), "replies": 0}


def _drain(sock) -> None:
    while True:
        try:
            data = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        _state["replies"] += 1
        msg = P.decode(data)  # the node only ever sends valid messages
        if isinstance(msg, P.Error):
            _state["errors"][msg.code] += 1


def _expect(data: bytes, on_ctl: bool) -> None:
    try:
        msg = P.decode(data)
    except P.ProtocolError as exc:
        _state["expected"][exc.code] += 1
        return
    allowed = P.CTL_TO_NODE if on_ctl else P.JOB_TO_NODE
    if not isinstance(msg, allowed):
        _state["expected"]["forbidden"] += 1


@settings(max_examples=examples(2000), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=FRAMES, on_ctl=st.integers(0, 9).map(lambda i: i == 0))
def _fuzz(job_sock, ctl_sock, data, on_ctl):
    sock = ctl_sock if on_ctl else job_sock
    sock.send(data)
    _state["sent"] += 1
    _expect(data, on_ctl)
    _drain(job_sock)
    _drain(ctl_sock)


@pytest.mark.slow
@pytest.mark.timeout(300)  # examples(2000) generated frames: CPU-bound, longer on a loaded machine
def test_fuzz_the_node_stays_up(node, job_sock, ctl_sock):
    _fuzz(job_sock, ctl_sock)
    assert _state["sent"] >= examples(2000) // 2

    def all_answered():
        _drain(job_sock)
        _drain(ctl_sock)
        return all(_state["errors"][c] >= n for c, n in _state["expected"].items())

    wait_for(all_answered, 20, what=f"an Error reply to every bad message "
                                   f"(expected {dict(_state['expected'])}, got {dict(_state['errors'])})")
    for code in ("malformed", "version", "unknown_type", "invalid"):
        assert _state["expected"][code] > 0, f"the fuzzer never produced a {code!r} message"

    assert node.proc.poll() is None, "the node died"
    listing = node.listing(timeout=5.0)
    assert listing is not None and listing.gpus, "the node no longer answers CtlList"
    log = node.log()
    assert "bad message" in log
    assert "Traceback" not in log
