"""WorkerManager with real processes: each worker is a tiny Python script started under the real launcher.

Every wait polls ``WorkerManager.poll`` (or a file the script writes) with a deadline; the scripts write a
"ready" file once their signal handlers are installed, so stop tests signal only prepared processes. Every
process a test starts is SIGKILLed by process group at the end.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from colocate import protocol as P
from colocate.node.worker_table import StateDirError
from colocate.node.workers import WorkerConfig, WorkerManager, _create_time, port_in_use
from tests.support import PY, GiB, alive, child_env, free_port, tiny_script, wait_for

ENV_DUMP = """\
import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
         "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "COLOCATE_GPUS", "COLOCATE_JOB_ID", "COLOCATE_PRIORITY",
         "COLOCATE_DEVICE", "COLOCATE_NODE", "COLOCATE_GPU_MEM", "COLOCATE_SIM_GPU_MEM", "COLOCATE_LEAK", "FROM_REQUEST",
         "COLOCATE_SM_SHARE", "COLOCATE_ON_CAP"]
rank = os.environ["RANK"]
with open(f"env-{rank}.json", "w") as f:
    json.dump({"cwd": os.getcwd(), **{n: os.environ.get(n) for n in names}}, f)
print(f"hello from rank {rank}", flush=True)
with open("starts.txt", "a") as f:
    f.write(rank + "\\n")
raise SystemExit(int(sys.argv[1]) + int(rank))
"""

# runs until RELEASE-<rank> exists; "term" handles SIGTERM (exit 143), "ignore" ignores it
WAITER = """\
import os, signal, sys, time
rank, mode = os.environ["RANK"], sys.argv[1]
if mode == "term":
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
elif mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(f"ready-{rank}", "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(f"release-{rank}") and time.monotonic() < deadline:
    time.sleep(0.02)
raise SystemExit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


class Managers:
    """The test's WorkerManagers; at the end every worker process group they started is SIGKILLed."""

    def __init__(self, tmp: Path):
        self.tmp, self.all = tmp, []
        (tmp / "work").mkdir()

    def new(self, epoch: int = 1, gpus=(0, 1), state: str = "state") -> WorkerManager:
        cfg = WorkerConfig(node_id="n1", epoch=epoch, job_endpoint=f"ipc://{self.tmp}/no-node.sock", device="sim",
                           gpus={g: GiB for g in gpus}, log_dir=str(self.tmp / "logs"), state_dir=str(self.tmp / state))
        wm = WorkerManager(cfg)
        self.all.append(wm)
        return wm

    def cleanup(self) -> None:
        for wm in self.all:
            for p in wm.placements():
                for w in p.workers:
                    try:
                        os.killpg(w.pid, signal.SIGKILL)
                    except OSError:
                        pass
            wm.table.unlock()


@pytest.fixture
def mgrs(tmp_path):
    m = Managers(tmp_path)
    yield m
    m.cleanup()


def placement(tmp: Path, pid: str, command, workers=((0, 0, (0,)), (1, 1, (1,))), priority="guaranteed", port=0,
              cwd=None, group_rank=0, job="job-a", env=None) -> P.StartPlacement:
    req = P.JobRequest(command=tuple(map(str, command)), cwd=str(cwd or tmp / "work"),
                       env=env if env is not None else child_env({"FROM_REQUEST": "yes", "COLOCATE_LEAK": "1"}),
                       workers=max(len(workers), 1))
    return P.StartPlacement(placement_id=pid, job_id=job, priority=priority, request=req,
                            workers=tuple(P.WorkerLaunch(rank=r, local_rank=lr, gpus=g) for r, lr, g in workers),
                            world_size=max([r for r, _, _ in workers], default=0) + 1, group_rank=group_rank,
                            master_addr="127.0.0.1",
                            master_port=port)


def poll_until(wm: WorkerManager, pred, timeout: float = 60.0, events=None) -> list:
    """Poll ``wm`` until ``pred(events so far)``; returns the events."""
    events = [] if events is None else events

    def step():
        events.extend(wm.poll())
        return pred(events)

    wait_for(step, timeout, what="the worker manager's events")
    return events


def exits(events) -> dict:
    return {e.rank: e.exit_code for e in events if isinstance(e, P.WorkerExited)}


def ready(tmp: Path, *ranks, timeout: float = 60.0) -> None:
    wait_for(lambda: all((tmp / "work" / f"ready-{r}").exists() for r in ranks), timeout, what=f"workers {ranks} ready")


# ---------------------------------------------------------------- start


def test_workers_run_under_the_launcher_with_torchruns_variables_and_their_own_logs(mgrs, tmp_path):
    wm = mgrs.new()
    script = tiny_script(tmp_path, "dump.py", ENV_DUMP)
    port = free_port()
    started = wm.start(placement(tmp_path, "p1", [PY, script, 3], port=port))
    assert [(e.rank, e.job_id, e.placement_id, e.node_id, e.epoch) for e in started] == \
        [(0, "job-a", "p1", "n1", 1), (1, "job-a", "p1", "n1", 1)]
    assert [e.log_path for e in started] == [str(tmp_path / "logs" / "unnamed" / "job-a" / f"worker-{r}.p1.log")
                                             for r in (0, 1)]
    events = poll_until(wm, lambda ev: len(exits(ev)) == 2)
    assert exits(events) == {0: 3, 1: 4}  # the command's own code, through the launcher
    for rank in (0, 1):
        env = json.loads((tmp_path / "work" / f"env-{rank}.json").read_text())
        assert env["cwd"] == str(tmp_path / "work")
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == \
            (str(rank), str(rank), "2", "2", "0")
        assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == (str(rank), "2", "job-a")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert env["COLOCATE_GPUS"] == "0,1"  # torchrun's layout: worker LOCAL_RANK=i is on GPU number i
        assert (env["COLOCATE_JOB_ID"], env["COLOCATE_PRIORITY"], env["COLOCATE_DEVICE"]) == ("job-a", "guaranteed", "sim")
        assert env["COLOCATE_NODE"] == f"ipc://{tmp_path}/no-node.sock" and env["COLOCATE_SIM_GPU_MEM"] == str(GiB)
        assert env["FROM_REQUEST"] == "yes" and env["COLOCATE_LEAK"] is None  # the request's COLOCATE_* are dropped
        text = Path(started[rank].log_path).read_text()
        assert text.startswith("=== ") and "placement p1 of job job-a" in text and f"hello from rank {rank}" in text
    assert {(s.rank, s.running, s.exit_code) for s in wm.status()} == {(0, False, 3), (1, False, 4)}


def test_workers_with_several_gpus_each_get_their_own_and_gpu_mem_is_passed(mgrs, tmp_path):
    wm = mgrs.new(gpus=(0, 1, 2, 3))
    script = tiny_script(tmp_path, "dump.py", ENV_DUMP)
    msg = placement(tmp_path, "p1", [PY, script, 0], workers=((5, 0, (2, 3)), (4, 1, (0, 1))), group_rank=1)
    msg = P.StartPlacement(**{**{f: getattr(msg, f) for f in ("placement_id", "job_id", "priority", "workers",
                                                               "group_rank", "master_addr", "master_port")},
                              "request": P.JobRequest(**{**{f: getattr(msg.request, f) for f in
                                                            ("command", "cwd", "env", "workers")}, "gpu_mem": 3 * GiB}),
                              "world_size": 8})
    assert len(wm.start(msg)) == 2
    poll_until(wm, lambda ev: len(exits(ev)) == 2)
    envs = {r: json.loads((tmp_path / "work" / f"env-{r}.json").read_text()) for r in (4, 5)}
    assert envs[5]["COLOCATE_GPUS"] == "2,3" and envs[4]["COLOCATE_GPUS"] == "0,1"
    assert envs[5]["GROUP_RANK"] == "1" and envs[5]["WORLD_SIZE"] == "8" and envs[5]["COLOCATE_GPU_MEM"] == str(3 * GiB)
    assert envs[5]["MASTER_PORT"] is None  # no port given: none set


@pytest.mark.parametrize("recommended, on_cap", [(True, "error"), (False, "host")])
def test_a_share_is_passed_and_a_recommended_cap_stops_the_job_over_it(mgrs, tmp_path, recommended, on_cap):
    import dataclasses

    wm = mgrs.new()
    script = tiny_script(tmp_path, "dump.py", ENV_DUMP)
    msg = placement(tmp_path, "p1", [PY, script, 0], workers=((0, 0, (0,)),))
    msg = dataclasses.replace(msg, request=dataclasses.replace(msg.request, gpu_mem=GiB // 2, sm_share=0.4),
                              cap_recommended=recommended)
    assert len(wm.start(msg)) == 1
    poll_until(wm, lambda ev: len(exits(ev)) == 1)
    env = json.loads((tmp_path / "work" / "env-0.json").read_text())
    assert (env["COLOCATE_GPU_MEM"], env["COLOCATE_SM_SHARE"], env["COLOCATE_ON_CAP"]) == (str(GiB // 2), "0.4", on_cap)


def test_a_placement_id_never_starts_twice(mgrs, tmp_path):
    wm = mgrs.new()
    script = tiny_script(tmp_path, "dump.py", ENV_DUMP)
    msg = placement(tmp_path, "p1", [PY, script, 0])
    assert len(wm.start(msg)) == 2
    assert wm.start(msg) == []  # while it runs
    poll_until(wm, lambda ev: len(exits(ev)) == 2)
    assert wm.start(msg) == []  # after it ended
    wm.close()
    again = mgrs.new(epoch=2)  # a restarted node
    assert again.recover() == [] and again.start(msg) == []
    assert sorted((tmp_path / "work" / "starts.txt").read_text().split()) == ["0", "1"]  # each worker ran once


def test_a_start_and_a_polls_exits_are_each_one_save_made_before_their_messages(mgrs, tmp_path):
    """A start (the placement, then its launch) is saved once, and the exits one poll reaps once: each message the
    call returns was saved before it, since the caller sends them only after the call."""
    wm = mgrs.new()
    saves: list[list] = []
    real = wm.table.save

    def counted():
        saves.append([(p.placement_id, [w.running for w in p.workers]) for p in wm.table.placements.values()])
        real()

    wm.table.save = counted  # type: ignore[method-assign]
    started = wm.start(placement(tmp_path, "p1", [PY, "-c", "pass"]))
    assert [e.rank for e in started] == [0, 1]
    assert saves == [[("p1", [True, True])]]
    wait_for(lambda: not any(alive(w.pid) for w in wm.placements()[0].workers), 60, what="both workers to end")
    saves.clear()
    events = wm.poll()
    assert exits(events) == {0: 0, 1: 0}
    assert saves == [[("p1", [False, False])]]


# ---------------------------------------------------------------- refusals


def _listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


REFUSALS = [
    ("missing cwd", dict(cwd="/no/such/dir"), "does not exist"),
    ("relative cwd", dict(cwd="work"), "does not exist"),
    ("command not found", dict(command=["no-such-prog-xyz"]), "command not found: no-such-prog-xyz"),
    ("script not found", dict(command=[PY, "nope.py"]), "script not found: nope.py"),
    ("unknown GPU", dict(workers=((0, 0, (0,)), (1, 1, (7,)))), "GPU 7 is not on this node (it has 0,1)"),
    ("shared GPU", dict(workers=((0, 0, (1,)), (1, 1, (1,)))), "two workers share a GPU"),
    ("no GPU", dict(workers=((0, 0, ()),)), "without a GPU"),
    ("no workers", dict(workers=()), "no workers"),
    ("same rank", dict(workers=((0, 0, (0,)), (0, 1, (1,)))), "same rank"),
    ("master port bound", dict(port="bound"), "master port"),
]


@pytest.mark.parametrize("over, reason", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_starts_say_why_and_start_nothing(mgrs, tmp_path, over, reason):
    wm = mgrs.new()
    listener = _listener() if over.get("port") == "bound" else None
    if listener is not None:
        over = {**over, "port": listener.getsockname()[1]}
    over.setdefault("command", [PY, tiny_script(tmp_path, "dump.py", ENV_DUMP), 0])
    try:
        msg = placement(tmp_path, "p1", **over)
        out = wm.start(msg)
        assert len(out) == 1 and isinstance(out[0], P.StartRefused), out
        assert reason in out[0].reason and (out[0].placement_id, out[0].job_id) == ("p1", "job-a")
        assert wm.start(msg) == out  # a repeat gets the same answer
        assert wm.status() == [] and not (tmp_path / "work" / "starts.txt").exists()
    finally:
        if listener is not None:
            listener.close()


def test_master_port_is_checked_only_on_the_node_of_group_rank_0(mgrs, tmp_path):
    listener = _listener()
    try:
        port = listener.getsockname()[1]
        assert port_in_use(port)
        wm = mgrs.new()
        msg = placement(tmp_path, "p1", [PY, tiny_script(tmp_path, "dump.py", ENV_DUMP), 0], port=port, group_rank=1)
        assert all(isinstance(e, P.WorkerStarted) for e in wm.start(msg))
        poll_until(wm, lambda ev: len(exits(ev)) == 2)
    finally:
        listener.close()
    assert not port_in_use(port)


def test_a_guaranteed_placement_is_refused_a_gpu_another_guaranteed_one_runs_on(mgrs, tmp_path):
    wm = mgrs.new()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    assert len(wm.start(placement(tmp_path, "g1", [PY, waiter, "term"], workers=((0, 0, (0,)),), job="g"))) == 1
    clash = wm.start(placement(tmp_path, "g2", [PY, waiter, "term"], workers=((0, 0, (0,)),), job="h"))
    assert "GPU 0 already runs guaranteed job g (placement g1)" in clash[0].reason
    opp = wm.start(placement(tmp_path, "o1", [PY, waiter, "term"], workers=((0, 0, (0,)),), job="o",
                             priority="opportunistic"))
    assert isinstance(opp[0], P.WorkerStarted)  # opportunistic work may share the GPU


def test_a_start_after_its_own_stop_is_refused(mgrs, tmp_path):
    wm = mgrs.new()
    wm.stop("p9", 1.0, "job-a")  # the stop overtook the start
    out = wm.start(placement(tmp_path, "p9", [PY, tiny_script(tmp_path, "dump.py", ENV_DUMP), 0]))
    assert isinstance(out[0], P.StartRefused) and "stopped before it started" in out[0].reason


# ---------------------------------------------------------------- stop


@pytest.mark.slow
def test_stop_sends_sigterm_then_sigkill_after_the_grace_period_without_blocking(mgrs, tmp_path):
    wm = mgrs.new()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    wm.start(placement(tmp_path, "p1", [PY, waiter, "term"], workers=((0, 0, (0,)),), job="t"))
    wm.start(placement(tmp_path, "p2", [PY, waiter, "ignore"], workers=((1, 0, (1,)),), job="i"))
    ready(tmp_path, 0, 1)
    grace = 2.0
    t0 = time.monotonic()
    wm.stop("p1", grace)
    wm.stop("p2", grace)
    assert time.monotonic() - t0 < 0.5  # signals only, no waiting
    events, times = [], {}

    def seen(ev):
        for rank in exits(ev):
            times.setdefault(rank, time.monotonic())
        return len(exits(ev)) == 2

    poll_until(wm, seen, timeout=30, events=events)
    assert exits(events) == {0: 143, 1: 137}  # handled SIGTERM; ignored it and got SIGKILL
    assert times[0] - t0 < grace  # SIGTERM works at once
    assert times[1] - t0 >= grace  # SIGKILL only after the grace period
    wm.stop("p1", grace)  # idempotent: nothing left to signal
    assert wm.poll() == []


# ---------------------------------------------------------------- restart


@pytest.mark.slow
def test_a_restarted_manager_readopts_live_workers_and_reports_the_dead(mgrs, tmp_path):
    a = mgrs.new(gpus=(0, 1, 2))
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    msg = placement(tmp_path, "p1", [PY, waiter, "term", 5], workers=((0, 0, (0,)), (1, 1, (1,)), (2, 2, (2,))))
    started = {e.rank: e.pid for e in a.start(msg)}
    ready(tmp_path, 0, 1, 2)
    with pytest.raises(StateDirError):
        WorkerManager(a.cfg)  # while a node holds the folder, no second node takes it
    a.close()  # the node "crashes": its workers keep running (they never held the folder's lock)
    os.killpg(started[1], signal.SIGKILL)  # rank 1 dies while no node watches: no exit status left
    (tmp_path / "work" / "release-2").touch()  # rank 2 ends by itself with code 5: its launcher records it
    wait_for(lambda: not alive(started[1]) and not alive(started[2]), 30, what="ranks 1 and 2 to end")

    b = mgrs.new(epoch=2, gpus=(0, 1, 2))
    recovered = b.recover()
    assert exits(recovered) == {1: -1, 2: 5} and {e.epoch for e in recovered} == {2}
    status = {s.rank: s for s in b.status()}
    assert status[0].running and status[0].pid == started[0]  # re-adopted, same process
    assert b.start(msg) == []  # a known placement never starts again
    b.stop("p1", 10.0)
    events = poll_until(b, lambda ev: 0 in exits(ev), timeout=30)
    assert exits(events) == {0: 143}  # not its child: the code comes from the launcher's exit file


def test_a_started_worker_is_recorded_with_its_process_start_time(mgrs, tmp_path):
    """The table's ``create_time`` is computed at the fork (the child's /proc stat is not read on the start
    path), and matches what psutil reads of the process to within a clock tick."""
    a = mgrs.new()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    (ev,) = a.start(placement(tmp_path, "p1", [PY, waiter, "term"], workers=((0, 0, (0,)),)))
    ready(tmp_path, 0)
    worker = json.loads((tmp_path / "state" / "workers.json").read_text())["placements"][0]["workers"][0]
    assert worker["pid"] == ev.pid
    assert abs(psutil.Process(ev.pid).create_time() - worker["create_time"]) <= 1.0 / os.sysconf("SC_CLK_TCK") + 1e-6
    a.stop("p1", 0.0)
    poll_until(a, lambda evs: 0 in exits(evs), timeout=30)


def test_a_slow_fork_has_its_start_time_read():
    """Boot ticks more than one apart around the fork: the start is not known to a tick, so it is read."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        real = psutil.Process(proc.pid).create_time()
        bogus = 1_000_000  # a tick count far from the process's real start
        assert _create_time(proc.pid, bogus, bogus + 50) == real
        assert _create_time(proc.pid, bogus, bogus + 1) != real  # close enough: computed, not read
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_is_never_adopted_or_signalled(mgrs, tmp_path):
    a = mgrs.new()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    a.start(placement(tmp_path, "p1", [PY, waiter, "term"], workers=((0, 0, (0,)),)))
    ready(tmp_path, 0)
    a.close()
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = tmp_path / "state" / "workers.json"
        data = json.loads(state.read_text())
        worker = data["placements"][0]["workers"][0]
        os.killpg(worker["pid"], signal.SIGKILL)
        wait_for(lambda: not alive(worker["pid"]), 30, what="the old worker to die")
        # as if the pid had been reused: the table names a live process, but not the one it started
        worker["pid"] = stranger.pid
        assert abs(psutil.Process(stranger.pid).create_time() - worker["create_time"]) > 0.05
        state.write_text(json.dumps(data))
        b = mgrs.new(epoch=2)
        assert exits(b.recover()) == {0: -1}
        b.stop("p1", 0.0)
        b.poll()
        assert stranger.poll() is None  # never signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_an_unreadable_table_is_moved_aside(mgrs, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "workers.json").write_text("{ torn")
    wm = mgrs.new()
    assert wm.recover() == [] and wm.status() == []
    assert any(p.name.startswith("workers.json.unreadable-") for p in (tmp_path / "state").iterdir())


def test_promote_marks_the_placement_and_survives_a_restart(mgrs, tmp_path):
    a = mgrs.new()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    a.start(placement(tmp_path, "p1", [PY, waiter, "term"], workers=((0, 0, (0,)),), priority="opportunistic"))
    assert a.promote("nope") is None
    assert a.promote("p1") == "job-a" and a.promote("p1") == "job-a"  # idempotent
    ready(tmp_path, 0)
    a.close()
    b = mgrs.new(epoch=2)
    b.recover()
    (p,) = b.placements()
    assert p.promoted and p.klass == "guaranteed"
    clash = b.start(placement(tmp_path, "p2", [PY, waiter, "term"], workers=((0, 0, (0,)),), job="g"))
    assert "already runs guaranteed job job-a" in clash[0].reason  # promoted: it holds its GPU now


# ---------------------------------------------------------------- fencing that survives lost files (issue 22, item 2)


def _marked_sleeper(state_dir: Path, key: str, epoch: int) -> subprocess.Popen:
    from colocate.node.fencing import marker_env

    return subprocess.Popen(["sleep", "120"], env={**child_env(), **marker_env(str(state_dir), key, epoch)},
                            start_new_session=True)


@pytest.mark.parametrize("damage", ["lost", "corrupt"])
def test_a_node_whose_table_is_gone_kills_the_workers_it_finds_by_their_marker(mgrs, tmp_path, damage):
    """The table names nothing, but the processes say whose they are (COLOCATE_NODE_STATE, COLOCATE_PLACEMENT):
    the next node on the folder kills them (the launcher's group, and the job in it) before it takes work. A
    process marked by another node's folder is left alone."""
    a = mgrs.new(epoch=1)
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    a.start(placement(tmp_path, "p1", [PY, waiter, "ignore"], workers=((0, 0, (0,)),)))
    ready(tmp_path, 0)
    launcher = a.placements()[0].workers[0].pid
    job = [c.pid for c in psutil.Process(launcher).children()]
    assert job
    a.close()
    other = _marked_sleeper(tmp_path / "another-node", "p1", 1)
    try:
        table = tmp_path / "state" / "workers.json"
        if damage == "lost":
            table.unlink()
            (tmp_path / "state" / "lease").write_text('{"until": 0, "grace_s": 0}')  # a node ran here
        else:
            table.write_text('{"format": 1, "placements": [["p1", "job-a", "guaranteed"]]}')
        b = mgrs.new(epoch=2)
        assert b.table.lost
        assert b.recover() == [] and b.status() == []
        for pid in [launcher, *job]:
            assert not alive(pid), pid  # gone when recover() returns: it waited for them
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_surviving_table_keeps_its_workers_and_their_epoch_in_the_lease(mgrs, tmp_path):
    """Re-adopted workers are not orphans; the epochs the node holds are those of its workers and its own."""
    a = mgrs.new(epoch=1)
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    a.start(placement(tmp_path, "p1", [PY, waiter, "term"], workers=((0, 0, (0,)),)))
    ready(tmp_path, 0)
    launcher = a.placements()[0].workers[0].pid
    a.close()
    stale = _marked_sleeper(tmp_path / "state", "p1", 7)  # an incarnation the table does not hold
    try:
        b = mgrs.new(epoch=2)
        assert not b.table.lost
        b.recover()
        assert alive(launcher) and b.status()[0].running
        assert b.epochs() == {1, 2}
        wait_for(lambda: stale.poll() is not None, 10, what="the unheld marked process to be killed")
    finally:
        stale.kill()
        stale.wait()


GOOD_WORKER = {"rank": 0, "local_rank": 0, "gpus": [0], "pid": 99999999, "create_time": 1.0, "log_path": "/l",
               "exit_file": "/e"}


@pytest.mark.parametrize("text, words", [
    ('{"format": 1, "placements": [["p1", "job", 3]]}', "placements[0]: expected a map, got list"),
    ('[{"format": 1}]', "expected a map, got list"),
    (json.dumps({"format": 1, "placements": [{"placement_id": "p1", "job_id": "j", "priority": "guaranteed",
                                              "workers": [{**GOOD_WORKER, "rank": "0"}]}]}),
     "workers[0].rank: expected an integer, got '0'"),
    (json.dumps({"format": 1, "placements": [{"placement_id": "p1", "job_id": "j", "priority": "guaranteed",
                                              "workers": [GOOD_WORKER]}], "done": []}), "done: expected a map"),
    ('{"format": 1, "placements": [{"placement_id": "p1", "job_', "Unterminated string"),
])
def test_a_corrupt_table_is_refused_in_one_line(mgrs, tmp_path, caplog, text, words):
    """Issue 22, item 11: a corrupt table (a placement stored as a list, a wrong type, a truncated file) is one log
    line naming what is wrong (no traceback, never accepted as it is), moved aside; the node starts empty."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "workers.json").write_text(text)
    with caplog.at_level("ERROR", logger="colocate.node.workers"):
        wm = mgrs.new()
        events = wm.recover()
    assert events == [] and wm.status() == [] and wm.table.lost
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is None and "\n" not in errors[0].getMessage(), errors
    assert words in errors[0].getMessage()
    assert any(p.name.startswith("workers.json.unreadable-") for p in (tmp_path / "state").iterdir())


def test_a_deleted_state_dir_is_made_again_when_the_table_is_saved(mgrs, tmp_path):
    """Issue 22, item 9: the table is saved again into a folder made again (and locked again)."""
    import shutil

    wm = mgrs.new()
    wm.stop("px", 1.0)  # something to save
    shutil.rmtree(tmp_path / "state")
    wm.stop("py", 1.0)
    assert "py" in json.loads((tmp_path / "state" / "workers.json").read_text())["stopped_unknown"]
    with pytest.raises(StateDirError):
        mgrs.new()  # the folder made again is held by this node


# ---------------------------------------------------------------- logs and exit files: scoped by cluster and placement


def _node(mgrs, cluster: str, epoch: int = 1) -> WorkerManager:
    """A manager on the test's node folders (state, logs) for the scheduler of ``cluster`` (its welcome's id)."""
    import dataclasses

    cfg = WorkerConfig(node_id="n1", epoch=epoch, job_endpoint=f"ipc://{mgrs.tmp}/no-node.sock", device="sim",
                       gpus={0: GiB, 1: GiB}, log_dir=str(mgrs.tmp / "logs"), state_dir=str(mgrs.tmp / "state"))
    wm = WorkerManager(dataclasses.replace(cfg, cluster_id=cluster))
    mgrs.all.append(wm)
    wm.welcomed(cluster)
    return wm


def _job_1(tmp: Path, cluster: str, command, user: str = "") -> P.StartPlacement:
    """Job 1's first placement ("1.1") in ``cluster``: what every new scheduler state file starts with."""
    import dataclasses

    msg = placement(tmp, "1.1", command, workers=((0, 0, (0,)),), job="1")
    return dataclasses.replace(msg, cluster_id=cluster, request=dataclasses.replace(msg.request, user=user))


def test_a_new_clusters_job_1_never_sees_nor_appends_to_an_old_clusters_job_1_log(mgrs, tmp_path):
    """QA: with a new scheduler state file job ids restart at 1; the new job 1 on the same node got the old job 1's
    folder and log (another user's output, secrets included), and `colocate logs 1` showed it."""
    from colocate.node import logs

    old = _node(mgrs, "c-old")
    (started,) = old.start(_job_1(tmp_path, "c-old", [PY, "-c", "print('secret=alices-token')"]))
    poll_until(old, lambda ev: 0 in exits(ev))
    old.close()
    new = _node(mgrs, "c-new", epoch=2)
    new.recover()
    (mine,) = new.start(_job_1(tmp_path, "c-new", [PY, "-c", "print('bob was here')"]))
    poll_until(new, lambda ev: 0 in exits(ev))
    text = Path(mine.log_path).read_text()
    assert "bob was here" in text and "alices-token" not in text, text
    assert "bob was here" not in Path(started.log_path).read_text()  # the old one is not appended to either
    assert mine.log_path == str(tmp_path / "logs" / "c-new" / "1" / "worker-0.1.1.log")
    assert [Path(w.exit_file) for p in new.placements() if p.cluster == "c-new" for w in p.workers] == \
        [tmp_path / "logs" / "c-new" / "1" / "worker-0.1.1.exit"]
    # the relay: the node answers `colocate logs 1` for the cluster that welcomed it, from its table or its folder
    req = P.LogTailRequest(request_id="q", job_id="1", rank=0)
    for known in (new.log_of("1", 0, "c-new"), None):
        tail = logs.answer(req, "n1", 2, str(tmp_path / "logs"), "c-new", known)
        assert "bob was here" in tail.text and "alices-token" not in tail.text and not tail.error, tail
    assert new.log_of("1", 0, "c-other") is None and new.log_of("2", 0, "c-new") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a log of another uid, and a node that switches accounts")
def test_a_new_clusters_job_1_starts_beside_an_old_job_1_log_of_another_account(mgrs, tmp_path):
    """QA: the old job 1's log belonged to another uid, so the new job 1's start was refused ("... belongs to uid
    N, not to the job's account") on every retry and the job failed."""
    from colocate.node.accounts import Accounts

    old = _node(mgrs, "c-old")
    (started,) = old.start(_job_1(tmp_path, "c-old", [PY, "-c", "print('alice')"]))
    poll_until(old, lambda ev: 0 in exits(ev))
    os.chown(started.log_path, 54321, 54321)  # alice's account's, as a root node leaves it
    old.close()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "users").write_text("* root\n")  # bob's jobs run as root: a switching node's checks apply
    new = _node(mgrs, "c-new", epoch=2)
    new.accounts = Accounts(str(tmp_path / "keys"))
    new.recover()
    out = new.start(_job_1(tmp_path, "c-new", [PY, "-c", "print('bob')"], user="bob"))
    assert [type(e) for e in out] == [P.WorkerStarted], out
    assert exits(poll_until(new, lambda ev: 0 in exits(ev))) == {0: 0}


@pytest.mark.slow
def test_a_readopted_worker_never_takes_an_old_clusters_exit_file_for_its_own(mgrs, tmp_path):
    """The same job and placement ids in a new cluster: a re-adopted worker that died leaving no exit status
    (killed with its launcher) is reported unknown (-1), never with the code the old cluster's worker left."""
    old = _node(mgrs, "c-old")
    old.start(_job_1(tmp_path, "c-old", [PY, "-c", "pass"]))
    assert exits(poll_until(old, lambda ev: 0 in exits(ev))) == {0: 0}  # its launcher wrote "0"
    old.close()
    waiter = tiny_script(tmp_path, "wait.py", WAITER)
    new = _node(mgrs, "c-new", epoch=2)
    new.recover()
    (started,) = new.start(_job_1(tmp_path, "c-new", [PY, waiter, "term"]))
    ready(tmp_path, 0)
    new.close()  # the node crashes; then its worker is killed with its launcher: no exit status is left
    os.killpg(started.pid, signal.SIGKILL)
    wait_for(lambda: not alive(started.pid), 30, what="the worker to die")
    again = _node(mgrs, "c-new", epoch=3)
    assert exits(again.recover()) == {0: -1}


def test_a_worker_of_a_table_from_before_the_cluster_folders_keeps_its_files(mgrs, tmp_path):
    """Migration: a table saved by a node of the old layout (``LOG_DIR/JOB/worker-R.log``) still loads; its worker's
    exit code and log are read from the paths the table holds."""
    folder = tmp_path / "logs" / "job-a"
    folder.mkdir(parents=True)
    (folder / "worker-0.log").write_text("old layout\n")
    (folder / "worker-0.p1.exit").write_text("7\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "workers.json").write_text(json.dumps({"format": 2, "placements": [
        {"placement_id": "p1", "job_id": "job-a", "priority": "guaranteed", "cluster": "c1",
         "workers": [{**GOOD_WORKER, "log_path": str(folder / "worker-0.log"),
                      "exit_file": str(folder / "worker-0.p1.exit")}]}]}))
    wm = _node(mgrs, "c1")
    assert exits(wm.recover() + wm.welcomed("c1")) == {0: 7}
    assert wm.log_of("job-a", 0, "c1") == str(folder / "worker-0.log")


def test_a_launcher_that_cannot_be_started_names_the_file(mgrs, tmp_path):
    """QA: "cannot start the launcher: Permission denied" named no file."""
    import dataclasses

    python = tmp_path / "not-executable"
    python.write_text("")
    python.chmod(0o644)
    wm = WorkerManager(dataclasses.replace(mgrs.new().cfg, python=str(python), state_dir=str(tmp_path / "s2")))
    mgrs.all.append(wm)
    (out,) = wm.start(placement(tmp_path, "p1", [PY, "-c", "pass"], workers=((0, 0, (0,)),)))
    assert isinstance(out, P.StartRefused)
    assert out.reason == f"cannot start the launcher: Permission denied: {python}", out.reason
