"""A job never has two live copies that make progress: a scheduler and `colocate node` daemons on loopback, a
node silenced (SIGSTOP, SIGTERM and a restart, kill -9 and a restart) or outliving its scheduler's state file.

Every worker appends ``JOB TAG PID TIME`` to a progress file every 0.1 s, so two copies making progress at once
are seen from outside the daemons: two pids of one job whose progress intervals overlap. A worker runs until the
test releases its job (a stop file), once the copy has made progress past the moment a scheduler that ignored the
fault's end would have placed the job again (``replace_after_s``, a fault's window): nothing waits for a fixed
job length. The tests of the default lease share one scheduler and two nodes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from colocate.base.endpoints import NODE_LEASE_S, replace_after_s
from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import PY, Procs, free_port, read_log, wait_for, wait_until_scheduler_answers

PROGRESS = """\
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end and not os.path.exists(sys.argv[2]):
    with open(os.environ["PROGRESS"], "a") as f:
        f.write(f"{os.environ['COLOCATE_JOB_ID']} {os.environ.get('TAG', '-')} {os.getpid()} {time.time():.3f}\\n")
    time.sleep(0.1)
"""


class Fleet:
    """A scheduler (state file ``state``) and nodes of one simulated GPU each, on 127.0.0.1."""

    def __init__(self, procs: Procs, tmp: Path, nodes: int, lease_s: float | None = None):
        self.procs, self.tmp, self.lease_s = procs, tmp, lease_s
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.progress = tmp / "progress.txt"
        self.progress.touch()
        self.script = tmp / "progress.py"
        self.script.write_text(PROGRESS)
        self.scheduler = None
        self.stops: dict[str, Path] = {}
        self.start_scheduler(tmp / "sched.db")
        self.nodes = {f"n{i}": self.start_node(f"n{i}") for i in range(nodes)}
        self.client = SchedulerClient(self.endpoint, None, timeout_s=5.0)
        self.wait_up(set(self.nodes))

    def start_scheduler(self, state: Path):
        argv = [PY, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state", state, "--config",
                "antman", "--log-level", "info"] + (["--lease", self.lease_s] if self.lease_s is not None else [])
        self.scheduler = self.procs.start(argv, f"scheduler-{state.stem}.log")
        client = SchedulerClient(self.endpoint, None, timeout_s=0.5)

        wait_until_scheduler_answers(self.scheduler, client)

    def start_node(self, node_id: str):
        argv = [PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", 1, "--scheduler", self.endpoint,
                "--node-id", node_id, "--host", "127.0.0.1", "--endpoint", f"ipc://{self.tmp}/{node_id}.sock",
                "--log-dir", self.tmp / "logs", "--state-dir", self.tmp / node_id, "--log-level", "info"]
        return self.procs.start(argv, f"{node_id}.log")

    def wait_up(self, ids: set, timeout: float = 60):
        wait_for(lambda: {n.node_id for n in self.client.nodes().nodes if n.up} >= ids, timeout,
                 what=f"nodes {sorted(ids)} up")

    def submit(self, seconds: float = 120.0, tag: str = "-") -> str:
        """A job whose workers run ``seconds`` at most, or until ``release(job)``."""
        stop = self.tmp / f"stop-{len(self.stops)}"
        env = {**os.environ, "PROGRESS": str(self.progress), "TAG": tag}
        job = self.client.submit(request_from_here([PY, str(self.script), f"{seconds:g}", str(stop)], environ=env,
                                                   cwd=str(self.tmp)))
        self.stops[job] = stop
        return job

    def release(self, job_id: str) -> None:
        """Every copy of ``job_id``, now or later, ends at once (successfully)."""
        self.stops[job_id].touch()

    def ready(self) -> None:
        """Every node runs (one a failed test left dead is started again) and is up."""
        for node_id, proc in self.nodes.items():
            if proc.poll() is not None:
                self.nodes[node_id] = self.start_node(node_id)
        self.wait_up(set(self.nodes))

    def job(self, job_id: str):
        return {j.job_id: j for j in self.client.jobs()[0]}[job_id]

    def wait_state(self, job_id: str, states, timeout: float):
        return wait_for(lambda: (j := self.job(job_id)).state in states and j, timeout, interval=0.2,
                        what=f"job {job_id} to be {'/'.join(states)}")

    def failed_starts(self, state: Path, job_id: str) -> int:
        with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as db:
            return db.execute("SELECT failed_starts FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]

    def runs(self, job_id: str, tag: str | None = None) -> dict[int, tuple[float, float]]:
        """pid -> (first, last) progress time of each copy of ``job_id`` (of ``tag``, if given)."""
        out: dict[int, tuple[float, float]] = {}
        for line in self.progress.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4 or parts[0] != job_id or (tag is not None and parts[1] != tag):
                continue
            pid, t = int(parts[2]), float(parts[3])
            first, last = out.get(pid, (t, t))
            out[pid] = (min(first, t), max(last, t))
        return out

    def progressing(self, job_id: str, since: float) -> int | None:
        """The pid of a copy of ``job_id`` that made progress after ``since`` (wall clock), else None."""
        return next((pid for pid, (_, last) in self.runs(job_id).items() if last > since), None)

    def logs(self) -> str:
        return "\n".join(f"==> {p.log_path.name}\n{read_log(p)[-3000:]}" for p in self.procs.all)

    def kill_workers(self) -> None:
        """SIGKILL the process group (the launcher's) of every worker that wrote progress."""
        pids = {int(line.split()[2]) for line in self.progress.read_text().splitlines() if len(line.split()) == 4}
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def overlaps(runs: dict[int, tuple[float, float]]) -> list:
    """Pairs of copies whose progress intervals overlap: two live copies making progress at once."""
    spans = sorted((first, last, pid) for pid, (first, last) in runs.items())
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] <= a[1]]


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    fleets: list[Fleet] = []
    p.fleets = fleets
    yield p
    for f in fleets:
        f.kill_workers()
    p.cleanup()


def fleet(procs, tmp_path, nodes: int, lease_s: float | None = None) -> Fleet:
    f = Fleet(procs, tmp_path, nodes, lease_s)
    procs.fleets.append(f)
    return f


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One scheduler (default lease) and two nodes for the tests whose faults end with every node back up."""
    tmp = tmp_path_factory.mktemp("fleet")
    p = Procs(tmp)
    f = Fleet(p, tmp, nodes=2)
    yield f
    f.kill_workers()
    p.cleanup()


@pytest.fixture
def fleet2(shared):
    """The shared fleet, every node up; the workers of a test that failed are stopped after it."""
    shared.ready()
    yield shared
    for job in shared.stops:
        shared.release(job)


def window_passes(f: Fleet, job: str, last_heard: float) -> None:
    """Wait until a copy of ``job`` made progress past the moment a scheduler that ignored the fault's end would
    have placed it again (``replace_after_s`` after the node was last heard, plus 1 s), then release the job."""
    since = last_heard + replace_after_s(NODE_LEASE_S) + 1.0
    wait_for(lambda: f.progressing(job, since), since - time.time() + 60, interval=0.2,
             what=f"job {job} to make progress past its fault's window")
    f.release(job)


def running_on(f: Fleet, job_id: str, timeout: float = 60) -> tuple[str, int]:
    """(node id, worker pid) once the job runs and its worker makes progress."""
    j = f.wait_state(job_id, ("running",), timeout)
    pid = wait_for(lambda: f.progressing(job_id, 0.0), timeout, what=f"job {job_id} to make progress")
    return j.nodes[0], pid


def finished_by_one_copy_at_a_time(f: Fleet, job: str, pid: int) -> None:
    """The job succeeded, never two copies at once, no failed start; the copy ``pid`` went on to the end unless
    the node's return outlasted its lease (a slow machine), in which case it was fenced before another ran."""
    j = f.wait_state(job, ("succeeded", "failed"), 120)
    runs = f.runs(job)
    assert overlaps(runs) == [], (runs, f.logs())
    assert j.state == "succeeded" and (list(runs) == [pid]) == (j.attempts == 1), (j, runs, f.logs())
    assert f.failed_starts(f.tmp / "sched.db", job) == 0


def hold(seconds: float) -> None:
    """The fault lasts ``seconds`` (the scenario's own duration, not a wait for something)."""
    end = time.monotonic() + seconds
    wait_for(lambda: time.monotonic() >= end, seconds + 1, interval=0.05, what=f"{seconds} s to pass")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_stopped_for_8s_keeps_its_job_and_no_second_copy_runs(fleet2):
    """SIGSTOP for 8 s (< the 10 s lease): the node is down after 2.4 s, but its job is not placed again
    (that waits for lease + grace since it was last heard); after SIGCONT it is reconciled and the job goes on."""
    f = fleet2
    job = f.submit()
    victim, pid = running_on(f, job)
    node = f.nodes[victim]
    t_stop = time.time()
    node.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not next(n for n in f.client.nodes().nodes if n.node_id == victim).up, 10,
                 what="the silent node to be marked down")
        hold(8.0 - 2.4)
    finally:
        node.send_signal(signal.SIGCONT)
    f.wait_up({victim}, 30)
    window_passes(f, job, t_stop)
    finished_by_one_copy_at_a_time(f, job, pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_whose_lease_lapses_has_its_worker_stopped_before_the_job_is_placed_again(procs, tmp_path):
    """With a 3 s lease, an 8 s SIGSTOP outlasts it: the worker's launcher stops it (the lease lapsed) before the
    scheduler places the job again (lease + grace after it last heard the node); the returning node's report of
    the fenced exit costs the job nothing."""
    f = fleet(procs, tmp_path, nodes=2, lease_s=3.0)
    job = f.submit()
    victim, pid = running_on(f, job)
    node = f.nodes[victim]
    node.send_signal(signal.SIGSTOP)
    t_stop = time.time()
    try:
        hold(8.0)
    finally:
        node.send_signal(signal.SIGCONT)
    f.wait_up({victim}, 30)  # back, it has reported the fenced exit; the job goes on in its new copy
    t_up = time.time()
    wait_for(lambda: f.progressing(job, t_up + 1.0) not in (None, pid), 60, interval=0.2,
             what="the job's new copy to make progress after the node's return")
    f.release(job)
    j = f.wait_state(job, ("succeeded", "failed"), 120)
    runs = f.runs(job)
    assert overlaps(runs) == [], (runs, f.logs())
    assert runs[pid][1] < t_stop + 3.0 + 3.0 + 0.6  # fenced: it stopped within lease + grace of the stop
    assert j.state == "succeeded" and j.attempts >= 2 and len(runs) >= 2, (j, runs, f.logs())
    assert f.failed_starts(tmp_path / "sched.db", job) == 0
    logs = sorted((tmp_path / "logs").glob(f"*/{job}/worker-0.*.log"))  # LOG_DIR/CLUSTER/JOB, one per placement
    assert any("lease" in p.read_text() for p in logs), logs  # the fenced copy's launcher said why


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_stopped_and_restarted_6s_later_keeps_its_job(fleet2):
    """SIGTERM leaves the workers running; a node started again 6 s later on the same state dir re-adopts them
    and the scheduler, which had held the placement, keeps it: one copy, no start failure."""
    f = fleet2
    job = f.submit()
    victim, pid = running_on(f, job)
    t_term = time.time()
    f.nodes[victim].send_signal(signal.SIGTERM)
    f.nodes[victim].wait(30)
    hold(6.0)
    f.nodes[victim] = f.start_node(victim)
    f.wait_up({victim}, 30)
    window_passes(f, job, t_term)
    finished_by_one_copy_at_a_time(f, job, pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_of_a_node_and_a_restart_uses_none_of_the_jobs_start_failures(fleet2):
    """The documented recovery: the node restarted at once on its state dir re-adopts the worker; the job keeps
    its one copy (not placed on the other node either) and its start failures."""
    f = fleet2
    job = f.submit()
    victim, pid = running_on(f, job)
    t_kill = time.time()
    f.nodes[victim].send_signal(signal.SIGKILL)
    f.nodes[victim].wait(30)
    f.nodes[victim] = f.start_node(victim)
    f.wait_up({victim}, 30)
    window_passes(f, job, t_kill)
    j = f.wait_state(job, ("succeeded", "failed"), 120)
    runs = f.runs(job)
    assert overlaps(runs) == [], (runs, f.logs())
    assert j.state == "succeeded" and j.attempts == 1 and list(runs) == [pid], (j, runs, f.logs())
    assert f.failed_starts(f.tmp / "sched.db", job) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_that_outlived_its_schedulers_state_file_takes_no_new_placement_for_an_old_one(procs, tmp_path):
    """The scheduler starts again on a new state file (a new cluster id): its placement "1.1" is not the old
    "1.1" the node remembers; the old cluster's worker is stopped, the new job runs, with no failed start."""
    f = fleet(procs, tmp_path, nodes=1)
    old = f.submit(120.0, tag="old")
    assert old == "1"
    running_on(f, old)
    f.scheduler.send_signal(signal.SIGKILL)
    f.scheduler.wait(30)
    f.start_scheduler(tmp_path / "new.db")
    f.wait_up(set(f.nodes), 30)
    new = f.submit(3.0, tag="new")
    assert new == "1"  # the same job id, so the same first placement id: 1.1
    j = f.wait_state(new, ("succeeded", "failed"), 120)
    old_runs, new_runs = f.runs("1", "old"), f.runs("1", "new")
    assert j.state == "succeeded" and len(new_runs) == 1, (j, new_runs, f.logs())
    (old_last,) = [last for _, last in old_runs.values()]
    (new_first,) = [first for first, _ in new_runs.values()]
    assert old_last < new_first, (old_runs, new_runs)  # the old cluster's worker stopped before the new one ran
    assert f.failed_starts(tmp_path / "new.db", new) == 0


def _remove_tree(path: Path) -> bool:
    """Delete ``path`` (True once it is gone; a node writing into it meanwhile makes one try fail)."""
    import shutil

    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return not path.exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["lost", "corrupt"])
def test_a_node_killed_and_restarted_at_once_without_its_table_never_runs_two_copies(procs, tmp_path, damage):
    """Issue 22, item 2: kill -9 a node; lose (or corrupt: a placement stored as a list) its workers.json; start it
    again on the same state dir at once. The orphan is found from its process (COLOCATE_PLACEMENT) and killed before
    the node takes work; the job runs again, never two copies at once."""
    from tests.support import alive

    f = fleet(procs, tmp_path, nodes=1)
    job = f.submit()
    victim, pid = running_on(f, job)
    f.nodes[victim].send_signal(signal.SIGKILL)
    f.nodes[victim].wait(30)
    table = tmp_path / victim / "workers.json"
    if damage == "lost":
        table.unlink()
    else:
        table.write_text('{"format": 1, "placements": [["1.1", "1", "guaranteed"]]}')
    f.nodes[victim] = f.start_node(victim)
    f.wait_up({victim}, 60)
    t_up = time.time()
    wait_for(lambda: set(f.runs(job)) - {pid}, 90, interval=0.2, what=f"the job's new copy to make progress {t_up}")
    f.release(job)
    j = f.wait_state(job, ("succeeded", "failed"), 120)
    runs = f.runs(job)
    assert overlaps(runs) == [], (runs, f.logs())
    assert j.state == "succeeded" and len(runs) == 2, (j, runs, f.logs())
    assert not alive(pid)
    assert "orphan" in read_log(f.nodes[victim])
    assert "Traceback" not in read_log(f.nodes[victim])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_deleted_state_dir_is_made_again_and_its_job_goes_on(procs, tmp_path):
    """Issue 22, item 9: the state dir of a node running a job is deleted. The node makes it again (table saved,
    lease renewed), the launcher keeps the lease it was promised meanwhile: the same copy runs to success, and the
    node says so once instead of "cannot renew the lease" every heartbeat."""
    f = fleet(procs, tmp_path, nodes=1)
    job = f.submit()
    victim, pid = running_on(f, job)
    state = tmp_path / victim
    wait_for(lambda: _remove_tree(state), 30, what="the state dir to be deleted")
    wait_for(lambda: (state / "lease").exists() and (state / "workers.json").exists(), 30,
             what="the node to make its state dir again")
    t_back = time.time()
    wait_for(lambda: f.progressing(job, t_back + 2.0), 60, interval=0.2,
             what="the job to make progress after the state dir is back")
    f.release(job)
    j = f.wait_state(job, ("succeeded", "failed"), 120)
    assert j.state == "succeeded" and j.attempts == 1 and list(f.runs(job)) == [pid], (j, f.logs())
    log_text = read_log(f.nodes[victim])
    assert log_text.count("cannot renew the lease") <= 1, log_text[-3000:]
    assert "Traceback" not in log_text
