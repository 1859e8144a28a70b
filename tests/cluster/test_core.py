"""The job state machine: starts, exits, start failures, cancel, node loss and restart, orphans,
restore from journal records."""

from __future__ import annotations

import random

import pytest

from cluster import events as ev
from cluster.core import SchedulerCore, refusal_backoff_s
from cluster.events import CANCELLED, FAILED, PENDING, PLACING, RUNNING, SUCCEEDED
from cluster.spec import NodeSpec
from tests.cluster.helpers import (
    changes,
    config,
    confirm_stops,
    finish,
    job,
    make_core,
    report,
    run,
    start_all,
    starts,
    stops,
    submit,
)


def test_happy_path_and_decision_order():
    core = make_core("gang-binpack", [("n0", 4), ("n1", 4)])
    out = submit(core, job("g", workers=2, gpus=4))
    assert [type(d).__name__ for d in out] == ["JobChanged", "JobChanged", "StartWorkers"]
    assert changes(out) == [PENDING, PLACING]
    p = starts(out)["g"]
    assert p.placement_id == "g.1" and out[1].placement_id == "g.1"
    assert core.handle(ev.RankStarted("g", "g.1", 0), 1.0) == []
    assert changes(core.handle(ev.RankStarted("g", "g.1", 1), 1.0)) == [RUNNING]
    assert core.handle(ev.RankExited("g", "g.1", 0, 0), 2.0) == []
    assert changes(core.handle(ev.RankExited("g", "g.1", 1, 0), 2.0)) == [SUCCEEDED]
    assert core.state.allocs == {} and core.state.free_gpus() == 8
    # late and duplicate events change nothing
    assert core.handle(ev.RankExited("g", "g.1", 1, 0), 3.0) == []
    assert core.handle(ev.RankStarted("g", "g.1", 0), 3.0) == []
    assert core.job("g").state == SUCCEEDED


def test_nothing_changed_runs_no_cycle():
    core = make_core("gang-binpack", [("n0", 1)])
    out = submit(core, job("a"), job("b", t=1))
    cycles = core.counters()["cycles"]
    start_all(core, out)  # a start frees nothing
    report(core, "n0", [0.5])  # utilization only matters to opportunistic placement
    assert core.counters()["cycles"] == cycles
    finish(core, "a", now=5.0)
    assert core.counters()["cycles"] == cycles + 1 and core.job("b").state == PLACING


@pytest.mark.parametrize("how", ["early_exit", "refused", "timeout"])
def test_gang_start_failure_requeues_then_fails(how):
    cfg = config(["fifo", "gang", "binpack"], scheduler={"max_start_failures": 2, "start_timeout_s": 60.0})
    core = make_core(cfg, [("n0", 1), ("n1", 1)])
    out = submit(core, job("g", workers=2))
    for attempt in (1, 2):
        pid = f"g.{attempt}"
        core.handle(ev.RankStarted("g", pid, 0), 1.0)
        t = 100.0 * attempt
        if how == "early_exit":
            out = core.handle(ev.RankExited("g", pid, 1, 1), t)
        elif how == "refused":
            node = core.job("g").placement.slots[1].node_id
            out = core.handle(ev.PlacementRefused("g", pid, node, "no such GPU"), t)
        else:
            out = core.handle(ev.Tick(), core.job("g").placed_at + 60.0)
        want = PENDING if attempt == 1 else FAILED
        assert changes(out, "g")[0] == want
        st = stops(out)
        assert len(st) == 1 and st[0].reason == "start failed" and st[0].placement_id == pid
        rank0_node = [s.node_id for s in core.stopping[pid].placement.slots if s.rank == 0][0]
        assert rank0_node in st[0].nodes  # rank 0 started: it must be stopped
        assert out.index(st[0]) > 0  # the JobChanged comes first
        out = confirm_stops(core, out, now=t + (0.25 if how == "refused" else 1))
        if attempt == 1 and how == "refused":  # a refused start is queued again after a backoff
            assert "g" not in starts(out)  # the stops were confirmed, but it waits for the Tick after its backoff
            out = core.handle(ev.Tick(), t + refusal_backoff_s(1))
        if attempt == 1:
            assert starts(out)["g"].placement_id == "g.2"  # requeued and placed again, new id
    assert core.job("g").state == FAILED and "start failed 2 times" in core.job("g").reason
    assert core.state.allocs == {}
    core.state.check_invariants()


def test_running_gang_member_failure_fails_the_job():
    core = make_core("gang-binpack", [("n0", 1), ("n1", 1)])
    run(core, job("g", workers=2))
    out = core.handle(ev.RankExited("g", "g.1", 0, 137), 5.0)
    assert changes(out, "g") == [FAILED] and "rank 0 exited with code 137" in core.job("g").reason
    [st] = stops(out)
    assert st.reason == "gang member failed"
    held_node = core.stopping["g.1"].placement.slots[1].node_id
    assert st.nodes == (held_node,)  # only where a worker still runs
    confirm_stops(core, out, 6.0)
    assert core.state.allocs == {} and core.job("g").state == FAILED


@pytest.mark.parametrize("state", [PENDING, PLACING, RUNNING])
def test_cancel(state):
    core = make_core("gang-binpack", [("n0", 1)])
    if state == PENDING:
        run(core, job("other"))
        submit(core, job("j", t=1))
    elif state == PLACING:
        submit(core, job("j"))
    else:
        run(core, job("j"))
    assert core.job("j").state == state
    out = core.handle(ev.JobCancelled("j"), 5.0)
    assert changes(out, "j") == [CANCELLED]
    assert [d.reason for d in stops(out)] == ([] if state == PENDING else ["cancelled"])
    assert core.handle(ev.JobCancelled("j"), 6.0) == []
    assert core.queues() == {}


def test_node_lost_requeues_the_whole_gang():
    core = make_core("gang-binpack", [("n0", 2), ("n1", 2), ("n2", 4)])
    run(core, job("big", gpus=4))  # takes n2
    placed = run(core, job("g", workers=2, gpus=2, t=1), now=1.0)
    nodes = sorted({s.node_id for s in placed["g"].slots})
    assert nodes == ["n0", "n1"]
    out = core.handle(ev.NodeLost("n1", "missed heartbeats"), 5.0)
    assert changes(out, "g") == [PENDING] and "node n1 lost" in core.job("g").reason
    [st] = stops(out)
    assert st.nodes == ("n0",) and st.reason == "node lost"
    assert not core.state.nodes["n1"].up and core.state.free_gpus() == 0  # n0 still held until confirmed
    out = confirm_stops(core, out, 6.0)
    assert core.job("g").state == PENDING  # 2 workers x 2 GPUs no longer fit (n0 only)
    out = core.handle(ev.NodeJoined(NodeSpec("n1", 2), 2), 7.0)
    assert starts(out)["g"].placement_id == "g.2"
    core.state.check_invariants()


@pytest.mark.parametrize("listed, requeued", [(True, False), (False, True)])
def test_node_restart_reconciles_on_its_next_report(listed, requeued):
    core = make_core("gang-binpack", [("n0", 1)])
    run(core, job("j"))
    core.handle(ev.NodeJoined(NodeSpec("n0", 1), 2), 5.0)  # restarted: new epoch
    assert core.job("j").state == RUNNING  # until its report says otherwise
    workers = (ev.WorkerReport("j", "j.1", 0, True),) if listed else ()
    out = report(core, "n0", [0.5], workers=workers, now=6.0)
    assert (core.job("j").state == PENDING or "j" in starts(out)) is requeued
    if requeued:
        assert changes(out, "j")[0] == PENDING and starts(out)["j"].placement_id == "j.2"


def test_new_spec_on_reregistration_is_a_loss():
    core = make_core("gang-binpack", [("n0", 2)])
    run(core, job("j", gpus=2))
    out = core.handle(ev.NodeJoined(NodeSpec("n0", 4), 2), 5.0)
    assert changes(out, "j") == [PENDING, PLACING]
    assert starts(out)["j"].placement_id == "j.2" and stops(out) == []  # nothing left to stop there


def test_stale_events_are_ignored():
    core = make_core("gang-binpack", [("n0", 1)])
    run(core, job("j"))
    core.handle(ev.NodeJoined(NodeSpec("n0", 1), 3), 1.0)
    assert report(core, "n0", [0.1], workers=(), epoch=2) == []  # an old epoch's report
    assert core.job("j").state == RUNNING
    assert core.handle(ev.NodeJoined(NodeSpec("n0", 1), 2), 2.0) == []  # an old registration
    assert core.handle(ev.NodeLost("nope", "x"), 2.0) == []


def test_orphans_are_stopped():
    core = make_core("gang-binpack", [("n0", 2)])
    run(core, job("j"))
    finish(core, "j", 2.0)
    workers = (ev.WorkerReport("j", "j.1", 0, True),  # ended placement, still running
               ev.WorkerReport("x", "x.7", 0, True),  # never heard of
               ev.WorkerReport("y", "y.1", 0, False, 0))  # not running: nothing to stop
    out = report(core, "n0", [0.0, 0.0], workers=workers, now=3.0)
    assert [(d.job_id, d.placement_id, d.nodes, d.reason) for d in out] == [
        ("j", "j.1", ("n0",), "orphan"), ("x", "x.7", ("n0",), "orphan")]


def test_report_confirms_starts_and_exits():
    core = make_core("gang-binpack", [("n0", 1)])
    submit(core, job("j"))
    out = report(core, "n0", [0.9], workers=(ev.WorkerReport("j", "j.1", 0, True),), now=1.0)
    assert changes(out, "j") == [RUNNING]
    out = report(core, "n0", [0.0], workers=(ev.WorkerReport("j", "j.1", 0, False, 0),), now=2.0)
    assert changes(out, "j") == [SUCCEEDED]


def test_stopping_slots_released_when_the_report_no_longer_lists_them():
    core = make_core("gang-binpack", [("n0", 1)])
    run(core, job("j"))
    out = core.handle(ev.JobCancelled("j"), 1.0)
    assert stops(out) and core.state.free_gpus() == 0
    out = submit(core, job("k", t=2), now=2.0)
    assert starts(out) == {}
    out = report(core, "n0", [0.0], workers=(), now=3.0)
    assert "k" in starts(out)


def test_duplicate_submit_and_bad_event():
    core = make_core("gang-binpack", [("n0", 1)])
    submit(core, job("j"))
    assert submit(core, job("j", gpus=2)) == []
    assert core.counters()["duplicates"] == 1
    assert core.validate(job("j")) == "job 'j' already exists"
    with pytest.raises(TypeError, match="not a scheduler event"):
        core.handle(object(), 0.0)


@pytest.mark.parametrize("report_lists, node_joins", [(True, True), (False, True), (True, False)])
def test_restore(report_lists, node_joins):
    core = make_core("gang-binpack", [("n0", 2), ("n1", 2)])
    placed = run(core, job("r", workers=2, gpus=2))
    assert sorted(s.node_id for s in placed["r"].slots) == ["n0", "n1"]
    submit(core, job("p1", gpus=2, t=1), job("p2", gpus=1, t=2), now=1.0)
    records = core.records()
    assert [r.state for r in records] == [RUNNING, PENDING, PENDING]

    new = SchedulerCore(core.config, random.Random(0))
    assert new.restore(records, 10.0) == []
    assert new.job("r").state == RUNNING and new.job("r").placement == placed["r"]
    assert new.queues() == {"default": ["p1", "p2"]}
    if not node_joins:
        assert new.handle(ev.Tick(), 11.0) == []  # within the grace period
        out = new.handle(ev.Tick(), 10.0 + new.sched["restore_grace_s"])
        assert changes(out, "r") == [PENDING] and stops(out) == []
        assert "did not register" in new.job("r").reason
        return
    out = new.handle_batch([ev.NodeJoined(NodeSpec(n, 2), 5) for n in ("n0", "n1")], 11.0)
    assert out == [] and new.state.free_gpus() == 0  # r's slots are held again
    for s in placed["r"].slots:
        ws = (ev.WorkerReport("r", "r.1", s.rank, True),) if report_lists else ()
        out = report(new, s.node_id, [0.5, 0.5], workers=ws, now=12.0)
        if not report_lists and s.node_id == "n0":
            assert changes(out, "r") == [PENDING] and [d.nodes for d in stops(out)] == [("n1",)]
            # r waits out of its queue until n1 says its rank is gone: the freed n0 goes to p1 meanwhile
            assert "r" not in starts(out) and starts(out)["p1"].slots[0].node_id == "n0"
    if report_lists:
        assert new.job("r").state == RUNNING and new.job("r").attempt == 1
    else:  # n1's report released the stopped slot: r, the oldest, is queued again (and waits for room)
        assert new.job("r").state == PENDING and new.queues() == {"default": ["r", "p2"]}
    new.state.check_invariants()


def test_restore_keeps_attempts_and_needs_a_fresh_core():
    cfg = config(["fifo", "gang", "binpack"], scheduler={"max_start_failures": 5})
    core = make_core(cfg, [("n0", 1)])
    submit(core, job("j"))
    core.handle(ev.PlacementRefused("j", "j.1", "n0", "x"), 1.0)  # requeued, placed again as j.2 after its backoff
    core.handle(ev.Tick(), 1.0 + refusal_backoff_s(1))
    assert core.job("j").placement_id == "j.2"
    new = SchedulerCore(cfg, random.Random(0))
    new.restore(core.records(), 5.0)
    new.handle(ev.NodeJoined(NodeSpec("n0", 1), 2), 6.0)
    out = report(new, "n0", [0.0], workers=(), now=7.0)  # j.2 never started there: lost
    assert starts(out)["j"].placement_id == "j.3"
    assert new.job("j").failed_starts == 1
    with pytest.raises(RuntimeError, match="fresh core"):
        new.restore(core.records(), 8.0)


def test_stale_refusals_never_count_and_every_refused_start_backs_off():
    """A node busy with its own stopping placement refuses with ``stale``: the job keeps all its start failures,
    however often; each retry waits 0.5 s doubling (bounded), never re-sent at once."""
    cfg = config(["fifo", "gang", "binpack"], scheduler={"max_start_failures": 2})
    core = make_core(cfg, [("n0", 1)])
    out = submit(core, job("j"))
    now, waits = 0.0, []
    for attempt in range(1, 8):
        pid = starts(out)["j"].placement_id
        assert pid == f"j.{attempt}"
        out = core.handle(ev.PlacementRefused("j", pid, "n0", "GPU 0 is busy", stale=True), now)
        assert "j" not in starts(out) and core.job("j").state == PENDING
        due = now + refusal_backoff_s(attempt)
        assert "j" not in starts(core.handle(ev.Tick(), due - 0.01))
        out = core.handle(ev.Tick(), due)
        waits.append(due - now)
        now = due
    assert core.job("j").failed_starts == 0 and core.job("j").state == PLACING
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]  # bounded
    core.handle(ev.PlacementRefused("j", core.job("j").placement_id, "n0", "no such GPU"), now)  # a real refusal counts
    assert core.job("j").failed_starts == 1


def test_a_silent_nodes_placement_is_held_then_readopted_when_it_returns():
    core = make_core("gang-binpack", [("n0", 1), ("n1", 1)])
    out = submit(core, job("j"))
    start_all(core, out)
    node = core.job("j").placement.slots[0].node_id
    out = core.handle(ev.NodeLost(node, "silent", hold_s=13.5), 10.0)
    assert changes(out, "j") == [] and core.job("j").state == RUNNING  # held: its lease may still let it run
    assert starts(core.handle(ev.Tick(), 19.0)) == {}
    core.handle(ev.NodeJoined(NodeSpec(node, 1), 1), 20.0)  # back in time (the same epoch: it was stopped)
    out = report(core, node, [0.0], workers=(ev.WorkerReport("j", "j.1", 0, True),), now=20.1)
    assert core.job("j").state == RUNNING and core.job("j").placement_id == "j.1" and starts(out) == {}
    assert starts(core.handle(ev.Tick(), 40.0)) == {}  # the hold is over: nothing lost


@pytest.mark.parametrize("how", ["hold_over", "exited", "not_listed", "running_then_exited", "exit_event",
                                 "silent_again"])
def test_a_gang_lost_on_one_node_waits_for_its_silent_other_node(how):
    """Node A falls silent (held), node B restarts and no longer runs its worker: the job is stopped and
    requeued, but placed again only once A's hold is over or A confirms its worker of the old placement is
    gone; never while it may still run."""
    core = make_core("gang-binpack", [("a", 2), ("b", 2)])
    placed = run(core, job("g", workers=2, gpus=2), now=1.0)
    rank_a = next(s.rank for s in placed["g"].slots if s.node_id == "a")
    core.handle(ev.NodeLost("a", "silent", hold_s=13.5), 10.0)  # a last heard at 10.0 - 2.4
    core.handle(ev.NodeJoined(NodeSpec("c", 2), 1), 10.2)  # room for the gang without a
    core.handle(ev.NodeJoined(NodeSpec("b", 2), 2), 10.5)  # b restarted: a new epoch
    out = report(core, "b", [0.0, 0.0], now=10.6)  # ... and runs nothing
    assert changes(out, "g") == [PENDING] and starts(out) == {}
    assert core.job("g").state == PENDING
    assert starts(core.handle(ev.Tick(), 20.0)) == {}
    old = ev.WorkerReport("g", "g.1", rank_a, False, 143)
    if how == "hold_over":
        out = core.handle(ev.Tick(), 23.5)
    elif how == "silent_again":  # a returns still running it, then falls silent again: a new hold
        core.handle(ev.NodeJoined(NodeSpec("a", 2), 1), 21.0)
        report(core, "a", [0.0, 0.0], workers=(ev.WorkerReport("g", "g.1", rank_a, True),), now=21.1)
        core.handle(ev.NodeLost("a", "silent", hold_s=11.0), 24.0)
        assert starts(core.handle(ev.Tick(), 34.0)) == {}
        out = core.handle(ev.Tick(), 35.0)
    elif how == "exit_event":
        core.handle(ev.NodeJoined(NodeSpec("a", 2), 1), 21.0)  # back: the same epoch
        out = core.handle(ev.RankExited("g", "g.1", rank_a, 143), 21.1)  # before its report: enough
    else:
        core.handle(ev.NodeJoined(NodeSpec("a", 2), 1), 21.0)  # back: the same epoch
        if how == "running_then_exited":
            out = report(core, "a", [0.0, 0.0], workers=(ev.WorkerReport("g", "g.1", rank_a, True),), now=21.1)
            assert starts(out) == {} and [s.reason for s in stops(out)] == ["orphan"]
            assert starts(core.handle(ev.Tick(), 30.0)) == {}  # a is back: its lease no longer fences it
        out = report(core, "a", [0.0, 0.0], workers=() if how == "not_listed" else (old,), now=31.0)
    assert starts(out)["g"].placement_id == "g.2"
    core.state.check_invariants()


@pytest.mark.parametrize("how", ["exit_event", "report", "silent_hold_over", "silent_returns", "cancelled"])
def test_a_requeued_gang_waits_for_its_stopping_rank_on_an_up_node(how):
    """Node a restarts and no longer runs its rank: the gang is requeued and b, up, is told to stop its rank.
    No new placement starts (though a and c have room) until b's rank is gone: its exit reported, its report
    no longer listing it, or b falls silent and its hold ends (or it returns saying so); a job cancelled while
    it waits stays cancelled."""
    core = make_core("gang-binpack", [("a", 1), ("b", 1), ("c", 1)])
    placed = run(core, job("g", workers=2), now=1.0)
    rank_b = next(s.rank for s in placed["g"].slots if s.node_id == "b")
    assert sorted(s.node_id for s in placed["g"].slots) == ["a", "b"]
    core.handle(ev.NodeJoined(NodeSpec("a", 1), 2), 10.0)  # a restarted: a new epoch
    out = report(core, "a", [0.0], now=10.1)  # ... and runs nothing
    assert changes(out, "g") == [PENDING] and starts(out) == {}
    [st] = stops(out)
    assert st.nodes == ("b",) and core.job("g").state == PENDING
    assert starts(core.handle(ev.Tick(), 30.0)) == {}  # b has not said its rank is gone: no second copy
    assert starts(report(core, "b", [0.5], workers=(ev.WorkerReport("g", "g.1", rank_b, True),), now=31.0)) == {}
    if how == "exit_event":
        out = core.handle(ev.RankExited("g", "g.1", rank_b, 143), 32.0)
    elif how == "report":
        out = report(core, "b", [0.0], now=32.0)
    elif how == "cancelled":
        assert changes(core.handle(ev.JobCancelled("g"), 31.5), "g") == [CANCELLED]
        out = core.handle(ev.RankExited("g", "g.1", rank_b, 143), 32.0)
        assert starts(out) == {} and core.job("g").state == CANCELLED and core.queues() == {}
        assert starts(core.handle(ev.Tick(), 40.0)) == {}
        return
    else:
        out = core.handle(ev.NodeLost("b", "silent", hold_s=13.5), 32.0)  # its lease may let the rank run
        assert starts(out) == {} and starts(core.handle(ev.Tick(), 45.0)) == {}
        if how == "silent_hold_over":
            out = core.handle(ev.Tick(), 45.5)
        else:
            core.handle(ev.NodeJoined(NodeSpec("b", 1), 1), 40.0)  # back (same epoch) before the hold is over
            assert starts(core.handle(ev.Tick(), 46.0)) == {}  # back: only its word ends the wait now
            out = report(core, "b", [0.0], now=46.5)
    assert starts(out)["g"].placement_id == "g.2" and core.job("g").state == PLACING
    core.state.check_invariants()


def test_a_preempted_job_restarts_only_once_its_old_worker_is_gone():
    """o is preempted for g: though it fits beside h on n0 at once, it is placed again only with g, after
    n1 said o's old worker exited."""
    cfg = config(["fifo", "gang", "binpack", "opportunistic", "preemption"])
    gib = 1 << 30
    core = make_core(cfg, [("n0", 1, 16 * gib), ("n1", 1, 16 * gib)])
    assert run(core, job("h", gpu_mem=8 * gib))["h"].slots[0].node_id == "n0"
    report(core, "n0", [0.1])
    report(core, "n1", [0.0])
    o = run(core, job("o", gpu_mem=4 * gib, klass="opportunistic"), now=0.5)["o"]
    assert o.slots[0].node_id == "n1"
    out = submit(core, job("g", gpu_mem=14 * gib, t=1), now=1.0)
    assert [(d.job_id, d.reason) for d in stops(out)] == [("o", "preempted")] and changes(out, "o") == [PENDING]
    assert starts(core.handle(ev.Tick(), 1.5)) == {}  # o's old worker still runs on n1
    out = confirm_stops(core, out, 2.0)
    assert sorted(starts(out)) == ["g", "o"] and starts(out)["o"].slots[0].node_id == "n0"
    core.state.check_invariants()


def oom(core, job_id, now, rank=0):
    p = core.job(job_id).placement
    return core.handle(ev.RankExited(job_id, p.placement_id, rank, 1, oom=True), now)


def test_out_of_memory_under_a_recommended_cap_restarts_at_the_fallback_uncounted():
    core = make_core("gang-binpack", [("n0", 2, 16 << 30)])
    run(core, job("r", gpu_mem=1 << 30, mem_fallback=0))
    out = oom(core, "r", 5.0)
    (changed,) = [d for d in out if isinstance(d, ev.JobChanged) and d.state == PENDING]
    assert changed.oom and changed.spec.gpu_mem == 0 and changed.spec.mem_fallback is None
    assert "recommended cap" in changed.reason and "not the job's failure" in changed.reason
    j = core.job("r")
    assert j.failed_starts == 0 and core.stats["oom_restarts"] == 1 and j.spec.gpu_mem == 0
    again = starts(out)  # the same cycle placed it again (its GPU was released with the exit)
    assert "r" in again and core.job("r").attempt == 2
    start_all(core, out, 6.0)
    out = oom(core, "r", 7.0)  # out of memory at the whole GPU: its own failure now
    assert changes(out, "r") == [FAILED] and [d.oom for d in out if isinstance(d, ev.JobChanged)] == [True]


@pytest.mark.parametrize("during", ["placing", "running"])
def test_out_of_memory_under_its_own_cap_is_a_failure(during):
    core = make_core("gang-binpack", [("n0", 2, 16 << 30)])
    placed = submit(core, job("o", gpu_mem=1 << 30))
    if during == "running":
        start_all(core, placed, 1.0)
    out = oom(core, "o", 2.0)
    want = [FAILED] if during == "running" else [PENDING, PLACING]  # a start failure, requeued and placed again
    assert changes(out, "o") == want and core.stats["oom_restarts"] == 0


@pytest.mark.parametrize("code", [0, 143])  # saved its checkpoint and exited cleanly, or was SIGTERMed
def test_a_worker_its_node_reclaimed_goes_back_to_the_queue_not_counted_as_a_failure(code):
    core = make_core("antman", [("n0", 2, 16 << 30)])
    placed = submit(core, job("o", klass="opportunistic", workers=2))
    start_all(core, placed, 1.0)
    p = core.job("o").placement
    node = p.slots[0].node_id
    out = core.handle(ev.RankExited("o", p.placement_id, 0, code, node_id=node, reclaimed=True), 2.0)
    (changed,) = [d for d in out if isinstance(d, ev.JobChanged) and d.job_id == "o"][:1]
    assert changed.state == PENDING and "needed the memory it held" in changed.reason
    assert [d.reason for d in stops(out)] == ["memory reclaimed"]  # the gang's other rank
    j = core.job("o")
    assert j.failed_starts == 0 and core.stats["reclaims"] == 1 and j.state in (PENDING, PLACING)
    core.state.check_invariants()
