"""cluster/server/journal.py and journal_file.py: the state file's lock, its schema migration, and refused writes."""

from __future__ import annotations

import os
import socket
import sqlite3

import pytest

from cluster.server import journal_file
from cluster.server.journal import Journal, JournalError, JournalLocked, JournalLockLost, JournalUnavailable
from cluster.spec import JobSpec


def test_one_journal_per_file_whatever_path_names_it(tmp_path):
    first = Journal(str(tmp_path / "s.db"))
    os.symlink(tmp_path / "s.db", tmp_path / "alias.db")
    for path in (tmp_path / "s.db", tmp_path / "alias.db"):
        with pytest.raises(JournalLocked, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            Journal(str(path))
    first.close()
    Journal(str(tmp_path / "alias.db")).close()  # the lock goes with its holder


def _replace(lock):
    lock.unlink()
    lock.write_text("someone else's\n")


@pytest.mark.parametrize("change, why", [(lambda lock: lock.unlink(), "was removed"), (_replace, "was replaced")])
def test_a_lock_file_removed_or_replaced_stops_every_commit(tmp_path, change, why):
    first = Journal(str(tmp_path / "s.db"))
    with first.transaction():
        first.insert_job(JobSpec("1"), "{}", 1.0)
    change(tmp_path / "s.db.lock")  # taken for a stale lock: a second scheduler may lock a new file now
    with pytest.raises(JournalLockLost, match=why), first.transaction():
        first.insert_job(JobSpec("2"), "{}", 2.0)
    with pytest.raises(JournalLockLost, match=why), first.batch():
        with first.transaction():
            first.insert_job(JobSpec("3"), "{}", 3.0)
    with pytest.raises(JournalLockLost):
        first.writable()
    if why == "was removed":
        with pytest.raises(JournalLocked, match="the file itself is locked"):  # while the first has it open
            Journal(str(tmp_path / "s.db"))
        first.close()
        second = Journal(str(tmp_path / "s.db"))  # the lock is free to take: what the first committed is there
        assert [r.spec.job_id for r in second.records()] == ["1"]
        with second.transaction():
            second.insert_job(JobSpec("4"), "{}", 4.0)
        second.close()
    first.close()
    assert [r.spec.job_id for r in _records(tmp_path / "s.db")] == ["1"] + (["4"] if why == "was removed" else [])


def _remove_state(db):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{db}{suffix}"):
            os.unlink(f"{db}{suffix}")


@pytest.mark.parametrize("change, why", [(_remove_state, "state file was removed")])
def test_a_state_file_removed_while_the_scheduler_runs_stops_every_commit(tmp_path, change, why):
    """What it would commit now is lost with the file (and a restart starts empty): nothing more is committed, so
    nothing more is acknowledged (submits went on being acknowledged into the deleted file)."""
    first = Journal(str(tmp_path / "s.db"))
    with first.transaction():
        first.insert_job(JobSpec("1"), "{}", 1.0)
    change(tmp_path / "s.db")
    with pytest.raises(JournalLockLost, match=why), first.transaction():
        first.insert_job(JobSpec("2"), "{}", 2.0)
    with pytest.raises(JournalLockLost, match=why), first.batch():
        with first.transaction():
            first.insert_job(JobSpec("3"), "{}", 3.0)
    first.close()


def test_another_programs_sqlite_file_is_refused_untouched(tmp_path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE foo (x)")
    con.commit()
    con.close()
    os.chmod(path, 0o644)
    with pytest.raises(JournalError, match="not a colocate scheduler state file .* the tables foo"):
        Journal(str(path))
    con = sqlite3.connect(path)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["foo"]
    con.close()
    assert os.stat(path).st_mode & 0o777 == 0o644
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n" * 20)
    os.chmod(text, 0o644)
    with pytest.raises(JournalError, match="not a colocate scheduler state file"):
        Journal(str(text))
    assert os.stat(text).st_mode & 0o777 == 0o644


def test_a_hard_link_to_a_held_state_file_is_refused(tmp_path):
    first = Journal(str(tmp_path / "s.db"))
    os.link(tmp_path / "s.db", tmp_path / "hard.db")  # another name: another PATH.lock
    with pytest.raises(JournalLocked, match="the file itself is locked"):
        Journal(str(tmp_path / "hard.db"))
    first.close()
    Journal(str(tmp_path / "hard.db")).close()


def _records(path):
    j = Journal(str(path))
    try:
        return j.records()
    finally:
        j.close()


def test_a_lock_file_removed_between_its_open_and_its_lock_is_taken_again(tmp_path, monkeypatch):
    real, calls = journal_file.fcntl.flock, []

    def flock(fd, op):  # another process removes the file just before this one locks it
        if not calls:
            os.unlink(tmp_path / "s.db.lock")
        calls.append(fd)
        return real(fd, op)
    monkeypatch.setattr(journal_file.fcntl, "flock", flock)
    j = Journal(str(tmp_path / "s.db"))
    assert len(calls) == 3  # the first lock was on a file no longer there; then the state file itself
    monkeypatch.undo()
    with pytest.raises(JournalLocked):
        Journal(str(tmp_path / "s.db"))  # the lock that guards the file now
    with j.transaction():
        j.insert_job(JobSpec("1"), "{}", 1.0)
    j.close()


def test_a_schema_1_file_gets_request_ids(tmp_path):
    path = str(tmp_path / "s.db")
    Journal(path).close()
    db = sqlite3.connect(path)  # what a scheduler before request ids left
    db.executescript("DROP INDEX jobs_request; ALTER TABLE jobs DROP COLUMN request_id; "
                     "ALTER TABLE jobs DROP COLUMN submitter; UPDATE meta SET value = '1' WHERE key = 'schema';")
    db.close()
    j = Journal(path)
    with j.transaction():
        j.insert_job(JobSpec("1", user="alice"), "{}", 1.0, "r1")
    assert j.job_of_request("alice", "r1") == "1" and j.job_of_request("bob", "r1") is None
    with pytest.raises(sqlite3.IntegrityError), j.transaction():
        j.insert_job(JobSpec("2", user="alice"), "{}", 1.0, "r1")  # one job per (user, request id)
    j.close()


def test_a_refused_write_rolls_back_and_says_why(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    j.db.execute("PRAGMA query_only = 1")
    assert not j.writable()
    with pytest.raises(JournalUnavailable, match="readonly"), j.transaction():
        j.insert_job(JobSpec("1"), "{}", 1.0)
    j.db.execute("PRAGMA query_only = 0")
    assert j.writable() and j.job("1") is None
    j.close()


def test_a_closed_journal_says_so_in_one_line(tmp_path):
    j = Journal(str(tmp_path / "s.db"))
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalError, match=r"the journal .*s\.db is closed$"):
        j.job("1")
