"""The journal's reads of its jobs, logs and stops (``Journal`` in ``cluster.server.journal`` is the file; this
part, a base class of it, only reads through its connection): the active jobs' records a restart restores, one
job, a page of jobs, a job's worker logs, and the placements being stopped (cached until a write changes them).
Every query is an index look-up or range (``tests/cluster/server/test_journal_costs.py`` counts the rows SQLite
visits). A row that does not decode, or a file SQLite finds corrupt, raises ``JournalError`` in one line."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from cluster.events import JobRecord
from cluster.server.journal_file import ACTIVE, JournalError, placement_from_json, spec_from_json
from colocate.base.vocab import JobState


class JobReads:
    if TYPE_CHECKING:  # the journal's, which this part uses
        path: str
        _stopping: list[tuple[str, str, tuple[str, ...], str]] | None

        @property
        def db(self) -> sqlite3.Connection: ...

    def records(self) -> list[JobRecord]:
        """Every job that has not ended (pending, placing, running), in submission order, as the core's restore
        takes them: a restart reads the active jobs (an index range), not the whole history. ``JournalError``
        (one line) for a row that does not decode or a file SQLite finds corrupt."""
        out = []
        job_id = None
        try:
            marks = ", ".join("?" * len(ACTIVE))
            rows = self.db.execute("SELECT job_id, spec, state, placement, attempt, failed_starts FROM jobs "
                                   f"WHERE state IN ({marks}) ORDER BY seq", ACTIVE)
            for row in rows:
                job_id, s, st, p, a, f = row
                out.append(JobRecord(spec_from_json(s), JobState(st), placement_from_json(p), int(a), int(f)))
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path} is corrupt: {exc}") from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise JournalError(f"{self.path} is corrupt: job {str(job_id)[:40]!r} does not decode "
                               f"({type(exc).__name__}: {str(exc)[:120]})") from None
        return out

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
        """A page of jobs in submission order, after the first ``offset``, and how many match.

        All jobs: ``seq`` is dense (1..N), so the page is the keyset ``seq > offset`` and the total is the
        largest ``seq``: both index look-ups. Active jobs (pending, placing, running): an index range that
        never visits a finished job."""
        if active_only:
            marks = ", ".join("?" * len(ACTIVE))
            total = self.db.execute(f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", ACTIVE).fetchone()[0]
            cur = self.db.execute(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY seq LIMIT ? OFFSET ?",
                                  (*ACTIVE, limit, offset))
        else:
            total = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0]
            cur = self.db.execute("SELECT * FROM jobs WHERE seq > ? ORDER BY seq LIMIT ?", (offset, limit))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()], total

    def logs(self, job_id: str) -> list[tuple[int, str, str]]:
        return list(self.db.execute("SELECT rank, node_id, path FROM logs WHERE job_id = ? ORDER BY rank", (job_id,)))

    def stopping(self) -> list[tuple[str, str, tuple[str, ...], str]]:
        """Placements being stopped (cached: read again only after a change or a rollback)."""
        if self._stopping is None:
            self._stopping = [(p, j, tuple(json.loads(n)), r) for p, j, n, r in
                              self.db.execute("SELECT placement_id, job_id, nodes, reason FROM stopping")]
        return list(self._stopping)
