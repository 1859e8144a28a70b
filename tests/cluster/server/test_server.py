"""A real ``colocate scheduler`` process over real ZeroMQ sockets: bad input, fuzz, CURVE, metrics,
start-up errors."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colocate import protocol as P
from colocate.base import keys as K
from colocate.clients import rpc
from tests.support import (
    PY,
    Procs,
    ask,
    child_env,
    dealer,
    examples,
    free_port,
    metric_samples,
    pack,
    read_log,
    receive,
    sample,
    scrape,
    wait_for,
)


class SchedulerProc:
    def __init__(self, procs: Procs, tmp, *extra, metrics: bool = True):
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.metrics_port = free_port() if metrics else None
        self.state = tmp / "sched.db"
        argv = [PY, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state", self.state, *extra]
        if metrics:
            argv += ["--metrics-port", self.metrics_port]
        self.proc = procs.start(argv, "scheduler.log")

    def wait_ready(self, keys_dir=None):
        def answers():
            try:
                return rpc.request(self.endpoint, P.NodesRequest(), 0.5, keys_dir=keys_dir)
            except rpc.NoAnswer:
                assert self.proc.poll() is None, read_log(self.proc)
                return None
        return wait_for(answers, 30, what="the scheduler to answer")


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.fixture
def sched(procs, tmp_path):
    s = SchedulerProc(procs, tmp_path, "--insecure")  # raw frames from plain sockets
    s.wait_ready()
    return s


@pytest.fixture(scope="module")
def shared_sched(tmp_path_factory):
    """One scheduler for the tests that only send it bad frames and see it answer on (nothing they send
    changes what the others observe)."""
    tmp = tmp_path_factory.mktemp("sched")
    procs = Procs(tmp)
    s = SchedulerProc(procs, tmp, "--insecure", metrics=False)
    s.wait_ready()
    yield s
    procs.cleanup()


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


BAD = [
    ("garbage", b"\xff\x00garbage", P.MALFORMED),
    ("not a map", pack([1, 2, 3]), P.MALFORMED),
    ("no version", pack({"t": "nodes_request"}), P.VERSION),
    ("old version", pack({"v": 1, "t": "nodes_request"}), P.VERSION),
    ("unknown type", pack({"v": P.PROTOCOL_VERSION, "t": "launch_missiles"}), P.UNKNOWN_TYPE),
    ("missing field", pack({"v": P.PROTOCOL_VERSION, "t": "cancel"}), P.INVALID),
    ("bad submit", pack({"v": P.PROTOCOL_VERSION, "t": "submit", "request": {"command": []}}), P.INVALID),
    ("a node message before hello", P.encode(P.NodeHeartbeat(node_id="n", epoch=1)), P.UNKNOWN_NODE),
    ("a message only the scheduler sends", P.encode(P.Ok(message="x")), P.FORBIDDEN),
]


@pytest.mark.parametrize("name, data, code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_error_and_the_scheduler_stays_up(shared_sched, ctx, name, data, code):
    sock = dealer(ctx, shared_sched.endpoint)
    reply = ask(sock, data)
    assert isinstance(reply, P.Error) and reply.code == code, reply
    assert isinstance(ask(sock, P.NodesRequest()), P.NodesReply)
    assert shared_sched.proc.poll() is None


def test_two_frames_are_malformed(shared_sched, ctx):
    sock = dealer(ctx, shared_sched.endpoint)
    reply = ask(sock, [b"one", b"two"])
    assert isinstance(reply, P.Error) and reply.code == P.MALFORMED


anything = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
                        | st.binary(max_size=20), lambda c: st.lists(c, max_size=4)
                        | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)
types = st.sampled_from(sorted(P.MESSAGE_TYPES))


@pytest.mark.slow
@pytest.mark.timeout(300)  # 1500 generated frames: CPU-bound, longer on a loaded machine
def test_fuzz_thousands_of_messages_never_crash_it(sched, ctx):
    sock = dealer(ctx, sched.endpoint)

    @settings(max_examples=examples(1500), deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.one_of(
        st.binary(max_size=200),
        st.builds(lambda t, fields: pack({"v": P.PROTOCOL_VERSION, "t": t, **fields}), types,
                  st.dictionaries(st.text(max_size=12), anything, max_size=6)),
    ))
    def run(data):
        sock.send(data)
        if sock.poll(5000):  # node messages of an unknown node, or anything else, get an answer
            P.decode(sock.recv())

    run()
    assert sched.proc.poll() is None
    assert isinstance(ask(sock, P.NodesRequest()), P.NodesReply)
    s = metric_samples(scrape(sched.metrics_port))
    assert sample(s, "colocate_scheduler_bad_messages_total", code="malformed") > 0


def test_metrics_over_http(sched, ctx):
    sock = dealer(ctx, sched.endpoint)
    ask(sock, P.NodesRequest())
    s = metric_samples(scrape(sched.metrics_port))
    assert sample(s, "colocate_scheduler_messages_total", type="nodes_request") >= 1
    assert sample(s, "colocate_scheduler_nodes", state="up") == 0
    assert sample(s, "colocate_scheduler_queue_jobs", queue="default") == 0  # empty: 0, not absent
    assert sample(s, "colocate_scheduler_gpus", state="total") == 0
    assert sample(s, "colocate_scheduler_journal_writable") == 1
    assert sample(s, "colocate_scheduler_oom_restarts_total") == 0
    assert sample(s, "colocate_scheduler_reclaims_total") == 0


def test_curve_admits_known_keys_only(procs, tmp_path):
    keys = tmp_path / "keys"
    K.generate(str(keys), K.USER, "alice")
    intruder = tmp_path / "intruder"
    K.generate(str(intruder), K.USER, "alice")  # its own key, never admitted by the scheduler's folder
    (intruder / "scheduler.key").write_bytes((keys / "scheduler.key").read_bytes())  # knows the server key
    s = SchedulerProc(procs, tmp_path, "--keys", keys)
    assert isinstance(s.wait_ready(keys_dir=str(keys)), P.NodesReply)
    with pytest.raises(rpc.NoAnswer):  # an unadmitted client gets nothing
        rpc.request(s.endpoint, P.NodesRequest(), 1.5, keys_dir=str(intruder))
    with pytest.raises(rpc.NoAnswer):  # nor does a peer without CURVE, a node saying hello included
        rpc.request(s.endpoint, P.NodeHello(node_id="evil", epoch=1, host="x", gpus=()), 1.5)
    reply = rpc.request(s.endpoint, P.NodesRequest(), 5, keys_dir=str(keys))
    assert reply.nodes == ()  # the unauthenticated hello never reached it
    log = read_log(s.proc)  # each kind of refusal logged once, however often the peers retried
    assert log.count("whose key is not admitted") == 1 and log.count("a peer without CURVE") == 1, log


def _curve_dealer(ctx, endpoint: str, folder, stem: str):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    K.connect(sock, str(folder), stem)
    sock.connect(endpoint)
    return sock


def _answer(sock, timeout_s: float = 5.0):
    sock.send(P.encode(P.NodesRequest()))
    return receive(sock, timeout_s)


def test_a_key_replaced_in_place_or_removed_is_refused_on_open_connections_too(procs, tmp_path, ctx):
    """Issue 22 item 7: admitted keys reload on any change of an admitted file, not only of the folder."""
    keys, new = tmp_path / "keys", tmp_path / "new"
    K.generate(str(keys), K.USER, "bob")
    K.generate(str(new), K.USER, "bob")  # bob's next key
    (new / "scheduler.key").write_bytes((keys / "scheduler.key").read_bytes())
    s = SchedulerProc(procs, tmp_path, "--keys", keys, metrics=False)
    s.wait_ready(keys_dir=str(keys))
    old_conn = _curve_dealer(ctx, s.endpoint, keys, "user-bob")
    assert isinstance(_answer(old_conn), P.NodesReply)
    admitted = keys / "authorized" / "user-bob.key"
    folder_mtime = (keys / "authorized").stat().st_mtime_ns
    with open(admitted, "r+b") as f:  # rotated in place: the folder itself does not change
        f.truncate(0)
        f.write((new / "user-bob.key").read_bytes())
    assert (keys / "authorized").stat().st_mtime_ns == folder_mtime
    new_conn = _curve_dealer(ctx, s.endpoint, new, "user-bob")  # the new key works at once
    assert isinstance(_answer(new_conn), P.NodesReply)
    refused = _answer(old_conn)  # the open connection of the old key is refused from its next message
    assert isinstance(refused, P.Error) and refused.code == P.FORBIDDEN and "no longer admitted" in refused.message
    with pytest.raises(rpc.NoAnswer):  # and a new one with the old key gets nothing
        rpc.request(s.endpoint, P.NodesRequest(), 1.5, keys_dir=str(keys))
    admitted.unlink()  # removed: the open connection is refused from its next message
    gone = wait_for(lambda: (lambda r: r if isinstance(r, P.Error) else None)(_answer(new_conn)), 10,
                    what="the removed key's connection to be refused")
    assert gone.code == P.FORBIDDEN and "no longer admitted" in gone.message
    old_conn.close()
    new_conn.close()


@pytest.mark.parametrize("extra, fragment, code", [
    (("--bind", "tcp://0.0.0.0:{port}", "--insecure"), "beyond loopback without CURVE keys", 2),
    (("--config", "no-such-policy"), "no-such-policy", 2),
    (("--keys", "{tmp}/none"), "missing key file", 2),
])
def test_start_up_errors_are_one_line(tmp_path, extra, fragment, code):
    port = free_port()
    argv = [PY, "-m", "colocate", "scheduler", "--state", str(tmp_path / "s.db"), "--bind", f"tcp://127.0.0.1:{port}"]
    argv += [a.format(port=port, tmp=tmp_path) for a in extra]
    res = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and lines[0].startswith("colocate scheduler:"), res.stderr


def test_a_state_file_that_is_not_a_journal_is_refused(tmp_path):
    bad = tmp_path / "s.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    res = subprocess.run([PY, "-m", "colocate", "scheduler", "--state", str(bad), "--bind",
                          f"tcp://127.0.0.1:{free_port()}"], env=child_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "not a colocate scheduler state file" in res.stderr
    assert "Traceback" not in res.stderr


def test_sigterm_stops_it_cleanly(sched):
    sched.proc.send_signal(signal.SIGTERM)
    assert sched.proc.wait(timeout=20) == 0


def test_top_once_shows_the_cluster_or_says_it_is_away(sched, tmp_path):
    from tests.support import colocate_cli

    res = colocate_cli("top", "--scheduler", sched.endpoint, "--once", "--insecure")
    assert res.returncode == 0, res.stderr
    assert "0/0 nodes up" in res.stdout and "no jobs" in res.stdout
    away = f"tcp://127.0.0.1:{free_port()}"
    res = colocate_cli("top", "--scheduler", away, "--once", "--timeout", "0.5")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def test_a_second_scheduler_on_the_same_state_file_exits_naming_the_holder(procs, tmp_path, sched):
    argv = [PY, "-m", "colocate", "scheduler", "--bind", f"tcp://127.0.0.1:{free_port()}", "--state", sched.state,
            "--insecure"]
    second = procs.start(argv, "second.log")
    wait_for(lambda: second.poll() is not None, 30, what="the second scheduler to exit")
    lines = read_log(second).strip().splitlines()
    assert second.returncode == 1 and len(lines) == 1, read_log(second)
    assert lines[0].startswith("colocate scheduler:") and f"pid {sched.proc.pid} on " in lines[0], lines
    assert isinstance(rpc.request(sched.endpoint, P.NodesRequest(), 5), P.NodesReply)  # the first serves on
    sched.proc.send_signal(signal.SIGTERM)
    assert sched.proc.wait(timeout=20) == 0
    third = SchedulerProc(procs, tmp_path, "--insecure", metrics=False)  # the lock went with its holder
    assert isinstance(third.wait_ready(), P.NodesReply)


def test_a_scheduler_whose_lock_file_is_removed_stops_and_a_second_takes_the_file(procs, tmp_path, sched):
    (tmp_path / "sched.db.lock").unlink()  # taken for a stale lock
    assert sched.proc.wait(timeout=30) == 1, read_log(sched.proc)  # at its next tick, before any commit
    log = read_log(sched.proc)
    assert "sched.db.lock was removed" in log and "stopping (exit 1)" in log and "Traceback" not in log, log
    second = SchedulerProc(procs, tmp_path, "--insecure", metrics=False)
    second.wait_ready()
    req = P.JobRequest(command=("python", "-c", "pass"), cwd="/tmp", env={}, gpus=1, priority="guaranteed")
    ok = rpc.request(second.endpoint, P.Submit(request=req), 5)
    assert isinstance(ok, P.Submitted) and ok.job_id == "1", ok


def test_an_immutable_state_file_is_refused_in_one_line(tmp_path):
    from cluster.server.journal import Journal

    state = tmp_path / "s.db"
    Journal(str(state)).close()  # a state file a scheduler left
    if subprocess.run(["chattr", "+i", str(state)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not permitted here (it needs root on a filesystem with attributes)")
    try:
        res = subprocess.run([PY, "-m", "colocate", "scheduler", "--state", str(state), "--bind",
                              f"tcp://127.0.0.1:{free_port()}", "--insecure"], env=child_env(), capture_output=True,
                             text=True, timeout=60)
    finally:
        subprocess.run(["chattr", "-i", str(state)], check=True)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert "cannot write the state file" in lines[0] and "readonly" in lines[0]


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def test_frames_over_the_limit_are_refused_by_the_socket_and_memory_stays_bounded(sched, ctx):
    import psutil
    from zmq.utils.monitor import recv_monitor_message

    sock = dealer(ctx, sched.endpoint)
    assert isinstance(ask(sock, P.NodesRequest()), P.NodesReply)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    before = _peak_rss(sched.proc.pid)
    frame = bytes(50 << 20)  # 50 MB, the limit is 1 MiB
    for _ in range(4):
        sock.send(frame, copy=False)
    drops, replies = [], []

    def refused():
        while monitor.poll(0):
            drops.append(recv_monitor_message(monitor))
        while sock.poll(0):
            replies.append(sock.recv())  # the old scheduler read each frame whole and answered it
        return drops or len(replies) == 4
    wait_for(refused, 60, what="the scheduler to drop the connection")
    assert drops and not replies  # the socket refused the frame at its header: never read, never answered
    fresh = dealer(ctx, sched.endpoint)
    assert isinstance(ask(fresh, P.NodesRequest()), P.NodesReply)  # it still answers
    grown = _peak_rss(sched.proc.pid) - before
    assert grown < (20 << 20), f"peak RSS grew by {grown >> 20} MiB"
    assert psutil.Process(sched.proc.pid).memory_info().rss < before + (20 << 20)
    sock.disable_monitor()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: a disk that really fills (ENOSPC). Needs the right to mount (root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(folder) -> None:
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(64 << 10))
                f.flush()
        except OSError:
            pass


class _BeatingNode(threading.Thread):
    """A node that says hello, reports once and heartbeats every 0.1 s on its own thread, keeping every reply."""

    def __init__(self, ctx, endpoint: str):
        super().__init__(daemon=True)
        self.ctx, self.endpoint, self.replies, self.stop = ctx, endpoint, [], threading.Event()
        self.start()

    def run(self):
        sock = dealer(self.ctx, self.endpoint)
        sock.send(P.encode(P.NodeHello(node_id="n1", epoch=1, host="127.0.0.1",
                                       gpus=(P.NodeGpu(index=0, model="sim", mem_total=1 << 30),))))
        # as a real node does once welcomed: the scheduler joins a node to its core with its first report
        sock.send(P.encode(P.NodeStatus(node_id="n1", epoch=1, gpus=(P.GpuStatus(index=0, utilization=0.0,
                                                                                mem_used=0),), workers=())))
        while not self.stop.wait(0.1):
            sock.send(P.encode(P.NodeHeartbeat(node_id="n1", epoch=1)))
            while sock.poll(0):
                self.replies.append(P.decode(sock.recv()))
        sock.close(0)

    def beats(self) -> int:
        return sum(isinstance(m, P.NodeHeartbeat) for m in list(self.replies))


def test_a_full_disk_refuses_submits_in_one_line_keeps_the_node_and_resumes(procs, tiny_disk, ctx):
    from tests.support import colocate_cli

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = procs.start([PY, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tiny_disk / "sched.db",
                        "--heartbeat", "0.2", "--insecure"], "scheduler.log")
    wait_for(lambda: _answers(endpoint, proc), 30, what="the scheduler to answer")
    node = _BeatingNode(ctx, endpoint)
    try:
        wait_for(lambda: node.beats() > 0, 30, what="the node to be welcomed and echoed")

        def submit():
            return colocate_cli("submit", "--scheduler", endpoint, "--insecure", "--gpus", "1", "--priority",
                                "guaranteed", "--", "python", "-c", "pass")
        ok = submit()
        assert ok.returncode == 0, ok.stderr
        _fill(tiny_disk)
        for _ in range(2):
            res = submit()
            lines = res.stderr.strip().splitlines()
            assert res.returncode == 1 and len(lines) == 1 and "cannot write its journal" in lines[0], res.stderr
            assert "full" in lines[0] and "nothing was submitted" in lines[0]
        beats = node.beats()
        wait_for(lambda: node.beats() >= beats + 10, 30, what="heartbeats echoed while the disk is full")
        assert proc.poll() is None
        nodes = rpc.request(endpoint, P.NodesRequest(), 5).nodes
        assert [(n.node_id, n.up) for n in nodes] == [("n1", True)]
        assert not [m for m in node.replies if isinstance(m, P.Error)]  # never forgotten (unknown_node)
        log = read_log(proc)
        assert log.count("cannot write the journal") == 1 and "Traceback" not in log, log

        (tiny_disk / "filler").unlink()
        again = wait_for(lambda: (r := submit()).returncode == 0 and r, 30, interval=0.5,
                         what="submits to be taken again")
        assert again.stdout.strip() == "2"  # the refused submits left no job behind
        assert "can be written again" in read_log(proc)
    finally:
        node.stop.set()
        node.join(5)


def _answers(endpoint, proc):
    assert proc.poll() is None, read_log(proc)
    try:
        return rpc.request(endpoint, P.NodesRequest(), 0.5)
    except rpc.NoAnswer:
        return None


BROKEN_PLUGIN = """\
import os, sys
from cluster.plugins.binpack import BinPack
def on_placed(self, job, placement, now):  # a plugin bug, on while the flag file exists
    if os.path.exists(sys.argv[1]):
        raise RuntimeError("plugin bug")
BinPack.on_placed = on_placed  # runs after the cycle committed its statement: the core is half-updated
from colocate.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_plugin_that_raises_in_a_real_scheduler_is_logged_once_and_the_scheduler_serves_on(procs, tmp_path, ctx):
    from tests.support import colocate_cli

    flag = tmp_path / "broken"
    flag.touch()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = procs.start([PY, "-c", BROKEN_PLUGIN, flag, "scheduler", "--bind", endpoint, "--state",
                        tmp_path / "sched.db", "--config", "gang-binpack", "--heartbeat", "0.2", "--insecure"],
                       "scheduler.log")
    wait_for(lambda: _answers(endpoint, proc), 30, what="the scheduler to answer")
    node = _BeatingNode(ctx, endpoint)
    try:
        wait_for(lambda: node.beats() > 0, 30, what="the node to be welcomed and echoed")
        res = colocate_cli("submit", "--scheduler", endpoint, "--insecure", "--gpus", "1", "--priority",
                           "guaranteed", "--", "python", "-c", "pass")
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stderr  # journaled, so acknowledged
        beats = node.beats()
        wait_for(lambda: node.beats() >= beats + 10, 30, what="heartbeats while every cycle fails")
        (job,) = rpc.request(endpoint, P.JobsRequest(), 5).jobs
        assert job.state == "pending" and proc.poll() is None
        assert not [m for m in node.replies if isinstance(m, P.StartPlacement)]
        log = read_log(proc)
        assert log.count("the policy core failed") == 1 and "plugin bug" in log, log
        flag.unlink()  # the bug is gone: the next cycle places the job
        wait_for(lambda: [m for m in node.replies if isinstance(m, P.StartPlacement)], 30, what="the job's start")
        assert [m.job_id for m in node.replies if isinstance(m, P.StartPlacement)] == ["1"]
    finally:
        node.stop.set()
        node.join(5)


def test_submits_at_the_limits_are_answered_over_curve(procs, tmp_path, ctx):
    """With CURVE a frame is some 33 bytes longer than its message: the socket's limit (MAX_FRAME_BYTES) leaves that
    room, so a Submit of the largest size a job may be is taken, and a larger one up to the message limit is
    answered "invalid" in one line (both went unanswered when the socket's limit was the message's)."""
    from tests.colocate.test_protocol import _submit

    keys = tmp_path / "keys"
    K.generate(str(keys), K.USER, "alice")
    s = SchedulerProc(procs, tmp_path, "--keys", keys, metrics=False)
    s.wait_ready(keys_dir=str(keys))
    sock = _curve_dealer(ctx, s.endpoint, keys, "user-alice")
    limit = P.MAX_BYTES_OF["submit"]
    for size, n in ((limit, 16), (P.MAX_MESSAGE_BYTES - 8, 17)):
        base = len(pack(P.to_wire(_submit(1000, n))))
        data = pack(P.to_wire(_submit(1000 + size - base, n)))
        assert len(data) == size
        sock.send(data)
        got = receive(sock, 30)
        if size == limit:
            assert isinstance(got, P.Submitted), got
        else:
            assert isinstance(got, P.Error) and got.code == P.INVALID and f"over its {limit}-byte limit" in got.message
    assert "Traceback" not in read_log(s.proc)
