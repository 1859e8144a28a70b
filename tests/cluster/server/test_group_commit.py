"""cluster/server/batch.py: the messages waiting on the socket handled as one journal transaction, and nothing of
a batch acknowledged or acted on unless its commit succeeded."""

from __future__ import annotations

import sqlite3

import pytest

from colocate import protocol as P
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, one_running_job, replies


class FailingCommits:
    """The journal's connection, with every COMMIT refused while ``fail`` (an I/O error at the fsync)."""

    def __init__(self, db):
        self._db, self.fail, self.commits = db, False, 0

    def execute(self, sql, *args):
        if sql == "COMMIT":
            if self.fail:
                raise sqlite3.OperationalError("disk I/O error")
            self.commits += 1
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.fixture
def h(tmp_path):
    h = Harness(tmp_path / "sched.db")
    h.journal.db = FailingCommits(h.journal.db)
    return h


def submits(n: int, tag: str = "r"):
    req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env={"PATH": "/usr/bin"}, workers=1, gpus=1)
    return [(CLIENT, P.decode(P.encode(P.Submit(request=req, request_id=f"{tag}{i}"))), None) for i in range(n)]


def batch(h: Harness, items, dt: float = 0.0) -> list:
    h.now += dt
    out = h.svc.on_batch(items, h.now)
    h.sent += out
    return out


def test_a_batch_of_submits_is_one_commit_and_every_one_is_acknowledged(h):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    before = h.journal.db.commits
    out = batch(h, submits(40))
    assert h.journal.db.commits == before + 1  # one transaction: one fsync
    acks = replies(out, P.Submitted)
    assert len(acks) == 40 and len({a.job_id for a in acks}) == 40
    assert h.journal.jobs(False, 0, 100)[1] == 40 and all(h.svc.core.job(a.job_id) for a in acks)
    assert len(n.inbox(P.StartPlacement)) == 2  # one cycle at the batch's end placed what fits


def test_a_batch_whose_commit_fails_acknowledges_nothing_and_a_retry_makes_each_job_once(h, caplog):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    h.journal.db.fail = True
    with caplog.at_level("INFO", logger="colocate.scheduler"):
        out = batch(h, submits(30))
    assert " submitted: " not in caplog.text  # the log never says a job was submitted that was rolled back
    errors = replies(out, P.Error)
    assert len(errors) == 30 and all(e.code == P.UNAVAILABLE and "nothing was submitted" in e.message for e in errors)
    assert not replies(out, P.Submitted) and not n.inbox(P.StartPlacement)  # nothing acted on
    assert h.journal.jobs(False, 0, 100)[1] == 0 and not h.svc.core.jobs  # the core did not run ahead
    h.journal.db.fail = False
    h.advance(1.1)  # the probe finds the journal writable
    with caplog.at_level("INFO", logger="colocate.scheduler"):
        first = replies(batch(h, submits(30)), P.Submitted)  # the clients retry with their request ids
    assert caplog.text.count(" submitted: ") == 30
    again = replies(batch(h, submits(30)), P.Submitted)
    assert len(first) == 30 and [a.job_id for a in first] == [a.job_id for a in again]
    assert h.journal.jobs(False, 0, 100)[1] == 30


def test_a_batch_whose_lock_file_was_removed_raises_and_commits_nothing(h, tmp_path):
    from cluster.server.journal import JournalLockLost

    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    sent, commits = len(h.sent), h.journal.db.commits
    (tmp_path / "sched.db.lock").unlink()  # taken for a stale lock
    with pytest.raises(JournalLockLost, match="was removed"):
        h.svc.on_batch(submits(5), h.now)  # the server stops on it, sending nothing of the batch
    assert h.journal.db.commits == commits and len(h.sent) == sent
    with pytest.raises(JournalLockLost):
        h.svc.tick(h.now + 0.1)  # and on the tick, whatever comes first
    h.journal.close()
    again = Harness(tmp_path / "sched.db").journal
    assert again.jobs(False, 0, 100)[1] == 0
    again.close()


def test_node_messages_of_a_rolled_back_batch_are_kept_and_replayed(h):
    n = FakeNode(h, "n1", gpus=2)
    a, placement = one_running_job(h, n)
    h.journal.db.fail = True
    exited = P.WorkerExited(node_id="n1", epoch=n.epoch, job_id=a.job_id, placement_id=placement, rank=0,
                            exit_code=0)
    out = batch(h, [(n.ident, exited, None), *submits(1, "late")])
    assert replies(out, P.Error)[0].code == P.UNAVAILABLE
    assert h.journal.job(a.job_id)["state"] == "running"
    h.journal.db.fail = False
    h.advance(1.1)
    assert h.journal.job(a.job_id)["state"] == "succeeded"  # the exit was replayed once the journal took writes


def test_a_restart_restores_only_active_jobs_and_still_knows_the_finished_ones(h):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    (a,) = replies(h.submit(gpus=1), P.Submitted)
    (b,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    n.exit(n.inbox(P.StartPlacement)[0].placement_id, 0)
    assert h.journal.job(a.job_id)["state"] == "succeeded"
    h.restart()
    assert [r.spec.job_id for r in h.journal.records()] == [b.job_id]  # the history is not read back
    assert h.svc.core.job(a.job_id) is None and h.svc.core.job(b.job_id) is not None
    (err,) = replies(h.send(CLIENT, P.Cancel(job_id=a.job_id)), P.Error)
    assert err.code == P.INVALID and "already succeeded" in err.message
    (view,) = replies(h.send(CLIENT, P.JobsRequest(job_id=a.job_id)), P.JobsReply)
    assert view.jobs[0].state == "succeeded" and view.total == 1
