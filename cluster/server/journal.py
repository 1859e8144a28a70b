"""The scheduler's journal: every job and every state change, in one SQLite file (WAL).

One process per state file: ``Journal(path)`` first takes an exclusive ``flock`` on ``PATH.lock``
(beside it; it holds the holder's pid and host) and keeps it until ``close()`` or the process ends;
a second opener gets ``JournalLocked`` naming the holder, before the journal is touched.

Contract (the live server's write-ahead rule): a change is committed here *before* it is
acknowledged to a client or acted on (a message sent to a node). So after a crash (kill -9) the
journal holds every submitted job with its last committed state and placement, and
``records()`` rebuilds the scheduler core (``SchedulerCore.restore``) to the same state: no job is
lost, and a placement is never started twice (its id is journaled with it, and nodes start a
placement id once).

Tables:
  ``meta``    key -> value: ``schema``, ``next_job`` (job numbers), ``epoch`` (scheduler incarnations),
              ``cluster_id`` (minted once with the file)
  ``jobs``    one row per job: the spec and the request (JSON), state, reason, current placement
              (JSON; NULL while pending; a finished job keeps its last), attempt, failed starts, times
              (scheduler wall clock), exit code, and the client's request id (unique per submitter;
              NULL when the client gave none)
  ``logs``    each worker of a job's latest placement: its node, log file, and when it started
  ``stopping``  placements being stopped (preempted, failed, lost elsewhere), until their workers
              are gone: after a restart they are stopped again instead of forgotten

One writer (the scheduler process); ``sqlite3`` in WAL mode with ``synchronous=FULL``. A write
that SQLite refuses (disk full, read-only file, I/O error: ``sqlite3.OperationalError``) raises
``JournalUnavailable`` from ``transaction()``, with the transaction rolled back: nothing of it is
in the file. ``writable()`` probes whether a transaction that grows the file would commit now.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
from contextlib import contextmanager
from dataclasses import asdict

from cluster.events import TERMINAL, JobRecord
from cluster.spec import JobSpec, Placement, WorkerSlot
from colocate.vocab import JobState

SCHEMA = 2  # 2: jobs.submitter and jobs.request_id (idempotent submits)
PROBE_BYTES = 64 << 10  # what writable() writes (and takes back) to see whether the file can grow

_DDL = """
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
    request_id TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS logs (
    job_id TEXT NOT NULL, rank INTEGER NOT NULL, placement_id TEXT NOT NULL, node_id TEXT NOT NULL,
    path TEXT NOT NULL, started_at REAL, PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS stopping (
    placement_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, nodes TEXT NOT NULL, reason TEXT NOT NULL
);
"""
_REQUEST_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS jobs_request ON jobs(submitter, request_id)"


class JournalError(Exception):
    """The state file cannot be used (not a journal, a newer schema, unwritable, locked)."""


class JournalLocked(JournalError):
    """Another process holds the state file's lock."""


class JournalUnavailable(JournalError):
    """A write was refused (disk full, read-only, I/O error); nothing of the transaction was kept."""


def _lock(path: str) -> int:
    """The descriptor of ``PATH.lock``, exclusively locked by this process, holding ``pid host``."""
    lock_path = os.path.realpath(path) + ".lock"  # one lock per file, whatever path names it
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise JournalError(f"cannot open the lock file {lock_path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").split()
        os.close(fd)
        who = f"pid {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
        raise JournalLocked(f"{path} is in use by another scheduler ({who}; lock {lock_path})") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    except OSError:  # an immutable or full lock file still locks; only the holder's name is missing
        pass
    return fd


def spec_to_json(spec: JobSpec) -> str:
    return json.dumps(asdict(spec), sort_keys=True)


def spec_from_json(text: str) -> JobSpec:
    return JobSpec(**json.loads(text))


def placement_to_json(p: Placement | None) -> str | None:
    if p is None:
        return None
    return json.dumps({"placement_id": p.placement_id, "job_id": p.job_id, "priority": p.priority,
                       "slots": [[s.rank, s.node_id, list(s.gpus)] for s in p.slots]}, sort_keys=True)


def placement_from_json(text: str | None) -> Placement | None:
    if not text:
        return None
    d = json.loads(text)
    return Placement(d["placement_id"], d["job_id"],
                     tuple(WorkerSlot(r, n, tuple(g)) for r, n, g in d["slots"]), d["priority"])


class Journal:
    def __init__(self, path: str):
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise JournalError(f"cannot create the state file {path}: folder {folder} does not exist")
        self._lock_fd = _lock(path)
        self.db = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        path = self.path
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_DDL)
            version = self._meta("schema")
            if version is not None and int(version) > SCHEMA:
                raise JournalError(f"{path} was written by a newer colocate (schema {version} > {SCHEMA})")
            with self.transaction():
                self._migrate(version)
        except JournalUnavailable as exc:
            raise JournalError(f"cannot write the state file {path}: {exc}") from None
        except sqlite3.OperationalError as exc:
            raise JournalError(f"cannot use the state file {path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{path} is not a colocate scheduler state file: {exc}") from None

    def _migrate(self, version: str | None) -> None:
        if version is not None and int(version) < 2:
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
            if "submitter" not in cols:
                self.db.execute("ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''")
            if "request_id" not in cols:
                self.db.execute("ALTER TABLE jobs ADD COLUMN request_id TEXT")
        self.db.execute(_REQUEST_INDEX)
        if version != str(SCHEMA):
            self._set_meta("schema", str(SCHEMA))

    # ---- meta ----------------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (key, value))

    def cluster_id(self) -> str:
        """This state file's cluster id: minted (random, 16 hex digits) and committed when first asked for,
        the same ever after. Nodes scope placement ids by it, so a new state file's ids are never an old one's."""
        cid = self._meta("cluster_id")
        if cid is None:
            import secrets

            cid = secrets.token_hex(8)
            self._set_meta("cluster_id", cid)
        return cid

    def next_epoch(self) -> int:
        """This incarnation's number (committed)."""
        epoch = int(self._meta("epoch") or 0) + 1
        self._set_meta("epoch", str(epoch))
        return epoch

    # ---- writes (each a committed transaction) ---------------------------------------------------
    @contextmanager
    def transaction(self):
        """Group writes; committed (durably) on exit, rolled back on an exception. A write SQLite
        refuses (``sqlite3.OperationalError``: disk full, read-only, I/O error) raises
        ``JournalUnavailable`` (the transaction rolled back)."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # SQLite has already rolled back after some errors (disk full)
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise JournalUnavailable(str(exc)) from exc

    def writable(self) -> bool:
        """Whether a transaction that grows the file commits now (it writes ``PROBE_BYTES`` and takes
        them back in the same transaction)."""
        try:
            with self.transaction():
                self.db.execute("INSERT INTO meta(key, value) VALUES('probe', zeroblob(?))", (PROBE_BYTES,))
                self.db.execute("DELETE FROM meta WHERE key = 'probe'")
        except JournalUnavailable:
            return False
        return True

    def new_job_id(self) -> str:
        """The next job id (``1``, ``2``, ...), reserved inside the caller's transaction."""
        n = int(self._meta("next_job") or 1)
        self._set_meta("next_job", str(n + 1))
        return str(n)

    def insert_job(self, spec: JobSpec, request_json: str, now: float, request_id: str = "") -> None:
        """A new pending job; ``request_id`` (non-empty) must be new for ``spec.user``."""
        seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        self.db.execute("INSERT INTO jobs(job_id, seq, spec, request, state, submitted_at, submitter, request_id) "
                        "VALUES(?, ?, ?, ?, ?, ?, ?, ?)", (spec.job_id, seq, spec_to_json(spec), request_json,
                                                        JobState.PENDING, now, spec.user, request_id or None))

    def set_state(self, job_id: str, state: str, reason: str, now: float) -> None:
        sets = ["state = ?", "reason = ?"]
        args: list = [state, reason]
        if state == JobState.RUNNING:
            sets.append("started_at = COALESCE(started_at, ?)")
            args.append(now)
        if state in TERMINAL:  # the last placement stays: where it ran (restore ignores it)
            sets.append("ended_at = ?")
            args.append(now)
        if state == JobState.PENDING:
            sets.append("placement = NULL")
        self.db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE job_id = ?", (*args, job_id))

    def set_placement(self, job_id: str, placement: Placement, attempt: int, failed_starts: int) -> None:
        self.db.execute("UPDATE jobs SET placement = ?, attempt = ?, failed_starts = ? WHERE job_id = ?",
                        (placement_to_json(placement), attempt, failed_starts, job_id))
        self.db.execute("DELETE FROM logs WHERE job_id = ?", (job_id,))

    def set_exit_code(self, job_id: str, code: int) -> None:
        self.db.execute("UPDATE jobs SET exit_code = ? WHERE job_id = ?", (code, job_id))

    def add_log(self, job_id: str, rank: int, placement_id: str, node_id: str, path: str, now: float) -> None:
        self.db.execute("INSERT INTO logs(job_id, rank, placement_id, node_id, path, started_at) VALUES(?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT(job_id, rank) DO UPDATE SET placement_id = excluded.placement_id, "
                        "node_id = excluded.node_id, path = excluded.path, started_at = excluded.started_at",
                        (job_id, rank, placement_id, node_id, path, now))

    def add_stopping(self, placement_id: str, job_id: str, nodes: tuple[str, ...], reason: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO stopping(placement_id, job_id, nodes, reason) VALUES(?, ?, ?, ?)",
                        (placement_id, job_id, json.dumps(list(nodes)), reason))

    def drop_stopping(self, placement_id: str) -> None:
        self.db.execute("DELETE FROM stopping WHERE placement_id = ?", (placement_id,))

    # ---- reads -----------------------------------------------------------------------------------
    def records(self) -> list[JobRecord]:
        """Every job, in submission order, as the core's restore takes them."""
        rows = self.db.execute("SELECT spec, state, placement, attempt, failed_starts FROM jobs ORDER BY seq")
        return [JobRecord(spec_from_json(s), st, placement_from_json(p), a, f) for s, st, p, a, f in rows]

    def job(self, job_id: str) -> dict | None:
        cur = self.db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        row = cur.fetchone()
        return dict(zip([c[0] for c in cur.description], row)) if row else None

    def job_of_request(self, user: str, request_id: str) -> str | None:
        """The id of the job ``user`` submitted with ``request_id``, or None."""
        row = self.db.execute("SELECT job_id FROM jobs WHERE submitter = ? AND request_id = ?",
                              (user, request_id)).fetchone()
        return row[0] if row else None

    def jobs(self, active_only: bool, offset: int, limit: int) -> tuple[list[dict], int]:
        where = "WHERE state IN ('pending', 'placing', 'running')" if active_only else ""
        total = self.db.execute(f"SELECT COUNT(*) FROM jobs {where}").fetchone()[0]
        cur = self.db.execute(f"SELECT * FROM jobs {where} ORDER BY seq LIMIT ? OFFSET ?", (limit, offset))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()], total

    def logs(self, job_id: str) -> list[tuple[int, str, str]]:
        return list(self.db.execute("SELECT rank, node_id, path FROM logs WHERE job_id = ? ORDER BY rank", (job_id,)))

    def stopping(self) -> list[tuple[str, str, tuple[str, ...], str]]:
        return [(p, j, tuple(json.loads(n)), r) for p, j, n, r in
                self.db.execute("SELECT placement_id, job_id, nodes, reason FROM stopping")]

    def close(self) -> None:
        """Close the file and give up its lock (idempotent)."""
        if self.db is not None:
            self.db.close()
            self.db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor releases the flock
            self._lock_fd = None
