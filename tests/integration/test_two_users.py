"""Issue 22, items 1 and 6: a cluster two people share. A real scheduler and a root node with CURVE keys; two
Unix accounts (made and removed by the test) with their own user keys. Each job runs as its owner's account;
alice's job tries to read the keys, bob's log and bob's environment, and to register as bob's job: each
attempt is refused. ``colocate logs`` serves a job's log to its owner and operators only; ``status --json``
carries no environment. A user without an account is refused in one line.

The trial's own report (what alice's job tried and what it got) is printed: run with ``-s`` to see it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from colocate.base import keys as K
from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import PY, REPO, Procs, child_env, free_port, read_log, wait_for, wait_until_scheduler_answers
from tests.users import needs_root, open_dir, shared_python, users  # noqa: F401 (fixtures)

pytestmark = [needs_root, pytest.mark.timeout(240)]

# alice's job: everything it tries, and what came of it, as one JSON line
ATTACK = r"""
import glob, json, os, sys
keys, logs, bob_job, node = sys.argv[1:5]
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "home": os.environ.get("HOME"),
       "user": os.environ.get("USER"), "keys_env": [k for k in os.environ if k.startswith("COLOCATE_KEYS")]}

def attempt(what, fn):
    try:
        fn()
        out[what] = "READ"
    except Exception as exc:
        out[what] = f"refused: {type(exc).__name__}: {exc}"

def read(path):
    with open(path, "rb") as f:
        f.read()

attempt("list the key folder", lambda: os.listdir(keys))
attempt("read the operator's secret key", lambda: read(os.path.join(keys, "operator-ops.key_secret")))
attempt("read the scheduler's secret key", lambda: read(os.path.join(keys, "scheduler.key_secret")))
attempt("read bob's log", lambda: read(sys.argv[7]))
attempt("list the logs folder", lambda: os.listdir(logs))
journal = sys.argv[6]
attempt("read the scheduler's journal", lambda: read(journal))
attempt("read the journal's WAL", lambda: read(journal + "-wal"))
bob_uid = int(sys.argv[5])
pids = [int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*") if os.stat(p).st_uid == bob_uid]
out["bob's processes seen"] = len(pids)
def environ_of_bob():
    for pid in pids:
        read(f"/proc/{pid}/environ")
attempt("read bob's environment", environ_of_bob if pids else lambda: (_ for _ in ()).throw(RuntimeError("none")))

import zmq
from colocate import protocol as P
ctx = zmq.Context()
def register_as_bob():
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node)
    sock.send(P.encode(P.Register(job_id=f"{bob_job}/0", pid=os.getpid(), gpu=0, priority="guaranteed",
                                  mem_request=None, sm_share=1.0, mem_cap=1 << 30, epoch=1, token="x",
                                  sm_request=1.0, rank=0, world_size=1)))
    if not sock.poll(5000):
        raise TimeoutError("no answer")
    reply = P.decode(sock.recv())
    if reply.TYPE == "error":
        raise PermissionError(reply.message)
attempt("register as bob's job", register_as_bob)
print("TRIAL " + json.dumps(out), flush=True)
"""


def _client_folder(tmp: Path, keys: Path, stem: str) -> Path:
    mine = tmp / stem
    mine.mkdir(mode=0o700)
    shutil.copy(keys / "scheduler.key", mine)
    for suffix in (".key", ".key_secret"):
        shutil.copy(keys / f"{stem}{suffix}", mine)
    return mine


def _log0(logs: Path, job: str) -> Path:
    """Rank 0's log of ``job``'s newest placement: ``LOG_DIR/CLUSTER/JOB/worker-0.PLACEMENT.log`` (a path that is not
    there while there is none)."""
    found = sorted(logs.glob(f"*/{job}/worker-0.*.log"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else logs / "none" / job / "worker-0.log"


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "colocate", *map(str, args)], cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=120)


def test_two_users_jobs_run_as_their_owners_and_cannot_reach_each_other(tmp_path, users, open_dir):  # noqa: F811
    alice, bob, carol = users.add("al"), users.add("bo"), "nobody-has-this-account"
    py, path = shared_python()
    keys = open_dir / "keys"  # on a path others may pass: only the key folder's own modes keep them out
    for who in (alice, bob, carol):
        K.generate(str(keys), K.USER, who)
    K.generate(str(keys), K.OPERATOR, "ops")
    K.generate(str(keys), K.NODE, "n1")
    for f in keys.iterdir():
        if f.is_file():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f  # key files are made 0600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    mine = {who: _client_folder(tmp_path, keys, f"user-{who}") for who in (alice, bob, carol)}
    mine["ops"] = _client_folder(tmp_path, keys, "operator-ops")
    procs = Procs(tmp_path)
    try:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        journal = open_dir / "s.db"  # on a path others may pass: only the journal's own modes keep them out
        sched = procs.start([PY, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", journal,
                             "--keys", keys, "--log-level", "info"], "scheduler.log")
        client = {who: SchedulerClient(endpoint, str(folder), timeout_s=5.0) for who, folder in mine.items()}
        wait_until_scheduler_answers(sched, client["ops"], 60)
        state, node_ep = open_dir / "state", f"ipc://{open_dir}/n1.sock"
        # the node runs as root, with an interpreter every account can run (its workers use the same one)
        node = procs.start([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", "2", "--scheduler", endpoint,
                            "--node-id", "n1", "--host", "127.0.0.1", "--endpoint", node_ep, "--state-dir", state,
                            "--keys", keys, "--log-level", "info"], "n1.log", env_extra={"PYTHONPATH": path})
        wait_for(lambda: [n.node_id for n in client["ops"].nodes().nodes if n.up] == ["n1"], 60,
                 what=f"n1 to join:\n{read_log(node)}")

        def request(command, secret, name):
            env = {"PATH": os.environ["PATH"], "PYTHONPATH": path, "SECRET_OF_THE_SUBMITTER": secret,
                   "HOME": "/root", "COLOCATE_KEYS": str(keys)}
            return request_from_here([str(c) for c in command], environ=env, cwd="/", name=name)

        bob_job = client[bob].submit(request([py, "-c", "import time; print('bob was here', flush=True); "
                                              "time.sleep(120)"], "bobs-secret", "bobs"))
        wait_for(lambda: client[bob].job(bob_job).state == "running", 120, what="bob's job to run")
        logs = state / "logs"
        wait_for(lambda: "bob was here" in (_log0(logs, bob_job).read_text() if _log0(logs, bob_job).exists() else ""),
                 60, what="bob's job to print")
        assert os.path.exists(f"{journal}-wal")  # the WAL is there to try (bob's job is in it)
        alice_job = client[alice].submit(request([py, "-c", ATTACK, keys, logs, bob_job, node_ep,
                                                  str(users.uid(bob)), journal, _log0(logs, bob_job)],
                                                 "alices-secret", "alices"))
        wait_for(lambda: client[alice].job(alice_job).state in ("succeeded", "failed"), 120,
                 what="alice's job to end")
        assert client[alice].job(alice_job).state == "succeeded", read_log(node)

        # the logs: alice reads her own job's; bob may not; an operator may
        res = _cli("logs", alice_job, "--scheduler", endpoint, "--keys", mine[alice])
        assert res.returncode == 0, res.stderr
        trial = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("TRIAL "))[6:])
        print("\ntwo-user trial, alice's job:", json.dumps(trial, indent=1))
        res_bob = _cli("logs", alice_job, "--scheduler", endpoint, "--keys", mine[bob])
        print(f"bob: colocate logs {alice_job} -> exit {res_bob.returncode}: {res_bob.stderr.strip()}")
        assert res_bob.returncode == 1 and len(res_bob.stderr.strip().splitlines()) == 1, res_bob.stderr
        assert f"only {alice} or an operator may read its logs" in res_bob.stderr and "TRIAL" not in res_bob.stdout
        assert "TRIAL" in _cli("logs", alice_job, "--scheduler", endpoint, "--keys", mine["ops"]).stdout
        # the recommendation of alice's job is built from her command line and history: hers and operators' only
        res_bob = _cli("recommend", alice_job, "--scheduler", endpoint, "--keys", mine[bob])
        assert res_bob.returncode == 1 and len(res_bob.stderr.strip().splitlines()) == 1, res_bob.stderr
        assert f"only {alice} or an operator may ask for its recommendation" in res_bob.stderr
        for who in (alice, "ops"):
            res = _cli("recommend", alice_job, "--scheduler", endpoint, "--keys", mine[who], "--json")
            assert res.returncode == 0, (who, res.stderr)

        # alice's job ran as alice: her uid, groups and home, not root's, and no key folder variable
        acct = __import__("pwd").getpwnam(alice)
        assert (trial["uid"], trial["gid"], trial["home"], trial["user"]) == (acct.pw_uid, acct.pw_gid, acct.pw_dir,
                                                                              alice)
        assert 0 not in trial["groups"] and trial["keys_env"] == []
        assert trial["bob's processes seen"] >= 1  # bob's job runs as bob: there was an environment to try
        for what in ("list the key folder", "read the operator's secret key", "read the scheduler's secret key",
                     "read bob's log", "list the logs folder", "read bob's environment", "register as bob's job",
                     "read the scheduler's journal", "read the journal's WAL"):
            assert trial[what].startswith("refused: "), (what, trial[what])
        assert "not below its launcher" in trial["register as bob's job"] or "registered by uid" in \
            trial["register as bob's job"]

        # logs on disk: the job's account's, private
        for job, who in ((alice_job, alice), (bob_job, bob)):
            log = _log0(logs, job)
            folder = log.parent
            assert folder.parent.parent == logs and stat.S_IMODE(folder.parent.stat().st_mode) == 0o711  # CLUSTER
            assert (folder.stat().st_uid, stat.S_IMODE(folder.stat().st_mode)) == (users.uid(who), 0o700)
            assert (log.stat().st_uid, stat.S_IMODE(log.stat().st_mode)) == (users.uid(who), 0o600)

        # status --json: no environment, to anyone
        res = _cli("status", alice_job, "--json", "--scheduler", endpoint, "--keys", mine[bob])
        assert res.returncode == 0 and "alices-secret" not in res.stdout and "SECRET_OF" not in res.stdout

        # a user without an account is refused in one line
        carols = client[carol].submit(request([py, "-c", "print('never')"], "c", "carols"))
        wait_for(lambda: "has no Unix account" in client[carol].job(carols).reason, 60,
                 what="carol's job to be refused")
        print(f"carol's job: {client[carol].job(carols).reason}")
        assert f"user {carol!r} has no Unix account" in client[carol].job(carols).reason
        assert "Traceback" not in read_log(node)
    finally:
        procs.cleanup()


def test_a_node_that_is_not_root_runs_its_owners_jobs_and_refuses_others(tmp_path, users, open_dir):  # noqa: F811
    """A single-user machine: the node runs as its owner (here a second account), needs no user map, runs the
    jobs of the key that maps to its own account, and refuses another user's in one line (they would run
    with the owner's files and keys)."""
    owner, other = users.add("lp"), users.add("ot")
    py, path = shared_python()
    keys = tmp_path / "keys"
    for who in (owner, other):
        K.generate(str(keys), K.USER, who)
    K.generate(str(keys), K.NODE, "lap")
    mine = {who: _client_folder(tmp_path, keys, f"user-{who}") for who in (owner, other)}
    home = open_dir / owner  # the owner's own: keys (0700, 0600), sockets, state
    node_keys = home / "keys"
    node_keys.mkdir(parents=True, mode=0o700)
    for f in ("scheduler.key", "node-lap.key", "node-lap.key_secret"):
        shutil.copy(keys / f, node_keys)
    acct = users.as_user(owner)
    for p in (home, node_keys, *node_keys.iterdir()):
        os.chown(p, acct["user"], acct["group"])
    os.chmod(home, 0o700)
    procs = Procs(tmp_path)
    try:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        sched = procs.start([PY, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp_path / "s.db",
                             "--keys", keys], "scheduler.log")
        client = {who: SchedulerClient(endpoint, str(folder), timeout_s=5.0) for who, folder in mine.items()}
        wait_until_scheduler_answers(sched, client[owner], 60)
        node = procs.start([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", "1", "--scheduler", endpoint,
                            "--node-id", "lap", "--host", "127.0.0.1", "--endpoint", f"ipc://{home}/run/node.sock",
                            "--state-dir", home / "state", "--keys", node_keys, "--log-level", "info"], "lap.log",
                           env_extra={"PYTHONPATH": path, "HOME": str(home)}, **acct)
        wait_for(lambda: [n.node_id for n in client[owner].nodes().nodes if n.up] == ["lap"], 60,
                 what=f"the owner's node to join:\n{read_log(node)}")
        assert stat.S_IMODE(os.stat(home / "run").st_mode) == 0o700  # a node that is not root: private sockets

        def request(command, name):
            return request_from_here([str(c) for c in command], environ={"PATH": os.environ["PATH"],
                                                                         "PYTHONPATH": path}, cwd="/", name=name)

        ours = client[owner].submit(request([py, "-c", "import os; print('ran as', os.getuid())"], "ours"))
        theirs = client[other].submit(request([py, "-c", "print('never')"], "theirs"))
        wait_for(lambda: client[owner].job(ours).state == "succeeded", 120, what=f"the owner's job:\n{read_log(node)}")
        wait_for(lambda: "not root" in client[other].job(theirs).reason, 60, what="the other user's job to be refused")
        reason = client[other].job(theirs).reason
        print(f"\nthe other user's job on {owner}'s node: {reason}")
        assert f"this node runs as {owner} (not root), so it runs only {owner}'s jobs, not {other}'s" in reason
        log = _log0(home / "state" / "logs", ours)
        assert f"ran as {users.uid(owner)}" in log.read_text() and log.stat().st_uid == users.uid(owner)
        assert "Traceback" not in read_log(node)
    finally:
        procs.cleanup()
