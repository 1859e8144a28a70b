"""cluster/server/service.py: messages -> journal -> core -> messages, with a fake clock."""

from __future__ import annotations

import json

import pytest

from colocate import protocol as P
from colocate.base.endpoints import replace_after_s
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, job_row, one_running_job, replies


@pytest.fixture(params=["message", "batch"])
def h(tmp_path, request):
    """Each test twice: messages one by one, and each through the group commit (``on_batch``)."""
    return Harness(tmp_path / "sched.db", batched=request.param == "batch")


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
    assert dict(reply.queued) == {"default": 1}  # pending jobs per queue
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
    ack, placement_id = one_running_job(h, n)
    # a late message of the node's previous incarnation, on the same connection: nothing happens
    out = h.send(n.ident, P.WorkerExited(node_id="n1", epoch=4, job_id=ack.job_id, placement_id=placement_id,
                                         rank=0, exit_code=1))
    assert out == [] and job_row(h, ack.job_id)["state"] == "running"


# ---------------------------------------------------------------- issue 13: retries, ports, journal and core faults


def test_a_repeated_submit_with_the_same_request_id_makes_one_job(h):
    req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env={}, workers=1, gpus=1, user="alice")
    (first,) = replies(h.send(CLIENT, P.Submit(request=req, request_id="r-1")), P.Submitted)
    (again,) = replies(h.send(CLIENT, P.Submit(request=req, request_id="r-1")), P.Submitted)  # a client's retry
    assert again.job_id == first.job_id and h.journal.jobs(False, 0, 100)[1] == 1
    other_user = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env={}, workers=1, gpus=1, user="bob")
    (bobs,) = replies(h.send(CLIENT, P.Submit(request=other_user, request_id="r-1")), P.Submitted)
    (fresh,) = replies(h.send(CLIENT, P.Submit(request=req, request_id="r-2")), P.Submitted)
    assert len({first.job_id, bobs.job_id, fresh.job_id}) == 3
    h.restart()  # the ids are journaled: a retry after a scheduler restart still finds its job
    (after,) = replies(h.send(CLIENT, P.Submit(request=req, request_id="r-1")), P.Submitted)
    assert after.job_id == first.job_id and h.journal.jobs(False, 0, 100)[1] == 3


def test_a_submit_repeated_inside_one_batch_makes_one_job_and_costs_one_statement(tmp_path):
    h = Harness(tmp_path / "sched.db", batched=True)
    req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env={}, workers=1, gpus=1, user="alice")
    statements: list[str] = []
    h.journal.db.set_trace_callback(statements.append)
    out = h.svc.on_batch([(CLIENT, P.Submit(request=req, request_id="r-1"), None),
                          (b"client-2", P.Submit(request=req, request_id="r-1"), None),
                          (b"client-3", P.Submit(request=req, request_id="r-2"), None)], h.now)
    h.journal.db.set_trace_callback(None)
    ids = [m.job_id for _, m in out if isinstance(m, P.Submitted)]
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
    assert h.journal.jobs(False, 0, 100)[1] == 2
    assert all(job_row(h, i)["state"] == "pending" for i in set(ids))
    # a new submit is one INSERT (no savepoint, no read, no rewrite of the pending row it was inserted with);
    # the repeat is an INSERT the request id's unique index refuses, then the read that names its job
    writes = [s.split()[0] for s in statements if not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))]
    assert writes.count("INSERT") == 3 + 1 and writes.count("SELECT") <= 3, statements  # + the counter's meta row
    assert not any(s.startswith("UPDATE jobs SET state = 'pending'") for s in statements), statements


def test_no_free_rendezvous_port_is_not_an_error_after_the_commit_the_start_waits_for_one(h):
    from cluster.server.ports import PortPool

    h.svc.ports = PortPool(size=1)
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    (a,) = replies(h.submit(gpus=1), P.Submitted)
    (b,) = replies(h.submit(gpus=1), P.Submitted)  # placed on the second GPU: no port left for it
    assert [m.job_id for m in n.inbox(P.StartPlacement)] == [a.job_id]
    assert job_row(h, b.job_id)["state"] == "placing"
    n.start_all()
    h.advance(0.2)
    assert [m.job_id for m in n.inbox(P.StartPlacement)] == [a.job_id]  # still waiting, nothing raised
    n.exit(n.inbox(P.StartPlacement)[0].placement_id, 0)  # job a gives its port back
    h.advance(0.2)
    starts = n.inbox(P.StartPlacement)
    assert [m.job_id for m in starts] == [a.job_id, b.job_id] and starts[1].master_port == starts[0].master_port


def _fill_the_disk(h) -> None:
    """The journal's connection may not grow the file beyond its size now: the next write that needs a new
    page gets SQLite's own ``database or disk is full`` (SQLITE_FULL), as on a full disk."""
    pages = h.journal.db.execute("PRAGMA page_count").fetchone()[0]
    h.journal.db.execute(f"PRAGMA max_page_count = {pages}")


def _free_the_disk(h) -> None:
    h.journal.db.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_disk_refuses_work_keeps_heartbeats_and_resumes_when_it_can_write(h, caplog):
    n = FakeNode(h, "n1", gpus=2)
    a, placement = one_running_job(h, n)
    _fill_the_disk(h)
    big = {"BLOB": "x" * 60000}  # a row that needs new pages
    for _ in range(3):
        (err,) = replies(h.submit(gpus=1, env=big), P.Error)
        assert err.code == P.UNAVAILABLE and "database or disk is full" in err.message and "\n" not in err.message
    assert h.journal.jobs(False, 0, 100)[1] == 1  # nothing acknowledged, nothing written
    (err,) = replies(h.send(CLIENT, P.Cancel(job_id=a.job_id)), P.Error)
    assert err.code == P.UNAVAILABLE and not n.inbox(P.StopPlacement)
    assert h.svc.core.job(a.job_id).state == "running"  # the core did not run ahead of the journal
    for _ in range(5):  # the node is kept: heartbeats answered, past the liveness limit (3 s)
        assert isinstance(replies(n.heartbeat(dt=0.9), ident=n.ident)[0], P.NodeHeartbeat)
        h.advance(0.0)
    n.exit(placement, 0)  # kept until the journal can be written
    assert job_row(h, a.job_id)["state"] == "running"
    (nodes,) = replies(h.send(CLIENT, P.NodesRequest()), P.NodesReply)
    assert [v.up for v in nodes.nodes] == [True]
    errors = [r for r in caplog.records if "cannot write the journal" in r.getMessage()]
    assert len(errors) == 1  # logged once, not per message

    _free_the_disk(h)
    h.advance(1.1)  # the next probe finds it writable: the kept exit is replayed
    assert job_row(h, a.job_id)["state"] == "succeeded" and job_row(h, a.job_id)["exit_code"] == 0
    (b,) = replies(h.submit(gpus=1, env=big), P.Submitted)
    assert n.inbox(P.StartPlacement)[-1].job_id == b.job_id


def test_a_read_only_journal_refuses_a_cancel_and_the_core_stays_with_the_journal(h):
    n = FakeNode(h, "n1")
    n.hello()
    (a,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    h.journal.db.execute("PRAGMA query_only = 1")  # SQLite refuses every write: "attempt to write a readonly database"
    (err,) = replies(h.send(CLIENT, P.Cancel(job_id=a.job_id)), P.Error)
    assert err.code == P.UNAVAILABLE and "readonly" in err.message
    assert h.svc.core.job(a.job_id).state == "running" and not n.inbox(P.StopPlacement)
    (queue,) = replies(h.send(CLIENT, P.JobsRequest()), P.JobsReply)  # reads still answer
    assert [v.state for v in queue.jobs] == ["running"]
    n.status()
    h.journal.db.execute("PRAGMA query_only = 0")
    h.advance(1.1)
    n.status()  # the rebuilt core re-adopts the running worker from the node's report
    assert replies(h.send(CLIENT, P.Cancel(job_id=a.job_id)), P.Ok)
    assert job_row(h, a.job_id)["state"] == "cancelled" and [m.job_id for m in n.inbox(P.StopPlacement)] == [a.job_id]


def test_a_plugin_that_raises_rebuilds_the_core_from_the_journal_and_serving_goes_on(h, monkeypatch, caplog):
    # on_placed runs after the cycle's statement committed the placement (the framework turns a bug in
    # placing into an ERROR status, not this): the core is half-updated when it raises
    plugin = type(next(p for p in h.svc.core.fw.plugins if type(p).__name__ == "BinPack"))
    broken = {"on": False}

    def on_placed(self, job, placement, now):
        if broken["on"] and job.job_id == "2":  # the job submitted while the bug is on
            raise RuntimeError("plugin bug")

    monkeypatch.setattr(plugin, "on_placed", on_placed, raising=False)
    h.restart()  # a core whose binpack plugin raises while broken["on"]
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    (a,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    broken["on"] = True
    (b,) = replies(h.submit(gpus=1), P.Submitted)  # journaled, so acknowledged; its cycle failed
    for _ in range(3):
        h.advance(0.5)  # every tick's cycle fails too
        assert isinstance(replies(n.heartbeat(), ident=n.ident)[0], P.NodeHeartbeat)
    assert [m.job_id for m in n.inbox(P.StartPlacement)] == [a.job_id]
    core = h.svc.core
    assert core.job(b.job_id).state == "pending" and core.job(a.job_id).state == "running"
    assert sorted(core.holders) == [n.inbox(P.StartPlacement)[0].placement_id]  # nothing half-placed
    assert job_row(h, b.job_id)["state"] == "pending"
    assert replies(h.send(CLIENT, P.Cancel(job_id=b.job_id)), P.Ok)  # applied without a cycle
    assert job_row(h, b.job_id)["state"] == "cancelled"
    failures = [r for r in caplog.records if "policy core failed" in r.getMessage()]
    assert len(failures) == 1 and "plugin bug" in failures[0].getMessage()  # once, not per tick

    broken["on"] = False
    (c,) = replies(h.submit(gpus=1), P.Submitted)
    assert [m.job_id for m in n.inbox(P.StartPlacement)] == [a.job_id, c.job_id]  # placed once, serving again


def test_a_node_lost_while_the_journal_is_down_is_lost_on_resuming_not_after_the_restore_grace(h):
    """A node that falls silent during a journal outage is lost to the rebuilt core on resuming, with its
    placements held only until its lease and the stop grace have run out since it was last heard (as for a
    node lost while the journal works), not for the restore grace."""
    a, b = FakeNode(h, "a", gpus=1), FakeNode(h, "b", gpus=1)
    a.hello()
    (job,) = replies(h.submit(gpus=1), P.Submitted)
    a.start_all()
    b.hello()
    heard = h.now
    _fill_the_disk(h)
    assert replies(h.submit(gpus=1, env={"BLOB": "x" * 60000}), P.Error)  # the journal is down
    for _ in range(4):  # a falls silent; b keeps beating past a's liveness limit
        b.heartbeat(dt=0.9)
        h.advance(0.0)
    _free_the_disk(h)
    b.heartbeat(dt=1.1)  # past the next probe
    h.advance(0.0)  # resumed: a is lost to the rebuilt core; its job keeps its placement while a's lease may hold
    assert b.inbox(P.StartPlacement) == []
    while h.now < heard + replace_after_s() - 0.5:
        b.heartbeat(dt=0.5)
        h.advance(0.0)
    assert b.inbox(P.StartPlacement) == []
    b.heartbeat(dt=1.0)
    h.advance(0.0)  # a's lease and grace are over: requeued and placed on b (far sooner than the restore grace)
    assert [m.job_id for m in b.inbox(P.StartPlacement)] == [job.job_id]
    assert json.loads(job_row(h, job.job_id)["placement"])["slots"][0][1] == "b"


def _gang_on_a_and_b_then_c_joins(h):
    """A 2-rank gang of 2 GPUs per rank running on nodes a and b (one rank each), then node c joins."""
    a, b, c = FakeNode(h, "a"), FakeNode(h, "b"), FakeNode(h, "c")
    a.hello()
    b.hello()
    (ack,) = replies(h.submit(workers=2, gpus=2), P.Submitted)
    first = a.inbox(P.StartPlacement)[0]
    assert b.inbox(P.StartPlacement)[0].placement_id == first.placement_id  # one rank per node
    a.start_all()
    b.start_all()
    c.hello()
    return a, b, c, ack, first


@pytest.mark.parametrize("a_returns", [False, True])
def test_a_gang_lost_on_a_restarted_node_waits_for_its_other_silent_node(h, a_returns):
    """Gang ranks on a and b; a falls silent, then b restarts without its worker: the placement is lost, but
    the job is placed again only once a's lease and grace are over since it was last heard, or once a, back,
    says its worker exited (never while it may still run: two copies)."""
    a, b, c, ack, first = _gang_on_a_and_b_then_c_joins(h)  # room for the gang without a
    heard = h.now
    reborn = FakeNode(h, "b", epoch=2)  # b restarts: its old connection falls silent, its workers are gone
    while h.now < heard + 4.5:  # a and b's old connection past liveness (3 x 1 s)
        c.heartbeat(dt=0.5)
        h.advance(0.0)
    reborn.hello()  # with a report listing no worker: b's rank of the placement is lost
    assert job_row(h, ack.job_id)["state"] == "pending"

    def placed_again():
        return [m for n in (a, reborn, c) for m in n.inbox(P.StartPlacement) if m.placement_id != first.placement_id]

    while h.now < heard + (8.0 if a_returns else replace_after_s() - 0.5):
        for n in (reborn, c):
            n.heartbeat(dt=0.25)
        h.advance(0.0)
        assert placed_again() == [], "placed again while a may still run its rank of the old placement"
    if a_returns:
        a.hello()  # back in time, still running its worker of the old placement: it is told to stop it
        assert [m.reason for m in a.inbox(P.StopPlacement)] == ["orphan"]
        h.advance(0.1)
        assert placed_again() == []
        a.exit(first.placement_id, 143)  # stopped
    else:
        for n in (reborn, c):
            n.heartbeat(dt=0.5)
        h.advance(0.0)
    assert job_row(h, ack.job_id)["state"] == "placing" and placed_again()


def test_a_gang_lost_on_a_restarted_node_waits_until_its_other_up_node_stopped_its_rank(h):
    """Gang ranks on a and b; a restarts without its worker: the placement is lost and b, up and heard, is told
    to stop its rank. The job is placed again only once b says that rank exited, however long the stop takes
    (SIGTERM, grace, SIGKILL): never while b's rank may still run beside a new copy."""
    a, b, c, ack, first = _gang_on_a_and_b_then_c_joins(h)  # room for the gang beside the reborn a, without b
    heard = h.now
    reborn = FakeNode(h, "a", epoch=2)  # a restarts: its old connection falls silent, its workers are gone
    while h.now < heard + 3.5:  # a's old connection past liveness (3 x 1 s)
        for n in (b, c):
            n.heartbeat(dt=0.25)
        h.advance(0.0)
    reborn.hello()  # with a report listing no worker: a's rank of the placement is lost
    assert job_row(h, ack.job_id)["state"] == "pending"
    assert [m.placement_id for m in b.inbox(P.StopPlacement)] == [first.placement_id]

    def placed_again():
        return [m for n in (reborn, b, c) for m in n.inbox(P.StartPlacement) if m.placement_id != first.placement_id]

    until = h.now + 30.0  # longer than any stop grace: b, up, still says its rank runs
    while h.now < until:
        for n in (reborn, b, c):
            n.heartbeat(dt=0.25)
        b.status()
        h.advance(0.0)
        assert placed_again() == [], "placed again while b's rank of the old placement still runs"
    b.exit(first.placement_id, 143)  # stopped
    assert job_row(h, ack.job_id)["state"] == "placing" and placed_again()


def test_a_name_journaled_with_control_characters_is_shown_and_started_printable(h):
    """A journal written before the codec refused control characters in names: its jobs are still listed
    and started, their names shown with "?" for each control character."""
    (ack,) = replies(h.submit(gpus=1, name="plain"), P.Submitted)
    row = h.journal.db.execute("SELECT request, spec FROM jobs WHERE job_id = ?", (ack.job_id,)).fetchone()
    request, spec = json.loads(row[0]), json.loads(row[1])
    request["name"] = spec["name"] = "a\nb\x1b[2J"
    h.journal.db.execute("UPDATE jobs SET request = ?, spec = ? WHERE job_id = ?",
                         (json.dumps(request), json.dumps(spec), ack.job_id))
    h.restart()
    (reply,) = replies(h.send(CLIENT, P.JobsRequest()), P.JobsReply)
    assert [j.name for j in reply.jobs] == ["a?b?[2J"]
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    (start,) = n.inbox(P.StartPlacement)
    assert start.job_id == ack.job_id and start.request.name == "a?b?[2J"


def test_a_submit_gets_its_fingerprints_from_the_script_hash_the_command_and_the_keys_user(h):
    from cluster.predict.fingerprint import command_fingerprints

    digest = "cd" * 32
    req = P.JobRequest(command=("python", "train.py", "--bs", "8"), cwd="/tmp", env=(("PATH", "/bin"),),
                       user="mallory", script_hash=digest)
    FakeNode(h, "n1").hello()
    h.send(CLIENT, P.Submit(request=req), peer="user-ann")
    (job,) = h.svc.core.jobs.values()
    assert job.spec.user == "ann"
    exact, family, _ = command_fingerprints("ann", ["python", "train.py", "--bs", "8"], digest)
    assert (job.spec.fingerprint, job.spec.family) == (exact, family)
    h.restart()  # journaled with the spec
    assert h.svc.core.job(job.job_id).spec.fingerprint == exact


def _requeue_after_an_exit(h, n, placement_id, how):
    """End the job's first run so that it is requeued after a worker reported an exit code: a rank exiting before
    its gang started (a failed start) or a rank stopped by its node's lapsed lease (fenced)."""
    (start,) = [m for m in n.inbox(P.StartPlacement) if m.placement_id == placement_id]
    if how == "failed start":  # rank 0 exits 1 while rank 1 has not started yet
        h.send(n.ident, P.WorkerStarted(node_id=n.node_id, epoch=n.epoch, job_id=start.job_id,
                                        placement_id=placement_id, rank=0, pid=1000, log_path="/logs/0.log"))
        h.send(n.ident, P.WorkerExited(node_id=n.node_id, epoch=n.epoch, job_id=start.job_id,
                                       placement_id=placement_id, rank=0, exit_code=1))
    else:
        n.start_all()
        h.send(n.ident, P.WorkerExited(node_id=n.node_id, epoch=n.epoch, job_id=start.job_id,
                                       placement_id=placement_id, rank=0, exit_code=143, fenced=True))
    n.exit(placement_id, 143)  # the rest are stopped because of it
    n.workers.clear()
    n.status()  # none of them runs: the job is queued again


@pytest.mark.parametrize("how", ["failed start", "fenced"])
def test_a_requeued_job_shows_the_exit_code_of_its_last_run_not_an_earlier_ones(h, how):
    """A requeue (here a failed start, or a rank stopped by its node's lapsed lease: each after a worker reported
    its code) forgets the code: a second run that succeeds shows 0, one that fails shows its failing rank's code
    (137), not the 143 of the rank stopped because of it."""
    n = FakeNode(h, "n1")
    n.hello()
    for second_run in ("succeeds", "fails"):
        (ack,) = replies(h.submit(workers=2, gpus=1), P.Submitted)
        first = n.inbox(P.StartPlacement)[-1]
        _requeue_after_an_exit(h, n, first.placement_id, how)
        assert job_row(h, ack.job_id)["exit_code"] is None  # requeued: no run of it has ended since
        again = n.inbox(P.StartPlacement)[-1]
        assert again.job_id == ack.job_id and again.placement_id != first.placement_id
        n.start_all()
        if second_run == "succeeds":
            n.exit(again.placement_id, 0)
        else:
            h.send(n.ident, P.WorkerExited(node_id=n.node_id, epoch=n.epoch, job_id=ack.job_id,
                                           placement_id=again.placement_id, rank=1, exit_code=137))
            n.exit(again.placement_id, 143)
        row = job_row(h, ack.job_id)
        assert (row["state"], row["attempt"], row["exit_code"]) == (
            ("succeeded", 2, 0) if second_run == "succeeds" else ("failed", 2, 137))
        (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)
        assert reply.jobs[0].exit_code == row["exit_code"]
        n.workers.clear()


def test_a_gpu_models_speed_is_the_first_declared_and_another_is_logged_once_per_node(h, caplog):
    def hello(node_id, speed, epoch=1):
        gpus = (P.NodeGpu(index=0, model="V100", mem_total=16 << 30, speed=speed),
                P.NodeGpu(index=1, model="T4", mem_total=16 << 30, speed=0.6))
        h.send(f"ident-{node_id}".encode(), P.NodeHello(node_id=node_id, epoch=epoch, host="127.0.0.1", gpus=gpus))
        assert h.svc.epochs[node_id] == epoch  # welcomed

    caplog.set_level("WARNING", logger="colocate.scheduler")
    hello("a", 1.0)
    hello("b", 0.5)  # says otherwise: kept 1.0, logged
    hello("c", 1.0)
    hello("b", 0.5, epoch=2)  # again (a restart of b): not logged twice
    hello("b", 0.25, epoch=3)
    assert h.svc.speeds == {"V100": 1.0, "T4": 0.6}
    said = [r.getMessage() for r in caplog.records if "declares GPU model" in r.getMessage()]
    assert said == ["node b declares GPU model V100 at speed 0.5; node a declared it at 1 first: kept 1"]


def test_the_submit_log_line_names_the_queue_the_policy_put_the_job_in(tmp_path, caplog):
    import logging

    h = Harness(tmp_path / "state.db", policy="multi-queue")
    try:
        with caplog.at_level(logging.INFO, logger="colocate.scheduler"):
            (ack,) = replies(h.submit(gpus=1), P.Submitted)
        (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)
        (line,) = [r.getMessage() for r in caplog.records if "submitted:" in r.getMessage()]
        assert reply.jobs[0].queue != "default" and line.endswith(f"queue {reply.jobs[0].queue}")
    finally:
        h.journal.close()


@pytest.mark.parametrize("forged", ["exited", "started", "refused"])
def test_a_node_speaks_only_for_its_own_workers(h, forged):
    """Another node's key (a rogue node, or a node with a stale view) cannot end, fail, start or refuse a job
    placed elsewhere: the job ids and placement ids are predictable (JOB.ATTEMPT)."""
    n1, rogue = FakeNode(h, "n1", gpus=1), FakeNode(h, "rogue", gpus=0)
    n1.hello()
    rogue.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    [start] = n1.inbox(P.StartPlacement)
    pid = start.placement_id
    if forged != "started":
        n1.start_all()
    ids = dict(node_id="rogue", epoch=rogue.epoch, job_id=ack.job_id, placement_id=pid)
    msg = {"exited": P.WorkerExited(**ids, rank=0, exit_code=1),
           "started": P.WorkerStarted(**ids, rank=0, pid=4242, log_path="/rogue/log"),
           "refused": P.StartRefused(**ids, code=P.REFUSED, reason="no such GPU")}[forged]
    h.send(rogue.ident, msg)
    row = job_row(h, ack.job_id)
    assert row["state"] == ("placing" if forged == "started" else "running"), row
    assert row["exit_code"] is None and all(node != "rogue" for _, node, _ in h.svc.journal.logs(ack.job_id)), row
    assert n1.inbox(P.StopPlacement) == []
    n1.exit(pid, 0)  # the node that holds it is heard
    assert job_row(h, ack.job_id)["state"] == ("placing" if forged == "started" else "succeeded")


def test_a_promoted_job_is_journaled_guaranteed_and_shown_so_after_a_restart(tmp_path):
    h = Harness(tmp_path / "sched.db", policy="antman")
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    (ack,) = replies(h.submit(gpus=1, priority="opportunistic"), P.Submitted)
    n.start_all()
    n.status()
    for _ in range(40):  # promotion looks every 30 s: a bound, on the test's clock
        h.advance(1.0)
        n.heartbeat()
        if n.inbox(P.PromotePlacement):
            break
    assert n.inbox(P.PromotePlacement), h.sent[-5:]
    assert replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)[0].jobs[0].priority == "guaranteed"
    h.restart()
    n2 = FakeNode(h, "n1", gpus=1, epoch=2)
    n2.workers = n.workers
    n2.hello()
    [view] = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)[0].jobs
    assert view.priority == "guaranteed" and view.state == "running", view
    assert h.svc.core.job(ack.job_id).placement.klass == "guaranteed"


def test_an_ended_jobs_queue_is_the_policys_after_a_restart(tmp_path):
    """multi-queue puts jobs in queues by their size; once ended and the scheduler restarted, the job is no longer
    in the core, and status showed the request's 'default' instead."""
    h = Harness(tmp_path / "sched.db", policy="antman")
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    (ack,) = replies(h.submit(gpus=1, priority="opportunistic"), P.Submitted)
    n.start_all()
    [before] = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)[0].jobs
    n.exit(n.inbox(P.StartPlacement)[0].placement_id, 0)
    h.restart()
    [after] = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)[0].jobs
    assert before.queue == after.queue == "opportunistic" and after.state == "succeeded", (before, after)
