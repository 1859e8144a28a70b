"""cluster/server/service.py: PlacementsSettled tells a node which of its ended placements the scheduler has
taken (the job is no longer on them), so that the node forgets them at once instead of reporting them for
minutes. Replies follow the batch's commit, so a node never forgets what the journal does not hold."""

from __future__ import annotations

import pytest

from colocate import protocol as P
from tests.cluster.server.helpers import FakeNode, Harness, job_row, one_running_job, replies


@pytest.fixture(params=["message", "batch"])
def h(tmp_path, request):
    """Each test twice: messages one by one, and each through the group commit (``on_batch``)."""
    return Harness(tmp_path / "sched.db", batched=request.param == "batch")


def settled(out, n: FakeNode) -> list[str]:
    return [pid for m in replies(out, P.PlacementsSettled, ident=n.ident) for pid in m.placement_ids]


def test_the_exit_that_ends_a_job_settles_its_placement(h):
    n = FakeNode(h, "n1")
    ack, placement_id = one_running_job(h, n)
    out = n.exit(placement_id, 0)
    assert job_row(h, ack.job_id)["state"] == "succeeded"
    assert settled(out, n) == [placement_id]


def test_a_gang_settles_when_its_last_rank_ends_not_before(h):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    (ack,) = replies(h.submit(workers=2, gpus=1), P.Submitted)
    n.start_all()
    (start,) = n.inbox(P.StartPlacement)
    first = h.send(n.ident, P.WorkerExited(node_id="n1", epoch=n.epoch, job_id=ack.job_id,
                                           placement_id=start.placement_id, rank=0, exit_code=0))
    assert settled(first, n) == [] and job_row(h, ack.job_id)["state"] == "running"
    rank1 = n.workers[(start.placement_id, 1)]
    status = P.NodeStatus(node_id="n1", epoch=n.epoch, gpus=(), workers=(
        P.WorkerStatus(job_id=ack.job_id, placement_id=start.placement_id, rank=0, pid=1000, running=False,
                       exit_code=0), rank1))
    assert settled(h.send(n.ident, status), n) == []  # rank 1 still runs: the job is on that placement
    last = h.send(n.ident, P.WorkerExited(node_id="n1", epoch=n.epoch, job_id=ack.job_id,
                                          placement_id=start.placement_id, rank=1, exit_code=0))
    assert settled(last, n) == [start.placement_id] and job_row(h, ack.job_id)["state"] == "succeeded"


def test_a_status_after_a_scheduler_restart_settles_ended_placements_the_journal_has(h):
    n = FakeNode(h, "n1")
    ack, placement_id = one_running_job(h, n)
    n.exit(placement_id, 1)  # the job fails; the node has not heard back (say the reply was lost)
    assert job_row(h, ack.job_id)["state"] == "failed"
    h.restart()
    n.hello(status=False)
    status = P.NodeStatus(node_id="n1", epoch=n.epoch, gpus=(), workers=(
        P.WorkerStatus(job_id=ack.job_id, placement_id=placement_id, rank=0, pid=1000, running=False, exit_code=1),))
    assert settled(h.send(n.ident, status), n) == [placement_id]
