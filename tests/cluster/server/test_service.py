"""cluster/server/service.py: messages -> journal -> core -> messages, with a fake clock."""

from __future__ import annotations

import json

import pytest

from colocate import protocol as P
from colocate.endpoints import replace_after_s
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, job_row, replies


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path / "sched.db")


def test_hello_is_welcomed_with_the_liveness_rules(h):
    n = FakeNode(h, "n1")
    out = n.hello()
    (welcome,) = [m for i, m in out if i == n.ident]
    assert isinstance(welcome, P.NodeWelcome) and welcome.node_id == "n1"
    assert (welcome.heartbeat_s, welcome.liveness, welcome.scheduler_epoch) == (1.0, 3, h.svc.epoch)


def test_a_job_runs_through_its_life_and_every_state_is_journaled(h):
    n = FakeNode(h, "n1")
    n.hello()
    out = h.submit(workers=2, gpus=1)
    (ack,) = replies(out, P.Submitted)
    jid = ack.job_id
    (start,) = n.inbox(P.StartPlacement)
    assert start.job_id == jid and start.world_size == 2 and [w.rank for w in start.workers] == [0, 1]
    assert sorted(g for w in start.workers for g in w.gpus) == [0, 1] and start.master_addr == "127.0.0.1"
    assert dict(start.request.env) == {"PATH": "/usr/bin"} and start.request.command == ("python", "train.py")
    assert job_row(h, jid)["state"] == "placing" and job_row(h, jid)["placement"] is not None
    n.start_all()
    assert job_row(h, jid)["state"] == "running" and job_row(h, jid)["started_at"] == h.now
    assert [r for r, _, _ in h.journal.logs(jid)] == [0, 1]
    n.exit(start.placement_id, 0)
    row = job_row(h, jid)
    assert (row["state"], row["exit_code"]) == ("succeeded", 0)
    assert json.loads(row["placement"])["placement_id"] == start.placement_id  # where it ran stays visible


@pytest.mark.parametrize("kw, fragment", [
    (dict(gpus=3), "a worker needs 3 GPUs on one node; the largest node has 2"),
    (dict(workers=5, gpus=1), "the gang needs 5 GPUs; the cluster has 4"),
    (dict(gpu_mem=100 << 40), "a worker needs 100 TiB GPU memory per GPU; the largest node has 16 GiB"),
    (dict(queue="nope"), "unknown queue"),
])
def test_a_request_that_can_never_run_is_refused_and_leaves_no_row(h, kw, fragment):
    for name in ("n1", "n2"):
        FakeNode(h, name).hello()
    if kw.get("queue"):  # only multi_queue knows queue names; the others refuse any
        h.policy = "multi-queue"
        h.restart()
        for name in ("n1", "n2"):
            FakeNode(h, name, epoch=2).hello()
    out = h.submit(**kw)
    (err,) = replies(out, P.Error)
    assert err.code == P.INVALID and fragment in err.message
    assert h.journal.jobs(False, 0, 100) == ([], 0)


def test_node_messages_need_a_hello_from_that_connection(h):
    n = FakeNode(h, "n1")
    out = n.heartbeat()
    assert [m.code for m in replies(out, P.Error, n.ident)] == [P.UNKNOWN_NODE]
    n.hello()
    assert isinstance(replies(n.heartbeat(), ident=n.ident)[0], P.NodeHeartbeat)
    intruder = b"someone-else"
    out = h.send(intruder, P.NodeHeartbeat(node_id="n1", epoch=1))
    assert [m.code for m in replies(out, P.Error, intruder)] == [P.UNKNOWN_NODE]
    other = FakeNode(h, "n2")
    other.hello()
    out = h.send(other.ident, P.NodeStatus(node_id="n1", epoch=1, gpus=(), workers=()))
    assert [m.code for m in replies(out, P.Error, other.ident)] == [P.FORBIDDEN]


def test_a_silent_node_is_down_after_three_heartbeats_and_its_gang_runs_elsewhere_after_its_lease(h):
    """Down (no new work) after 3 missed heartbeats; its gang is placed again only once the node's lease and
    the stop grace have run out since it was last heard (``replace_after_s``): its workers are fenced by then."""
    a, b = FakeNode(h, "a"), FakeNode(h, "b")
    a.hello()
    b.hello()
    (ack,) = replies(h.submit(workers=2, gpus=1), P.Submitted)
    first = (a.inbox(P.StartPlacement) or b.inbox(P.StartPlacement))[0]
    holder, other = (a, b) if a.inbox(P.StartPlacement) else (b, a)
    holder.start_all()
    heard = h.now
    for _ in range(5):  # the other node keeps talking; the holder falls silent
        other.heartbeat(dt=0.5)
        h.advance(0.0)
    assert job_row(h, ack.job_id)["state"] == "running"
    other.heartbeat(dt=0.6)
    h.advance(0.0)  # 3.1 s of silence: down, but the job keeps its placement while the lease may hold
    assert job_row(h, ack.job_id)["state"] == "running"
    assert not next(n for n in h.svc.core.nodes() if n["node_id"] == holder.node_id)["up"]
    assert other.inbox(P.StartPlacement) == []
    while h.now < heard + replace_after_s() - 0.5:
        other.heartbeat(dt=0.5)
        h.advance(0.0)
    assert job_row(h, ack.job_id)["state"] == "running"
    other.heartbeat(dt=0.5)
    h.advance(0.0)
    assert job_row(h, ack.job_id)["state"] in ("pending", "placing")
    again = other.inbox(P.StartPlacement)
    assert again and again[-1].placement_id != first.placement_id  # a new placement, on the live node
    other.start_all()
    assert job_row(h, ack.job_id)["state"] == "running"


def test_restart_on_the_same_journal_keeps_every_job_and_starts_nothing_twice(h):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    ids = [replies(h.submit(gpus=1), P.Submitted)[0].job_id for _ in range(3)]  # two run, one waits
    n.start_all()
    running = [j for j in ids if job_row(h, j)["state"] == "running"]
    assert len(running) == 2 and job_row(h, ids[2])["state"] == "pending"
    starts_before = len(n.inbox(P.StartPlacement))

    h.restart()  # kill -9 and start again on the same state file
    assert {j: job_row(h, j)["state"] for j in ids} == {ids[0]: "running", ids[1]: "running", ids[2]: "pending"}
    out = n.heartbeat()
    assert [m.code for m in replies(out, P.Error, n.ident)] == [P.UNKNOWN_NODE]  # it says hello again
    n.hello()
    n.status()  # it still runs both: re-adopted
    assert {j: job_row(h, j)["state"] for j in running} == {j: "running" for j in running}
    assert len(n.inbox(P.StartPlacement)) == starts_before  # nothing started twice
    placement = json.loads(job_row(h, running[0])["placement"])
    n.exit(placement["placement_id"], 0)
    assert job_row(h, running[0])["state"] == "succeeded"
    n.start_all()
    assert job_row(h, ids[2])["state"] == "running"  # the freed GPU went to the waiting job


def test_workers_missing_from_a_restarted_nodes_report_are_requeued(h):
    n = FakeNode(h, "n1")
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    reborn = FakeNode(h, "n1", epoch=2)  # the node restarted: new epoch, its workers are gone
    assert [e.code for e in replies(reborn.hello(), P.Error, reborn.ident)] == [P.FORBIDDEN]  # the old one is live
    h.now += 3.5  # the old connection is silent past liveness (3 x 1 s): the id is free
    reborn.hello()
    reborn.status()
    assert job_row(h, ack.job_id)["state"] in ("pending", "placing")
    assert reborn.inbox(P.StartPlacement)  # started again on the new incarnation


def test_cancel_stops_the_workers_and_a_second_cancel_is_refused(h):
    n = FakeNode(h, "n1")
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    out = h.send(CLIENT, P.Cancel(job_id=ack.job_id))
    assert replies(out, P.Ok) and [m.job_id for m in n.inbox(P.StopPlacement)] == [ack.job_id]
    assert job_row(h, ack.job_id)["state"] == "cancelled"
    assert [m.code for m in replies(h.send(CLIENT, P.Cancel(job_id=ack.job_id)), P.Error)] == [P.INVALID]
    assert [m.code for m in replies(h.send(CLIENT, P.Cancel(job_id="404")), P.Error)] == [P.NOT_FOUND]


def test_a_stop_in_progress_survives_a_restart(h):
    n = FakeNode(h, "n1")
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    h.send(CLIENT, P.Cancel(job_id=ack.job_id))
    (stop,) = n.inbox(P.StopPlacement)
    assert [p for p, *_ in h.journal.stopping()] == [stop.placement_id]
    h.restart()  # before the workers exited
    n.hello(status=False)
    assert [m.placement_id for m in n.inbox(P.StopPlacement)] == [stop.placement_id] * 2  # stopped again
    n.exit(stop.placement_id, 143)
    n.status()
    assert h.journal.stopping() == []


def test_a_job_no_node_can_hold_after_a_node_shrank_is_set_aside_and_says_why(h):
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    (a,) = replies(h.submit(gpus=2), P.Submitted)
    (b,) = replies(h.submit(gpus=2), P.Submitted)
    n.ngpus, n.epoch = 1, 2
    n.hello()  # the only 2-GPU node came back (same connection, new epoch) with 1 GPU
    (reply,) = replies(h.send(CLIENT, P.JobsRequest()), P.JobsReply)
    views = {v.job_id: v for v in reply.jobs}
    for job_id in (a.job_id, b.job_id):
        assert views[job_id].state == "pending"
        assert views[job_id].reason.startswith("set aside: a worker needs 2 GPUs on one node; the largest node has 1")
    (c,) = replies(h.submit(gpus=1), P.Submitted)  # the free GPU is used: nothing blocks the queue
    assert job_row(h, c.job_id)["state"] == "placing"


def test_views_jobs_nodes_and_logs(h):
    n = FakeNode(h, "n1")
    n.hello()
    (a,) = replies(h.submit(gpus=2, name="big"), P.Submitted)
    (b,) = replies(h.submit(gpus=1, name="small"), P.Submitted)
    n.start_all()
    (reply,) = replies(h.send(CLIENT, P.JobsRequest()), P.JobsReply)
    views = {v.job_id: v for v in reply.jobs}
    assert reply.total == 2 and views[a.job_id].state == "running" and views[a.job_id].nodes == ("n1",)
    assert views[b.job_id].state == "pending" and "blocked" in views[b.job_id].reason
    (nodes,) = replies(h.send(CLIENT, P.NodesRequest()), P.NodesReply)
    (nv,) = nodes.nodes
    assert (nv.node_id, nv.up, nv.gpus, nv.gpus_allocated, nv.workers) == ("n1", True, 2, 2, 1)
    (ask,) = [m for m in replies(h.send(CLIENT, P.LogsRequest(job_id=a.job_id)), ident=n.ident)
              if isinstance(m, P.LogTailRequest)]
    assert (ask.job_id, ask.rank) == (a.job_id, 0)
    tail = P.LogTail(node_id="n1", epoch=1, request_id=ask.request_id, text="hi\n")
    (logs,) = replies(h.send(n.ident, tail), P.LogsReply)
    assert [(r.rank, r.node_id, r.text, r.error) for r in logs.logs] == [(0, "n1", "hi\n", "")]
    assert [m.code for m in replies(h.send(CLIENT, P.JobsRequest(job_id="404")), P.Error)] == [P.NOT_FOUND]


def test_messages_only_the_scheduler_sends_are_forbidden(h):
    out = h.send(CLIENT, P.Ok(message="hi"))
    assert [m.code for m in replies(out, P.Error)] == [P.FORBIDDEN]


def test_a_message_of_an_older_node_epoch_is_dropped(h):
    n = FakeNode(h, "n1", epoch=5)
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    placement_id = n.inbox(P.StartPlacement)[0].placement_id
    # a late message of the node's previous incarnation, on the same connection: nothing happens
    out = h.send(n.ident, P.WorkerExited(node_id="n1", epoch=4, job_id=ack.job_id, placement_id=placement_id,
                                         rank=0, exit_code=1))
    assert out == [] and job_row(h, ack.job_id)["state"] == "running"
