"""The journal's ``history`` table: one ``HistoryRecord`` (``cluster.predict.history``) per job that ran and
ended, and one per run that ended in an out-of-memory restart (written in the transaction that journals that end).

Columns: ``seq`` (the order of ends), the record's keys (job id, exact and family fingerprints, user, GPUs, GPU
type, exit state, end time) and the record itself (JSON, features included). Indexes: by job id, and by exact
fingerprint, family fingerprint and user, each with ``seq``, so that every read here is an index range bounded by
its ``limit`` (``tests/cluster/server/test_journal_costs.py`` counts the rows SQLite visits): the most recent
records of one key (``history_of``), one job's records (``history_of_job``), the most recent records of all
(``history_tail``: what a scheduler restart rebuilds its predictions from).

``HistoryTable`` is a part of ``Journal`` (a base class): it uses the journal's connection and transactions. A row
that does not decode raises ``JournalError`` naming the job (never another exception)."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from cluster.predict.history import HistoryRecord

DDL = """
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL, exact TEXT NOT NULL, family TEXT NOT NULL, user TEXT NOT NULL,
    gpus INTEGER NOT NULL, gpu_type TEXT NOT NULL, exit TEXT NOT NULL, end_s REAL NOT NULL,
    record TEXT NOT NULL
);
"""
INDEXES = ("CREATE INDEX IF NOT EXISTS history_job ON history(job_id, seq)",
           "CREATE INDEX IF NOT EXISTS history_exact ON history(exact, seq)",
           "CREATE INDEX IF NOT EXISTS history_family ON history(family, seq)",
           "CREATE INDEX IF NOT EXISTS history_user ON history(user, seq)")
KEYS = ("exact", "family", "user")  # the columns ``history_of`` looks records up by
OOM_RESTARTS = "oom_restarts"  # meta: runs restarted at a larger cap after running out of memory under a recommended one


class HistoryTable:
    if TYPE_CHECKING:  # the journal's, which this part uses
        path: str

        @property
        def db(self) -> sqlite3.Connection: ...
        def _int_meta(self, key: str) -> int | None: ...
        def _set_meta(self, key: str, value: str) -> None: ...
        def _corrupt(self, what: str, exc: Exception) -> Exception: ...

    def add_history(self, rec: HistoryRecord, oom_restart: bool = False) -> None:
        """Keep ``rec`` (inside the caller's transaction); ``oom_restart``: its run ended in an out-of-memory restart,
        counted (``oom_restarts``)."""
        self.db.execute("INSERT INTO history(job_id, exact, family, user, gpus, gpu_type, exit, end_s, record) "
                        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (rec.job_id, rec.exact, rec.family, rec.user, rec.gpus, rec.gpu_type, str(rec.exit), rec.end_s,
                         json.dumps(rec.to_dict(), sort_keys=True)))
        if oom_restart:
            self._set_meta(OOM_RESTARTS, str(self.oom_restarts() + 1))

    def oom_restarts(self) -> int:
        """Runs restarted after running out of memory under a recommended cap, ever."""
        return self._int_meta(OOM_RESTARTS) or 0

    def history_of(self, key: str, value: str, limit: int) -> list[HistoryRecord]:
        """The ``limit`` most recent records whose ``key`` (one of ``KEYS``) is ``value``, oldest first."""
        if key not in KEYS:
            raise ValueError(f"history is looked up by {', '.join(KEYS)}, not {key!r}")
        return self._decode(self.db.execute(f"SELECT job_id, record FROM history WHERE {key} = ? "
                                            "ORDER BY seq DESC LIMIT ?", (value, limit)))

    def history_of_job(self, job_id: str, limit: int = 16) -> list[HistoryRecord]:
        """Job ``job_id``'s records (its runs: an out-of-memory restart, then its end), oldest first."""
        return self._decode(self.db.execute("SELECT job_id, record FROM history WHERE job_id = ? "
                                            "ORDER BY seq DESC LIMIT ?", (job_id, limit)))

    def history_tail(self, limit: int) -> list[HistoryRecord]:
        """The ``limit`` most recent records of all, oldest first."""
        return self._decode(self.db.execute("SELECT job_id, record FROM history ORDER BY seq DESC LIMIT ?", (limit,)))

    def _decode(self, rows) -> list[HistoryRecord]:
        out = []
        job_id = None
        try:
            for row in rows:
                job_id = row[0]  # named in the error
                out.append(HistoryRecord.from_dict(json.loads(row[1])))
        except sqlite3.DatabaseError as exc:
            raise self._corrupt("its history table", exc) from None
        except ValueError as exc:  # JSON, or a record that does not validate
            raise self._corrupt(f"the history record of job {str(job_id)[:40]!r}", exc) from None
        out.reverse()
        return out


__all__ = ["DDL", "INDEXES", "KEYS", "OOM_RESTARTS", "HistoryTable"]
