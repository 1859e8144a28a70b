"""The scheduler's journal: every job and every state change, in one SQLite file (WAL).

One process per state file: ``Journal(path)`` first takes an exclusive ``flock`` on ``PATH.lock``
(beside it; it holds the holder's pid and host) and keeps it until ``close()`` or the process ends;
a second opener gets ``JournalLocked`` naming the holder, before the journal is touched. Each commit
first checks that ``PATH.lock`` is still the file locked (``journal_file.lock_lost``); if it was removed or
replaced, the transaction is rolled back and ``JournalLockLost`` raised: a scheduler never commits (so never
acts) beside a second one, whose first transaction waits for the holder's (SQLite's write lock). The state file
itself is flocked too, by inode (``journal_file.claim_state_file``: a hard link or a removed ``PATH.lock`` does
not let a second scheduler in), before anything is read, and refused untouched if it is another program's
SQLite file; each commit also checks that PATH still names it (removed or replaced: ``JournalLockLost``, since
what would be committed is lost with the file).

Contract (the live server's write-ahead rule): a change is committed here *before* it is
acknowledged to a client or acted on (a message sent to a node). So after a crash (kill -9) the
journal holds every submitted job with its last committed state and placement, and
``records()`` rebuilds the scheduler core (``SchedulerCore.restore``) to the same state: no job is
lost, and a placement is never started twice (its id is journaled with it, and nodes start a
placement id once).

The schema, the lock, the file's mode and the JSON columns are ``cluster.server.journal_file``'s; the reads of
jobs, logs and stops ``cluster.server.journal_reads``'s, and the history table ``cluster.server.history_table``'s.

One writer (the scheduler process); ``sqlite3`` in WAL mode with ``synchronous=FULL``. A write
that SQLite refuses (disk full, read-only file, I/O error: ``sqlite3.OperationalError``) raises
``JournalUnavailable`` from ``transaction()``, with the transaction rolled back: nothing of it is
in the file. ``writable()`` probes whether a transaction that grows the file would commit now.

Group commit: inside ``batch()`` (one ``BEGIN IMMEDIATE`` ... ``COMMIT``, so one fsync), each
``transaction()`` is a savepoint: an exception rolls back that savepoint only, but a write SQLite
refuses rolls back the whole batch (``WriteBatch.failed``) and every later ``transaction()`` of it raises
``JournalUnavailable``. Whoever opened the batch acknowledges nothing of it before it committed.

Costs (a test counts SQLite's steps): every statement the server runs per request visits a bounded
number of rows whatever the table's size. Job numbers and ``seq`` come from the ``next_job`` counter
(``seq`` is the job's number: dense, 1..N, since jobs are never deleted and a rolled-back
transaction takes its numbers back); ``jobs()`` pages by ``seq`` (keyset), never by ``OFFSET`` over
finished jobs; ``stopping()`` is cached between changes.

Secrets at rest: the file, its ``-wal``/``-shm`` and its lock are mode 0600 (created so, and set so
at every open). A job's environment (in its request) is cleared in the transaction that ends the
job (succeeded, failed, cancelled): a requeued job still has it, a finished one no longer does.

A corrupt file (not SQLite, malformed pages, a meta value that is no integer, a row that does not
decode) raises ``JournalError`` with one line naming the file; never another exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from cluster.server.history_table import HistoryTable
from cluster.server.journal_file import (
    DDL,
    INDEXES,
    MODE,
    PROBE_BYTES,
    SCHEMA,
    JournalError,
    JournalLocked,
    JournalLockLost,
    JournalUnavailable,
    claim_state_file,
    lock_file,
    lock_lost,
    make_private,
    placement_to_json,
    spec_to_json,
    state_file_lost,
)
from cluster.server.journal_reads import JobReads
from cluster.spec import JobSpec, Placement
from colocate.base.vocab import TERMINAL, JobState

__all__ = ["SCHEMA", "Journal", "JournalError", "JournalLockLost", "JournalLocked", "JournalUnavailable", "WriteBatch"]


class WriteBatch:
    """One group commit (``Journal.batch()``): ``failed`` is the ``JournalUnavailable`` that rolled it back."""

    def __init__(self) -> None:
        self.failed: JournalUnavailable | None = None
        self.depth = 0


class Journal(JobReads, HistoryTable):
    def __init__(self, path: str):
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise JournalError(f"cannot create the state file {path}: folder {folder} does not exist")
        fd, self._lock_path = lock_file(path)
        self._lock_fd: int | None = fd
        self._file_fd: int | None = None  # the state file itself, flocked by inode (claim_state_file)
        self.minted_cluster = False  # cluster_id() made this file's id (a new cluster)
        self._db: sqlite3.Connection | None = None
        self._batch: WriteBatch | None = None
        # the stopping table, cached until it changes
        self._stopping: list[tuple[str, str, tuple[str, ...], str]] | None = None
        self._reserved: int | None = None  # the job number new_job_id() reserved last
        self._next_job: int | None = None  # the counter, cached; written to meta once per commit when _counted
        self._counted = False
        self._fresh: set[str] = set()  # jobs inserted in the open transaction whose rows are as inserted
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        path = self.path
        try:
            try:  # created private: SQLite gives -wal and -shm the database file's mode
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, MODE))
            except FileExistsError:
                pass
            except OSError as exc:
                raise JournalError(f"cannot create the state file {path}: {exc.strerror}") from None
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._file_fd = claim_state_file(self.db, path)  # before anything is written or its mode changed
            make_private(path)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(DDL)
            make_private(path)
            bad = self.db.execute("PRAGMA quick_check(1)").fetchone()[0]  # every page, once per start (~3 s at 1M jobs)
            if bad != "ok":
                why = " ".join(str(bad).replace("*** in database main ***", "").split())[:120]
                raise JournalError(f"{path} is corrupt (SQLite's check: {why}); restore it from a backup")
            version = self._int_meta("schema")
            if version is not None and version > SCHEMA:
                raise JournalError(f"{path} was written by a newer colocate (schema {version} > {SCHEMA})")
            for key in ("next_job", "epoch"):
                self._int_meta(key)
            with self.transaction():
                self._migrate(version)
        except JournalUnavailable as exc:
            raise JournalError(f"cannot write the state file {path}: {exc}") from None
        except sqlite3.OperationalError as exc:
            raise JournalError(f"cannot use the state file {path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{path} is not a colocate scheduler state file, or it is corrupt: {exc}") from None

    @property
    def db(self) -> sqlite3.Connection:
        """The open SQLite connection (``JournalError`` once ``close()`` was called)."""
        if self._db is None:
            raise JournalError(f"the journal {self.path} is closed")
        return self._db

    @db.setter
    def db(self, conn: sqlite3.Connection) -> None:  # tests wrap the connection to make writes fail
        self._db = conn

    def _migrate(self, version: int | None) -> None:
        if version is not None and version < SCHEMA:
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
            if "submitter" not in cols:
                self.db.execute("ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''")
            if "request_id" not in cols:
                self.db.execute("ALTER TABLE jobs ADD COLUMN request_id TEXT")
            if "advice" not in cols:
                self.db.execute("ALTER TABLE jobs ADD COLUMN advice TEXT")
        for ddl in INDEXES:
            self.db.execute(ddl)
        if version != SCHEMA:
            if version is not None:  # job numbers and seq were kept in step; the counter covers both
                top = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0]
                self._set_meta("next_job", str(max(top + 1, self._int_meta("next_job") or 1)))
            self._set_meta("schema", str(SCHEMA))

    # ---- meta ----------------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _int_meta(self, key: str) -> int | None:
        value = self._meta(key)
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise JournalError(f"{self.path} is corrupt: meta value {key} is {str(value)[:40]!r}, not an integer") \
                from None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (key, value))

    def _corrupt(self, what: str, exc: Exception) -> JournalError:
        """The one-line error for a part of the file that does not decode."""
        return JournalError(f"{self.path} is corrupt: {what} does not decode ({type(exc).__name__}: {str(exc)[:120]})")

    def cluster_id(self) -> str:
        """This state file's cluster id: minted (random, 16 hex digits) and committed when first asked for,
        the same ever after. Nodes scope placement ids by it, so a new state file's ids are never an old one's."""
        cid = self._meta("cluster_id")
        if cid is None:
            import secrets

            cid = secrets.token_hex(8)
            self._set_meta("cluster_id", cid)
            self.minted_cluster = True
        return cid

    def next_epoch(self) -> int:
        """This incarnation's number (committed)."""
        epoch = (self._int_meta("epoch") or 0) + 1
        self._set_meta("epoch", str(epoch))
        return epoch

    # ---- writes (each a committed transaction) ---------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[Journal]:
        """Group writes; committed (durably) on exit, rolled back on an exception. A write SQLite
        refuses (``sqlite3.OperationalError``: disk full, read-only, I/O error) raises
        ``JournalUnavailable`` (the transaction rolled back). Inside ``batch()``: a savepoint (see the
        module's docstring)."""
        if self._batch is not None:
            with self._savepoint(self._batch):
                yield self
            return
        try:
            self.db.execute("BEGIN IMMEDIATE")
            self._fresh.clear()
            try:
                yield self
                self._flush_counter()
                self._commit()
            except BaseException:
                self._stopping = None
                self._forget_counter()
                if self.db.in_transaction:  # SQLite has already rolled back after some errors (disk full)
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise JournalUnavailable(str(exc)) from exc

    @contextmanager
    def _savepoint(self, b: WriteBatch) -> Iterator[Journal]:
        if b.failed is not None:
            raise JournalUnavailable(f"this batch was rolled back ({b.failed})")
        b.depth += 1
        name = f"s{b.depth}"
        counter = (self._next_job, self._counted)
        try:
            self.db.execute(f"SAVEPOINT {name}")
            try:
                yield self
                self.db.execute(f"RELEASE {name}")
            except sqlite3.OperationalError:
                raise
            except BaseException:
                self._stopping = None
                self._next_job, self._counted = counter
                if self.db.in_transaction:
                    self.db.execute(f"ROLLBACK TO {name}")
                    self.db.execute(f"RELEASE {name}")
                raise
        except sqlite3.OperationalError as exc:
            raise self._fail_batch(b, exc) from exc
        finally:
            b.depth -= 1

    def _fail_batch(self, b: WriteBatch, exc: Exception) -> JournalUnavailable:
        """Roll back batch ``b`` (a write of it was refused); its ``failed``, set by the first refusal."""
        self._stopping = None
        self._forget_counter()
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        if b.failed is None:
            b.failed = JournalUnavailable(str(exc) or "write refused")
        return b.failed

    @contextmanager
    def batch(self) -> Iterator[WriteBatch]:
        """One transaction (one fsync) for everything written inside it; yields a ``WriteBatch``. On leaving it
        commits; if SQLite refused a write or the commit, the whole batch is rolled back and
        ``WriteBatch.failed`` says why (the block is not interrupted by that; an exception from the block
        itself rolls back and propagates). Not nested."""
        if self._batch is not None:
            raise RuntimeError("journal batches do not nest")
        b = self._batch = WriteBatch()
        try:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                b.failed = JournalUnavailable(str(exc))
            self._fresh.clear()
            try:
                yield b
            except BaseException:
                self._stopping = None
                self._forget_counter()
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
            if b.failed is None:
                try:
                    self._flush_counter()
                    self._commit()
                except sqlite3.OperationalError as exc:
                    self._fail_batch(b, exc)
                except JournalLockLost as exc:
                    self._fail_batch(b, exc)
                    raise
        finally:
            self._batch = None

    def _commit(self) -> None:
        """COMMIT the open transaction if ``PATH.lock`` still guards the file (``check_lock``; on
        ``JournalLockLost`` the transaction is left open for the caller to roll back)."""
        self.check_lock()
        self.db.execute("COMMIT")

    def check_lock(self) -> None:
        """``JournalLockLost`` if ``PATH.lock`` was removed or replaced since this journal locked it (module
        docstring): the server checks at every commit and every tick. One ``stat``."""
        if self._lock_fd is not None:
            why = lock_lost(self._lock_path, self._lock_fd)
            if why is not None:
                raise JournalLockLost(f"{self.path}: {why}; another scheduler may be using the file now")
        why = state_file_lost(self.path, self._file_fd) if self._file_fd is not None else None
        if why is not None:  # what it commits now would be lost with the file, and a restart would start empty
            raise JournalLockLost(f"{self.path}: {why} while the scheduler ran; nothing more is committed: put "
                                  "the file back (or restore it from a backup) and start the scheduler again")

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

    def _counter(self) -> int:
        if self._next_job is None:
            self._next_job = self._int_meta("next_job") or 1
        return self._next_job

    def peek_job_id(self) -> str:
        """The id ``new_job_id()`` would give now (reserves nothing)."""
        return str(self._counter())

    def new_job_id(self) -> str:
        """The next job id (``1``, ``2``, ...), reserved inside the caller's transaction (the counter is kept in
        memory and written to ``meta`` once, just before the commit; a rollback takes its numbers back)."""
        n = self._counter()
        self._next_job, self._counted, self._reserved = n + 1, True, n
        return str(n)

    def _flush_counter(self) -> None:
        if self._counted:
            self._set_meta("next_job", str(self._next_job))
            self._counted = False

    def _forget_counter(self) -> None:
        self._next_job, self._counted = None, False

    def insert_job(self, spec: JobSpec, request_json: str, now: float, request_id: str = "",
                   advice: str | None = None) -> None:
        """A new pending job; ``request_id`` (non-empty) must be new for ``spec.user``. Its ``seq`` is the number
        ``new_job_id()`` has just reserved for it in this transaction, else the counter's next one."""
        seq, self._reserved = self._reserved, None
        if seq is None or spec.job_id != str(seq):
            seq = int(self.new_job_id())
            self._reserved = None
        self.db.execute("INSERT INTO jobs(job_id, seq, spec, request, state, submitted_at, submitter, request_id, "
                        "advice) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (spec.job_id, seq, spec_to_json(spec), request_json, JobState.PENDING, now, spec.user,
                         request_id or None, advice))
        self._fresh.add(spec.job_id)

    def submit_job(self, spec: JobSpec, request_json: str, now: float, request_id: str = "",
                   advice: str | None = None) -> str | None:
        """Journal a submitted job (``insert_job``) under the next job id, committed with the caller's batch, or
        in a transaction of its own outside one; the job's id (``spec.job_id`` is replaced by it), or None when
        ``spec.user`` has a job of ``request_id`` already (nothing written: ``job_of_request`` names it). One
        statement, so no savepoint: a refused INSERT changes nothing, and the counter's number is given back.
        ``JournalUnavailable`` as for any write."""
        if self._batch is None:
            try:
                with self.transaction():
                    job_id = self.new_job_id()
                    self.insert_job(dataclasses.replace(spec, job_id=job_id) if spec.job_id != job_id else spec,
                                    request_json, now, request_id, advice)
                    return job_id
            except sqlite3.IntegrityError:
                if request_id and self.job_of_request(spec.user, request_id) is not None:
                    return None
                raise
        b = self._batch
        if b.failed is not None:
            raise JournalUnavailable(f"this batch was rolled back ({b.failed})")
        counter = (self._next_job, self._counted)
        job_id = self.new_job_id()
        try:
            self.insert_job(dataclasses.replace(spec, job_id=job_id) if spec.job_id != job_id else spec,
                            request_json, now, request_id, advice)
        except sqlite3.IntegrityError:
            self._next_job, self._counted = counter
            self._reserved = None
            if request_id and self.job_of_request(spec.user, request_id) is not None:
                return None
            raise
        except sqlite3.OperationalError as exc:
            raise self._fail_batch(b, exc) from exc
        return job_id

    def set_spec(self, spec: JobSpec) -> None:
        """A job's spec changed (restarted at a larger memory cap)."""
        self.db.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", (spec_to_json(spec), spec.job_id))

    def set_state(self, job_id: str, state: str, reason: str, now: float) -> None:
        """A job's new state; one that ends it (``TERMINAL``) also clears its environment. Back to pending (a requeue:
        an out-of-memory restart, a preemption, a lost node or worker, a failed start) clears its placement and its
        exit code: the code a job shows is its latest run's (``SchedulerService._apply``), never an earlier run's.
        Pending with no reason for a job inserted in this transaction and not changed since writes nothing: its row
        says so already."""
        if job_id in self._fresh:
            if state == JobState.PENDING and not reason:
                return
            self._fresh.discard(job_id)
        sets = ["state = ?", "reason = ?"]
        args: list = [state, reason]
        if state == JobState.RUNNING:
            sets.append("started_at = COALESCE(started_at, ?)")
            args.append(now)
        if state in TERMINAL:  # the last placement stays: where it ran (restore ignores it)
            sets.append("ended_at = ?")
            args.append(now)
            sets.append("request = json_set(request, '$.env', json('{}'))")  # secrets kept only while needed
        if state == JobState.PENDING:
            sets.append("placement = NULL, exit_code = NULL")
        self.db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE job_id = ?", (*args, job_id))

    def set_placement(self, job_id: str, placement: Placement, attempt: int, failed_starts: int) -> None:
        self.db.execute("UPDATE jobs SET placement = ?, attempt = ?, failed_starts = ? WHERE job_id = ?",
                        (placement_to_json(placement), attempt, failed_starts, job_id))
        self.db.execute("DELETE FROM logs WHERE job_id = ?", (job_id,))

    def promote_placement(self, job_id: str, placement: Placement) -> None:
        """A running job's placement now holds its GPUs as guaranteed (a promotion): its class is journaled, so a
        restart restores it guaranteed (not preemptible) and views show it so."""
        self.db.execute("UPDATE jobs SET placement = ? WHERE job_id = ?", (placement_to_json(placement), job_id))

    def set_exit_code(self, job_id: str, code: int) -> None:
        self.db.execute("UPDATE jobs SET exit_code = ? WHERE job_id = ?", (code, job_id))

    def add_log(self, job_id: str, rank: int, placement_id: str, node_id: str, path: str, now: float) -> None:
        self.db.execute("INSERT INTO logs(job_id, rank, placement_id, node_id, path, started_at) VALUES(?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT(job_id, rank) DO UPDATE SET placement_id = excluded.placement_id, "
                        "node_id = excluded.node_id, path = excluded.path, started_at = excluded.started_at",
                        (job_id, rank, placement_id, node_id, path, now))

    def add_stopping(self, placement_id: str, job_id: str, nodes: tuple[str, ...], reason: str) -> None:
        self._stopping = None
        self.db.execute("INSERT OR REPLACE INTO stopping(placement_id, job_id, nodes, reason) VALUES(?, ?, ?, ?)",
                        (placement_id, job_id, json.dumps(list(nodes)), reason))

    def drop_stopping(self, placement_id: str) -> None:
        self._stopping = None
        self.db.execute("DELETE FROM stopping WHERE placement_id = ?", (placement_id,))

    def close(self) -> None:
        """Close the file and give up its lock (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor releases the flock
            self._lock_fd = None
