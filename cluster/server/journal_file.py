"""The journal's file, apart from the reads and writes (``cluster.server.journal``): its schema (tables, indexes,
version), the lock that keeps one process per file, the mode that keeps it private, the errors the journal
raises, and the JSON of the spec and placement columns (also read by the server's views).

Tables:
  ``meta``    key -> value: ``schema``, ``next_job`` (job numbers), ``epoch`` (scheduler incarnations),
              ``cluster_id`` (minted once with the file)
  ``jobs``    one row per job: the spec and the request (JSON), state, reason, current placement
              (JSON; NULL while pending; a finished job keeps its last), attempt, failed starts, times
              (scheduler wall clock), exit code, the client's request id (unique per submitter;
              NULL when the client gave none), and what the job left to its recommendation got
              (``advice``, JSON; NULL when it left nothing)
  ``logs``    each worker of a job's latest placement: its node, log file, and when it started
  ``stopping``  placements being stopped (preempted, failed, lost elsewhere), until their workers
              are gone: after a restart they are stopped again instead of forgotten
  ``history`` one record per job that ran and ended (what the cluster learned from it), written in the
              transaction that journals the end (``cluster.server.history_table``)

``lock_file(path)`` takes an exclusive ``flock`` on ``PATH.lock`` (beside the file, holding the holder's pid and
host) and returns its descriptor and path; a second taker gets ``JournalLocked`` naming the holder. The lock guards
the file only while ``PATH.lock`` is still the file it locked: one deleted by hand (taken for a stale lock) or
replaced lets a second scheduler lock a new one. ``lock_lost(lock_path, fd)`` (one ``stat``) says so, and the
journal checks it before every commit (``JournalLockLost``: the holder commits nothing more and stops). ``make_private(path)``
sets mode 0600 (``MODE``) on the file and its ``-wal`` and ``-shm``: they hold jobs' commands and environments.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from dataclasses import fields

from cluster.server import history_table
from cluster.spec import JobSpec, Placement, WorkerSlot
from colocate.base.vocab import JobClass, JobState

SCHEMA = 4  # 2: jobs.submitter and jobs.request_id (idempotent submits); 3: jobs_seq, jobs_active indexes;
# 4: the history table, jobs.advice
MODE = 0o600  # the file, its -wal and -shm, and its lock: they hold jobs' commands and environments
PROBE_BYTES = 64 << 10  # what writable() writes (and takes back) to see whether the file can grow

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    placement TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    failed_starts INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    submitter TEXT NOT NULL DEFAULT '',
    request_id TEXT,
    advice TEXT
);
CREATE TABLE IF NOT EXISTS logs (
    job_id TEXT NOT NULL, rank INTEGER NOT NULL, placement_id TEXT NOT NULL, node_id TEXT NOT NULL,
    path TEXT NOT NULL, started_at REAL, PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS stopping (
    placement_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, nodes TEXT NOT NULL, reason TEXT NOT NULL
);
"""
DDL = _TABLES + history_table.DDL  # every table, created where missing
INDEXES = ("CREATE UNIQUE INDEX IF NOT EXISTS jobs_request ON jobs(submitter, request_id)",
           "CREATE UNIQUE INDEX IF NOT EXISTS jobs_seq ON jobs(seq)",
           "CREATE INDEX IF NOT EXISTS jobs_active ON jobs(state, seq)",
           "DROP INDEX IF EXISTS jobs_state",  # schema <= 2's; jobs_active serves its queries
           *history_table.INDEXES)
ACTIVE = (JobState.PENDING, JobState.PLACING, JobState.RUNNING)


class JournalError(Exception):
    """The state file cannot be used (not a journal, a newer schema, unwritable, locked)."""


class JournalLocked(JournalError):
    """Another process holds the state file's lock."""


class JournalLockLost(JournalError):
    """This process's lock file was removed or replaced: another scheduler may hold the state file now, so this one
    must commit nothing more (the transaction was rolled back) and stop."""


class JournalUnavailable(JournalError):
    """A write was refused (disk full, read-only, I/O error); nothing of the transaction was kept."""


def lock_file(path: str) -> tuple[int, str]:
    """The descriptor and path of ``PATH.lock``, exclusively locked by this process, holding ``pid host`` (taken
    again if the file was removed or replaced between its open and its lock)."""
    lock_path = os.path.realpath(path) + ".lock"  # one lock per file, whatever path names it
    for _ in range(5):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, MODE)
        except OSError as exc:
            raise JournalError(f"cannot open the lock file {lock_path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            os.close(fd)
            who = f"pid {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
            raise JournalLocked(f"{path} is in use by another scheduler ({who}; lock {lock_path})") from None
        if lock_lost(lock_path, fd) is None:
            break
        os.close(fd)
    else:
        raise JournalError(f"cannot lock {path}: its lock file {lock_path} keeps being removed or replaced")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    except OSError:  # an immutable or full lock file still locks; only the holder's name is missing
        pass
    return fd, lock_path


def file_lost(path: str, fd: int, name: str) -> str | None:
    """Why ``path`` no longer names the file open as ``fd`` (removed, or now another file), in words naming it as
    ``name``; None while it does. One ``stat``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{name} was removed"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    own = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
        return f"{name} was replaced by another file"
    return None


def lock_lost(lock_path: str, fd: int) -> str | None:
    """Why the lock held on ``fd`` (``lock_file``) no longer guards its state file: ``lock_path`` removed, or now
    another file than the one locked; None while it still guards it."""
    return file_lost(lock_path, fd, f"its lock file {lock_path}")


def claim_state_file(db, path: str) -> int:
    """Lock ``path`` (open as ``db``, nothing read or written yet) by its inode and check that it is a colocate state
    file or empty; the locked descriptor. ``JournalLocked`` when a scheduler holds the same file under another name
    (a hard link) or after its ``PATH.lock`` was removed (that lock is per name); ``JournalError`` for another
    program's SQLite file (it would have been given our tables and mode 0600)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise JournalLocked(f"{path} is in use by another scheduler (the file itself is locked: under another name, "
                            "or its lock file was removed)") from None
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except BaseException:
        os.close(fd)
        raise
    if tables and "meta" not in tables:
        os.close(fd)
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise JournalError(f"{path} is not a colocate scheduler state file (an SQLite file with the tables {shown}); "
                           "give --state a new path")
    return fd


def state_file_lost(path: str, fd: int) -> str | None:
    """Why ``path`` no longer names the state file open as ``fd`` (removed, or replaced), else None."""
    return file_lost(path, fd, "the state file")


_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))
_SPEC_KEYS = {"klass": "priority"}  # a field's key in the journal where the two differ (the wire's name)
_SPEC_FIELD_OF = {key: name for name, key in _SPEC_KEYS.items()}


def spec_to_json(spec: JobSpec) -> str:
    """``spec`` as JSON (every field a scalar: no ``asdict`` deep copy)."""
    return json.dumps({_SPEC_KEYS.get(k, k): getattr(spec, k) for k in _SPEC_FIELDS}, sort_keys=True)


def spec_from_json(text: str) -> JobSpec:
    return spec_from_dict(json.loads(text))


def spec_from_dict(d: dict) -> JobSpec:
    """A spec from its journaled JSON, already parsed."""
    return JobSpec(**{_SPEC_FIELD_OF.get(k, k): v for k, v in d.items()})


def placement_to_json(p: Placement | None) -> str | None:
    if p is None:
        return None
    return json.dumps({"placement_id": p.placement_id, "job_id": p.job_id, "priority": p.klass,
                       "slots": [[s.rank, s.node_id, list(s.gpus)] for s in p.slots]}, sort_keys=True)


def placement_from_json(text: str | None) -> Placement | None:
    if not text:
        return None
    d = json.loads(text)
    return Placement(d["placement_id"], d["job_id"],
                     tuple(WorkerSlot(r, n, tuple(g)) for r, n, g in d["slots"]), JobClass(d["priority"]))


def make_private(path: str) -> None:
    """Mode 0600 on ``path`` and on its -wal and -shm where they exist."""
    for f in (path, path + "-wal", path + "-shm"):
        try:
            os.chmod(f, MODE)
        except OSError:  # absent; or immutable, refused at the first write
            pass
