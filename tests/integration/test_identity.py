"""No peer is believed for what it says: a real `colocate scheduler` on 127.0.0.1, real nodes, and
peers the test drives frame by frame (a rogue node without keys, a node posing as another with its own
admitted key, a user key saying hello, a node that reports a password file as its worker's log).
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import zmq

from colocate import protocol as P
from colocate.base import keys as K
from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import PY, REPO, Procs, child_env, free_port, read_log, wait_for, wait_until_scheduler_answers

SECRET = "MY_SECRET"


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def start_scheduler(procs: Procs, tmp: Path, *extra, client_keys: Path | None = None) -> str:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = procs.start([PY, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp / "sched.db",
                        "--log-level", "info", *extra], "scheduler.log")
    client = SchedulerClient(endpoint, str(client_keys) if client_keys else None, timeout_s=0.5)
    wait_until_scheduler_answers(proc, client, 60)
    procs.scheduler = proc
    return endpoint


def start_node(procs: Procs, tmp: Path, endpoint: str, node_id: str, *extra, gpus: int = 1):
    return procs.start([PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", gpus, "--scheduler", endpoint,
                        "--node-id", node_id, "--host", "127.0.0.1", "--endpoint", f"ipc://{tmp}/{node_id}.sock",
                        "--state-dir", tmp / f"state-{node_id}", "--log-level", "info", *extra], f"{node_id}.log")


def request(command, env=None, **kw) -> P.JobRequest:
    return request_from_here(command, environ={**os.environ, SECRET: "hunter2", **(env or {})}, cwd=str(REPO), **kw)


class RawNode:
    """A peer that speaks the node protocol itself, pumped by a thread: it says hello, keeps its heartbeats
    going once welcomed, records every message it receives, reports each placement's workers started with
    ``log_path`` and answers ``LogTailRequest`` with ``log_text``."""

    def __init__(self, endpoint: str, node_id: str, keys: str | None = None, cert: str | None = None, gpus: int = 2,
                 log_path: str = "/etc/passwd", log_text: str = ""):
        self.node_id, self.log_path, self.log_text = node_id, log_path, log_text
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if keys:
            K.connect(self.sock, keys, cert)
        self.sock.connect(endpoint)
        self.received: list = []
        self.gpus = tuple(P.NodeGpu(index=i, model="sim", mem_total=16 << 30) for i in range(gpus))
        self._stop, self._hello = threading.Event(), threading.Event()
        self._hello.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def hello(self) -> None:
        """Say hello (again), from the pump thread: a socket is used by one thread only."""
        self._hello.set()

    def send(self, msg) -> None:
        self.sock.send(P.encode(msg))

    def of(self, kind) -> list:
        return [m for m in list(self.received) if isinstance(m, kind)]

    def _run(self) -> None:
        try:
            self._pump()
        except zmq.ContextTerminated:  # close() gave up waiting and ended the context under it: done
            pass

    def _pump(self) -> None:
        while not self._stop.is_set():
            if self._hello.is_set():
                self._hello.clear()
                self.send(P.NodeHello(node_id=self.node_id, epoch=1, host="127.0.0.1", gpus=self.gpus))
            if self.sock.poll(200):
                msg = P.decode(self.sock.recv())
                self.received.append(msg)
                if isinstance(msg, P.NodeWelcome):  # as a real node: a full status at once (it joins with it)
                    self.send(P.NodeStatus(node_id=self.node_id, epoch=1, workers=(), gpus=tuple(
                        P.GpuStatus(index=g.index, utilization=0.0, mem_used=0) for g in self.gpus)))
                if isinstance(msg, P.StartPlacement):
                    for w in msg.workers:
                        self.send(P.WorkerStarted(node_id=self.node_id, epoch=1, job_id=msg.job_id,
                                                  placement_id=msg.placement_id, rank=w.rank, pid=os.getpid(),
                                                  log_path=self.log_path))
                elif isinstance(msg, P.LogTailRequest):
                    self.send(P.LogTail(node_id=self.node_id, epoch=1, request_id=msg.request_id, text=self.log_text))
            if self.of(P.NodeWelcome):
                self.send(P.NodeHeartbeat(node_id=self.node_id, epoch=1))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sock.close(linger=0)
        self.ctx.term()


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "colocate", *map(str, args)], cwd=REPO, env=child_env(env), capture_output=True,
                          text=True, timeout=120)


# ---------------------------------------------------------------- 7: secure by default


def test_by_default_an_unauthenticated_node_gets_no_job_and_no_environment(procs, tmp_path, private_keys):
    endpoint = start_scheduler(procs, tmp_path)  # no --keys, no --insecure: the user's own keys, made now
    assert (Path(private_keys) / "colocate" / "keys" / "scheduler.key_secret").exists()
    rogue = RawNode(endpoint, "rogue", gpus=2)  # no CURVE: it says hello and would take any job
    try:
        client = SchedulerClient(endpoint, timeout_s=5.0)
        small = client.submit(request([PY, "-c", "import os; print(os.environ['MY_SECRET'])"], name="small"))
        procs_node = start_node(procs, tmp_path, endpoint, "n1")  # a local node finds the keys by itself
        wait_for(lambda: client.job(small).state == "succeeded", 120, what="the small job to run on n1")
        assert [n.node_id for n in client.nodes().nodes] == ["n1"], read_log(procs_node)
        assert rogue.received == []  # no welcome, no StartPlacement: no command and no environment
        assert SECRET not in "".join(map(repr, rogue.received))
        log = read_log(procs.scheduler)  # refused at the handshake again and again, logged once
        assert log.count("refused at the CURVE handshake") == 1 and "without CURVE" in log
    finally:
        rogue.close()


def test_insecure_is_refused_beyond_loopback_and_keys_are_made_once_by_racing_processes(tmp_path):
    res = cli("scheduler", "--bind", f"tcp://0.0.0.0:{free_port()}", "--state", tmp_path / "s.db", "--insecure")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "beyond loopback" in res.stderr
    folder = tmp_path / "cfg" / "colocate" / "keys"
    code = "from colocate.base import keys as K; import sys; print(K.client_cert(K.resolve(None)))"
    racers = [subprocess.Popen([PY, "-c", code], cwd=REPO, env=child_env({"XDG_CONFIG_HOME": str(tmp_path / "cfg")}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [r.communicate(timeout=120) for r in racers]
    assert all(r.returncode == 0 for r in racers), outs
    assert len({o.strip() for o, _ in outs}) == 1  # every racer uses the one user key
    assert sorted(os.listdir(folder / "authorized")) == [f"{outs[0][0].strip()}.key"]
    assert not [f for f in os.listdir(folder.parent) if f.startswith(".keys-")]  # no leftovers
    assert (os.stat(folder).st_mode & 0o077) == 0  # private to its owner


# ---------------------------------------------------------------- 8, 5: identity from the key


@pytest.fixture
def keyed(procs, tmp_path):
    keys = tmp_path / "keys"
    res = cli("keys", "generate", keys, "--node", "n1", "--node", "n2", "--user", "alice", "--user", "bob",
              "--operator", "ops")
    assert res.returncode == 0, res.stderr
    for who in ("alice", "bob", "ops"):  # each user's own folder: the scheduler's public key and their pair
        mine = tmp_path / who
        mine.mkdir(mode=0o700)  # a key folder others may enter is refused
        shutil.copy(keys / "scheduler.key", mine)
        stem = f"operator-{who}" if who == "ops" else f"user-{who}"
        for suffix in (".key", ".key_secret"):
            shutil.copy(keys / f"{stem}{suffix}", mine)
    # the node's user map (colocate.node.accounts): these test users have no Unix accounts, their jobs run as this one
    (keys / "users").write_text("".join(f"{who} {getpass.getuser()}\n" for who in ("alice", "bob", "ops")))
    endpoint = start_scheduler(procs, tmp_path, "--keys", keys, client_keys=tmp_path / "ops")
    return endpoint, keys


def test_a_node_key_cannot_pose_as_another_node_nor_a_user_key_as_a_node(procs, tmp_path, keyed):
    endpoint, keys = keyed
    start_node(procs, tmp_path, endpoint, "n1", "--keys", keys, gpus=2)
    client = SchedulerClient(endpoint, str(tmp_path / "ops"), timeout_s=5.0)
    wait_for(lambda: [n.node_id for n in client.nodes().nodes if n.up] == ["n1"], 60, what="n1 to join")
    job = client.submit(request([PY, "-c", "import time; time.sleep(60)"], name="long"))
    wait_for(lambda: client.job(job).state == "running", 120, what="the job to run on n1")
    poser = RawNode(endpoint, "n1", str(keys), "node-n2")  # admitted, but as n2
    user = RawNode(endpoint, "alice-node", str(keys), "user-alice")  # a user's key saying hello as a node
    try:
        wait_for(lambda: poser.of(P.Error) and user.of(P.Error), 30, what="both hellos to be answered")
        assert [e.code for e in poser.of(P.Error)] == [P.FORBIDDEN] and "as node n1" in poser.of(P.Error)[0].message
        assert [e.code for e in user.of(P.Error)] == [P.FORBIDDEN] and "cannot register as a node" in \
            user.of(P.Error)[0].message
        assert not poser.of(P.NodeWelcome) and not poser.of(P.StartPlacement)
        assert [n.node_id for n in client.nodes().nodes] == ["n1"] and client.job(job).state == "running"
    finally:
        poser.close()
        user.close()
    log = read_log(procs.scheduler)
    assert log.count("cannot say hello as node n1") == 1 and log.count("cannot register as a node") == 1


def test_a_node_id_is_held_by_one_live_connection_until_it_falls_silent(procs, tmp_path, keyed):
    endpoint, keys = keyed
    n1 = start_node(procs, tmp_path, endpoint, "n1", "--keys", keys)
    client = SchedulerClient(endpoint, str(tmp_path / "ops"), timeout_s=5.0)
    wait_for(lambda: [n.node_id for n in client.nodes().nodes if n.up] == ["n1"], 60, what="n1 to join")
    second = RawNode(endpoint, "n1", str(keys), "node-n1")  # the same key and id, another live process
    try:
        wait_for(lambda: second.of(P.Error), 30, what="the second hello to be answered")
        second.hello()  # says it again: refused again, logged once
        wait_for(lambda: len(second.of(P.Error)) >= 2, 30, what="the repeated hello to be answered")
        assert {e.code for e in second.of(P.Error)} == {P.FORBIDDEN} and not second.of(P.NodeWelcome)
        assert "held by another live connection" in second.of(P.Error)[0].message
        assert read_log(procs.scheduler).count("held by another live connection") == 1
        job = client.submit(request([PY, "-c", "print('on the first')"], name="first"))
        wait_for(lambda: client.job(job).state == "succeeded", 120, what="the job to run on the first n1")
        assert not second.of(P.StartPlacement)
        n1.kill()  # the first falls silent: past liveness the id is free again
        n1.wait(10)

        def taken():
            second.hello()
            return second.of(P.NodeWelcome)
        wait_for(taken, 30, interval=0.5, what="the second process to take the id of the silent first")
    finally:
        second.close()


# ---------------------------------------------------------------- 10: users from their keys


def test_the_user_is_the_key_and_users_cancel_only_their_own_jobs(procs, tmp_path, keyed):
    endpoint, _ = keyed
    mine = {who: SchedulerClient(endpoint, str(tmp_path / who), timeout_s=5.0) for who in ("alice", "bob", "ops")}
    jobs = {who: mine[who].submit(request(["true"], name=f"of-{who}", gpus=1)) for who in ("alice", "bob")}
    # the client claims to be mallory (LOGNAME): the scheduler records the key's name
    claimed = dataclasses.replace(request(["true"]), user="mallory")
    jobs["claimed"] = mine["alice"].submit(claimed)
    assert {w: mine["ops"].job(j).user for w, j in jobs.items()} == {"alice": "alice", "bob": "bob",
                                                                      "claimed": "alice"}
    res = cli("cancel", jobs["alice"], "--scheduler", endpoint, "--keys", tmp_path / "bob")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"job {jobs['alice']} is alice's" in res.stderr
    assert mine["ops"].job(jobs["alice"]).state == "pending"
    assert "cancelled" in mine["alice"].cancel(jobs["alice"])
    assert "cancelled" in mine["ops"].cancel(jobs["bob"])  # an operator cancels anyone's job


# ---------------------------------------------------------------- 9: logs over the link


def test_logs_come_from_the_node_over_the_link_never_from_a_path_it_sent(procs, tmp_path, keyed):
    endpoint, keys = keyed
    liar = RawNode(endpoint, "n2", str(keys), "node-n2", log_path="/etc/passwd", log_text="rank 0 says hi\n")
    try:
        client = SchedulerClient(endpoint, str(tmp_path / "alice"), timeout_s=5.0)
        wait_for(lambda: liar.of(P.NodeWelcome), 30, what="the node to be welcomed")
        job = client.submit(request(["true"], name="on-liar"))
        wait_for(lambda: client.job(job).state == "running", 60, what="the job to run on the lying node")
        res = cli("logs", job, "--scheduler", endpoint, "--keys", tmp_path / "alice")
        assert res.returncode == 0, res.stderr
        assert res.stdout == "rank 0 says hi\n" and "root:" not in res.stdout  # what the node read, no file opened
        assert [m.job_id for m in liar.of(P.LogTailRequest)] == [job]
        res = cli("logs", job, "--worker", 7, "--scheduler", endpoint, "--keys", tmp_path / "alice")
        assert res.returncode == 1 and f"job {job} has no worker 7" in res.stderr and "not started" not in res.stderr
    finally:
        liar.close()
    res = cli("logs", job, "--scheduler", endpoint, "--keys", tmp_path / "alice")  # the node is gone
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "node n2" in res.stderr and "root:" not in res.stdout


def test_a_real_node_serves_its_workers_logs(procs, tmp_path, keyed):
    endpoint, keys = keyed
    start_node(procs, tmp_path, endpoint, "n1", "--keys", keys, gpus=2)
    client = SchedulerClient(endpoint, str(tmp_path / "alice"), timeout_s=5.0)
    wait_for(lambda: [n.node_id for n in client.nodes().nodes if n.up] == ["n1"], 60, what="n1 to join")
    job = client.submit(request([PY, "-c", "import os; print('rank', os.environ['RANK'], 'done')"], workers=2))
    wait_for(lambda: client.job(job).state == "succeeded", 120, what="the job to finish")
    res = cli("logs", job, "--scheduler", endpoint, "--keys", tmp_path / "alice", "--tail", 1)
    assert res.returncode == 0, res.stderr
    assert "==> worker 0 on n1 <==\nrank 0 done\n==> worker 1 on n1 <==\nrank 1 done\n" == res.stdout
