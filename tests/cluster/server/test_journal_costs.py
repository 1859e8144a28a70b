"""cluster/server/journal.py (and its history table): per-request statements visit a bounded number of rows
(SQLite's VM steps are counted over a small and a ten times bigger table), the files are private, environments are kept only while
a job needs them, and a corrupt file is refused in one line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from cluster.predict.history import Exit, HistoryRecord
from cluster.server.journal import Journal, JournalError
from cluster.spec import JobSpec, Placement, WorkerSlot
from tests.support import free_port

REQUEST = json.dumps({"command": ["sleep", "1"], "cwd": "/tmp", "env": {"SECRET": "hunter2", "PATH": "/usr/bin"}})


def record(job_id: str, i: int) -> HistoryRecord:
    """A history record of job ``job_id``: ten fingerprints, families and users over the table."""
    return HistoryRecord(job_id, exact=f"e{i % 10}", family=f"f{i % 10}", user=f"u{i % 10}", gpus=1, gpu_type="sim",
                         wall_s=10.0, exit=Exit.SUCCEEDED, submit_s=1.0, end_s=2.0, peak_mem=1 << 20, busy=0.5)


def fill(j: Journal, n: int, active_every: int = 100) -> None:
    """``n`` jobs, all finished (each with its history record) but one in ``active_every`` (pending), written in one
    transaction."""
    with j.transaction():
        for i in range(n):
            job_id = j.new_job_id()
            j.insert_job(JobSpec(job_id, user="u"), REQUEST, 1.0, f"r{job_id}")
            if i % active_every:
                j.set_state(job_id, "succeeded", "", 2.0)
                j.add_history(record(job_id, i))


def steps(j: Journal, fn) -> int:
    """SQLite VM instructions ``fn`` runs (the progress handler is called every instruction)."""
    count = [0]

    def tick():
        count[0] += 1
        return 0

    j.db.set_progress_handler(tick, 1)
    try:
        fn()
    finally:
        j.db.set_progress_handler(None, 1)
    return count[0]


def per_request(j: Journal) -> dict:
    """Every statement the server runs per request, each as a callable (writes inside a transaction)."""
    n = int(j._meta("next_job")) - 1
    mid = str(n // 2)
    pl = Placement("p1", mid, (WorkerSlot(0, "n0", (0,)),), "guaranteed")

    def submit():
        with j.transaction():
            job_id = j.new_job_id()
            j.insert_job(JobSpec(job_id, user="u"), REQUEST, 3.0, f"new{job_id}")

    def write(fn):
        def run():
            with j.transaction():
                fn()
        return run

    return {
        "submit": submit,
        "job_of_request": lambda: j.job_of_request("u", f"r{mid}"),
        "job": lambda: j.job(mid),
        "set_state running": write(lambda: j.set_state(mid, "running", "", 4.0)),
        "set_state succeeded": write(lambda: j.set_state(mid, "succeeded", "", 4.0)),
        "set_placement": write(lambda: j.set_placement(mid, pl, 1, 0)),
        "set_exit_code": write(lambda: j.set_exit_code(mid, 0)),
        "add_log": write(lambda: j.add_log(mid, 0, "p1", "n0", "/tmp/x.log", 4.0)),
        "logs": lambda: j.logs(mid),
        "jobs, last page": lambda: j.jobs(False, n - 10, 500),
        "jobs, active": lambda: j.jobs(True, 0, 5),
        "stopping": write(lambda: (j.add_stopping("p9", mid, ("n0",), "x"), j.drop_stopping("p9"))),
        "stopping read": lambda: j.stopping(),
        "add_history": write(lambda: j.add_history(record(mid, n), oom_restart=True)),
        "history_of exact": lambda: j.history_of("exact", "e3", 50),
        "history_of family": lambda: j.history_of("family", "f3", 50),
        "history_of user": lambda: j.history_of("user", "u3", 50),
        "history_of_job": lambda: j.history_of_job(mid),
        "history_tail": lambda: j.history_tail(50),
        "oom_restarts": lambda: j.oom_restarts(),
    }


def test_no_per_request_statement_grows_with_the_table(tmp_path):
    costs = {}
    for n in (2_000, 20_000):
        j = Journal(str(tmp_path / f"{n}.db"))
        fill(j, n, active_every=n)  # one active job whatever the size
        costs[n] = {name: steps(j, fn) for name, fn in per_request(j).items()}
        j.close()
    grown = {name: (costs[2_000][name], costs[20_000][name]) for name in costs[2_000]
             if costs[20_000][name] > 2 * costs[2_000][name] + 200}
    assert not grown, f"statements that visit more rows in a 10x bigger table (steps small, big): {grown}"


def test_the_step_count_catches_a_full_scan(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    fill(j, 5_000)
    scan = steps(j, lambda: j.db.execute("SELECT COALESCE(MAX(submitted_at), 0) FROM jobs").fetchone())
    lookup = steps(j, lambda: j.job("10"))
    assert scan > 50 * lookup  # the test above would see an unindexed statement
    j.close()


def test_paging_by_offset_is_keyset_and_gives_every_job_once(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    fill(j, 1_234, active_every=10)
    for active in (False, True):
        seen, offset = [], 0
        while True:
            rows, total = j.jobs(active, offset, 100)
            seen += [r["job_id"] for r in rows]
            offset += len(rows)
            if not rows or offset >= total:
                break
        every = [str(i) for i in range(1, 1_235) if not active or (i - 1) % 10 == 0]
        assert seen == every and total == len(every)
    j.close()


def test_the_job_counter_survives_a_reopen_and_a_rollback(tmp_path):
    path = str(tmp_path / "s.db")
    j = Journal(path)
    fill(j, 3)
    with pytest.raises(RuntimeError), j.transaction():
        j.insert_job(JobSpec(j.new_job_id()), "{}", 1.0)
        raise RuntimeError("rolled back")
    j.close()
    j = Journal(path)
    assert j.new_job_id() == "4"
    j.close()


def test_the_journal_and_its_wal_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = str(tmp_path / "s.db")
        j = Journal(path)
        fill(j, 10)
        for f in (path, path + "-wal", path + "-shm", path + ".lock"):
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
        j.close()
        os.chmod(path, 0o644)  # a file an older scheduler left readable
        Journal(path).close()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        os.umask(old)


def test_an_environment_is_kept_while_the_job_may_run_and_cleared_when_it_ends(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    fill(j, 4, active_every=1)
    with j.transaction():
        j.set_state("1", "running", "", 3.0)
        j.set_state("1", "pending", "requeued", 4.0)  # a requeued job starts again: it still needs it
        for job_id, state in (("2", "succeeded"), ("3", "failed"), ("4", "cancelled")):
            j.set_state(job_id, state, "", 5.0)
    assert json.loads(j.job("1")["request"])["env"]["SECRET"] == "hunter2"
    for job_id in ("2", "3", "4"):
        request = json.loads(j.job(job_id)["request"])
        assert request["env"] == {} and request["command"] == ["sleep", "1"]
    with j.transaction():
        j.set_state("1", "cancelled", "", 6.0)
    j.close()  # the last close checkpoints the WAL into the file
    with open(tmp_path / "s.db", "rb") as f:
        assert b"hunter2" not in f.read()  # no copy left in a freed cell either


def corrupt_pages(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xa5" * 8192)


def corrupt_meta(path: str) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = 'seven' WHERE key = 'next_job'")
    db.commit()
    db.close()


def corrupt_placement(path: str) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET state = 'running', placement = '[1, 2]' WHERE job_id = '2'")
    db.commit()
    db.close()


def corrupt_spec(path: str) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET spec = '{\"job_id\": ' WHERE job_id = '1'")  # a pending job: read at restore
    db.commit()
    db.close()


@pytest.mark.parametrize("damage", [corrupt_pages, corrupt_meta, corrupt_placement, corrupt_spec])
def test_a_corrupt_journal_is_refused_in_one_line(tmp_path, damage):
    path = str(tmp_path / "s.db")
    j = Journal(path)
    fill(j, 3_000)
    j.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    j.close()
    damage(path)
    with pytest.raises(JournalError, match="corrupt"):
        j = Journal(path)
        try:
            j.records()
        finally:
            j.close()
    res = subprocess.run([sys.executable, "-m", "colocate", "scheduler", "--state", path, "--bind",
                          f"tcp://127.0.0.1:{free_port()}", "--insecure"], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "corrupt" in lines[0], res.stderr


def test_the_counter_in_a_batch_takes_back_a_rolled_back_savepoints_numbers_and_is_committed_once(tmp_path):
    path = str(tmp_path / "s.db")
    j = Journal(path)
    with j.batch() as b:
        with j.transaction():
            j.insert_job(JobSpec(j.new_job_id()), "{}", 1.0)
        with pytest.raises(RuntimeError), j.transaction():
            j.insert_job(JobSpec(j.new_job_id()), "{}", 1.0)
            raise RuntimeError("this one is rolled back")
        with j.transaction():
            j.insert_job(JobSpec(j.new_job_id()), "{}", 1.0)
    assert b.failed is None and [r["job_id"] for r in j.jobs(False, 0, 10)[0]] == ["1", "2"]
    j.close()
    j = Journal(path)
    assert j.new_job_id() == "3"  # what the batch wrote to meta at its commit
    j.close()


def test_the_step_count_catches_an_unindexed_history_lookup(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    fill(j, 5_000)
    scan = steps(j, lambda: j.db.execute("SELECT record FROM history WHERE gpu_type = 'x' LIMIT 50").fetchall())
    lookup = steps(j, lambda: j.history_of("exact", "e3", 50))
    assert scan > 10 * lookup  # an index on exact: the lookup visits its 50 rows only
    j.close()


def test_history_records_round_trip_newest_last_and_survive_a_reopen(tmp_path):
    path = str(tmp_path / "s.db")
    j = Journal(path)
    fill(j, 30, active_every=1000)
    got = j.history_of("family", "f3", 2)
    assert [r.job_id for r in got] == ["14", "24"]  # the two most recent of f3 (jobs 4, 14, 24), oldest first
    assert got[-1] == record("24", 23)
    assert [r.job_id for r in j.history_tail(3)] == ["28", "29", "30"]
    with j.transaction():
        j.add_history(record("30", 99), oom_restart=True)
    j.close()
    j = Journal(path)
    assert j.oom_restarts() == 1 and len(j.history_of_job("30")) == 2
    with pytest.raises(ValueError, match="looked up by"):
        j.history_of("gpu_type", "sim", 1)
    j.close()


def test_a_corrupt_history_record_is_refused_in_one_line(tmp_path):
    import sqlite3

    path = str(tmp_path / "s.db")
    j = Journal(path)
    fill(j, 5, active_every=1000)
    j.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE history SET record = '{\"job_id\": 7}' WHERE job_id = '3'")
    db.commit()
    db.close()
    j = Journal(path)
    with pytest.raises(JournalError, match="corrupt: the history record of job '3'") as e:
        j.history_tail(10)
    assert "\n" not in str(e.value)
    j.close()
