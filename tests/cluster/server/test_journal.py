"""cluster/server/journal.py and journal_file.py: the state file's lock, its schema migration, and refused writes."""

from __future__ import annotations

import os
import socket
import sqlite3

import pytest

from cluster.server.journal import Journal, JournalError, JournalLocked, JournalUnavailable
from cluster.spec import JobSpec


def test_one_journal_per_file_whatever_path_names_it(tmp_path):
    first = Journal(str(tmp_path / "s.db"))
    os.symlink(tmp_path / "s.db", tmp_path / "alias.db")
    for path in (tmp_path / "s.db", tmp_path / "alias.db"):
        with pytest.raises(JournalLocked, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            Journal(str(path))
    first.close()
    Journal(str(tmp_path / "alias.db")).close()  # the lock goes with its holder


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
