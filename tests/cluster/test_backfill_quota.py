"""EASY backfill with run-time estimates, the history predictor, and per-queue quotas."""

from __future__ import annotations

import random

import pytest

from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.events import PENDING, RUNNING
from cluster.spec import NodeSpec
from tests.cluster.helpers import changes, config, confirm_stops, finish, job, make_core, run, starts, stops, submit


def backfill_core(policy="backfill"):
    """One 8-GPU node; a 6-GPU job runs from t=0 with a 100 s estimate (shadow time 100)."""
    core = make_core(policy, [("n0", 8)])
    run(core, job("r", gpus=6, estimate_s=100.0))
    return core


@pytest.mark.parametrize("policy, head_gpus, gpus, estimate, starts_now", [
    ("backfill", 8, 2, 50.0, True),  # ends (t=10+50) before the head's reserved start at 100
    ("backfill", 8, 2, 500.0, False),  # would delay the head
    ("backfill", 8, 2, None, False),  # unknown estimate: never backfilled
    ("backfill", 6, 2, 500.0, True),  # long, but only uses GPUs the head will not need at 100
    ("backfill", 7, 2, 500.0, False),  # the head leaves 1 spare GPU at 100, not 2
    ("gang-binpack", 8, 2, 50.0, False),  # no backfill: the blocked head blocks the queue
])
def test_backfill(policy, head_gpus, gpus, estimate, starts_now):
    core = backfill_core(policy)
    out = submit(core, job("head", gpus=head_gpus, t=1, estimate_s=100.0),
                 job("later", gpus=gpus, t=2, estimate_s=estimate), now=10.0)
    assert "head" not in starts(out)
    assert ("later" in starts(out)) is starts_now
    if policy == "backfill":
        head, shadow, extra = core.fw.plugin("backfill").reservation("default")
        assert (head, shadow, extra) == ("head", 100.0, (8 - head_gpus) * 1000 - (2000 if starts_now and estimate == 500.0 else 0))


@pytest.mark.parametrize("constraint, t4_busy, starts_now", [
    ("V100|T4", 4, False),  # may take the head's V100s: held back (it took them, and the head started at 502)
    ("V100", 4, False),
    ("", 4, False),
    ("T4", 2, True),  # none of the head's GPUs: cannot delay it, runs on the free T4s
])
def test_backfill_holds_back_a_job_whose_models_include_the_heads(constraint, t4_busy, starts_now):
    """A V100 head reserved behind a running V100 job; a long job behind it that may run on V100s must not take
    them, whether its constraint names V100 alone, with another model, or none."""
    core = make_core("backfill", [NodeSpec("v", 4, gpu_model="V100"), NodeSpec("t", 4, gpu_model="T4")])
    run(core, job("t4", gpus=t4_busy, gpu_model="T4", estimate_s=1000.0),
        job("r1", gpus=2, gpu_model="V100", estimate_s=100.0))
    out = submit(core, job("head", gpus=4, gpu_model="V100", t=1, estimate_s=100.0),
                 job("x", gpus=2, gpu_model=constraint, t=2, estimate_s=500.0), now=2.0)
    assert ("x" in starts(out)) == starts_now
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", 100.0)


def test_a_head_of_several_models_is_reserved_on_the_running_jobs_of_any_of_them():
    core = make_core("backfill", [NodeSpec("v", 4, gpu_model="V100"), NodeSpec("t", 4, gpu_model="T4")])
    run(core, job("t4", gpus=4, gpu_model="T4", estimate_s=1000.0), job("r1", gpus=2, gpu_model="V100", estimate_s=100.0))
    submit(core, job("head", gpus=4, gpu_model="V100|T4", t=1, estimate_s=100.0), now=1.0)
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", 100.0)  # r1's V100s count


def test_backfill_extra_capacity_is_consumed():
    """Two long jobs each fit the spare GPU count alone, but not both."""
    core = backfill_core()
    out = submit(core, job("head", gpus=6, t=1, estimate_s=10.0), job("l1", gpus=1, t=2, estimate_s=500.0),
                 job("l2", gpus=2, t=3, estimate_s=500.0), now=10.0)
    assert sorted(starts(out)) == ["l1"]


@pytest.mark.parametrize("order, a, b, started", [
    ("shortest", 80.0, 20.0, ["b"]),  # SJBF: the shorter job behind the head takes the hole first
    ("queue", 80.0, 20.0, ["a"]),  # classic EASY: queue order
    ("shortest", 20.0, 20.0, ["a"]),  # a tie keeps queue order
    ("shortest", None, 20.0, ["b"]),  # unknown (never admitted) goes last; b takes the hole
    ("shortest", 20.0, None, ["a"]),
])
def test_backfill_order(order, a, b, started):
    """Two free GPUs before the head's reserved start at 100; a and b (2 GPUs each) would each end in time."""
    core = make_core(config(["fifo", "gang", "binpack", "backfill", "predictor"], backfill={"order": order}),
                     [("n0", 8)])
    run(core, job("r", gpus=6, estimate_s=100.0))
    out = submit(core, job("head", gpus=8, t=1, estimate_s=100.0), job("a", gpus=2, t=2, estimate_s=a),
                 job("b", gpus=2, t=3, estimate_s=b), now=10.0)
    assert sorted(starts(out)) == started
    assert core.fw.plugin("backfill").reservation("default") == ("head", 100.0, 0)


def test_backfill_order_examines_only_the_budget_behind_the_head():
    """depth 1: only the first job behind the head is examined, however short the next one is."""
    core = make_core(config(["fifo", "gang", "binpack", "backfill", "predictor"], backfill={"depth": 1}), [("n0", 8)])
    run(core, job("r", gpus=6, estimate_s=100.0))
    out = submit(core, job("head", gpus=8, t=1, estimate_s=100.0), job("a", gpus=2, t=2, estimate_s=500.0),
                 job("b", gpus=2, t=3, estimate_s=20.0), now=10.0)
    assert starts(out) == {}


def test_backfill_uses_the_predictor_when_no_estimate():
    core = backfill_core()
    # teach the predictor: same user and name ran 20 s
    run(core, job("p", gpus=1, user="ann", name="mnist"), now=1.0)
    finish(core, "p", now=21.0)
    out = submit(core, job("head", gpus=8, t=30), job("later", gpus=1, t=31, user="ann", name="mnist"), now=30.0)
    assert "later" in starts(out)
    assert core.fw.plugin("predictor").predict(core.job("later").spec) == pytest.approx(20.0)


def test_backfill_no_shadow_when_running_jobs_have_no_estimate():
    core = make_core("backfill", [("n0", 8)])
    run(core, job("r", gpus=6))  # no estimate, predictor has no history: never expected to end
    out = submit(core, job("head", gpus=8, t=1), job("later", gpus=1, t=2, estimate_s=1.0), now=5.0)
    assert starts(out) == {}
    assert core.fw.plugin("backfill").reservation("default") is None


@pytest.mark.parametrize("history, spec, expected, level", [
    ([("ann", "a", 1, 10.0), ("ann", "b", 1, 30.0)], ("ann", "a", 1), 10.0, "exact+gpus"),  # same user and name
    ([("ann", "a", 1, 10.0), ("ann", "b", 1, 30.0)], ("ann", "c", 1), 10.0, "user+gpus"),  # same user: the median
    ([("ann", "a", 1, 10.0), ("ann", "b", 1, 30.0), ("ann", "c", 2, 50.0)], ("ann", "x", 2), 50.0, "user+gpus"),
    ([("ann", "a", 1, 10.0), ("ann", "b", 1, 30.0)], ("ann", "c", 2), 10.0, "user"),  # same user, other GPUs
    ([("bob", "a", 2, 10.0), ("ann", "b", 1, 30.0)], ("cat", "x", 2), 10.0, "gpus"),  # same GPU count
    ([("bob", "a", 2, 10.0), ("ann", "b", 1, 30.0)], ("cat", "x", 4), 10.0, "all"),  # everyone
    ([], ("cat", "x", 4), None, None),  # no history: unknown
])
def test_predictor_hierarchy(history, spec, expected, level):
    """The key levels (the jobs submitted nearest, ``near``, left out: see tests/cluster/predict)."""
    core = make_core(config(["fifo", "gang", "binpack", "predictor"], predictor={"trust": 1, "near": 0}), [("n0", 8)])
    t = 0.0
    for i, (user, name, gpus, run_s) in enumerate(history):
        run(core, job(f"h{i}", gpus=gpus, user=user, name=name), now=t)
        finish(core, f"h{i}", now=t + run_s)
        t += 100.0
    user, name, gpus = spec
    q = job("q", gpus=gpus, user=user, name=name, t=t)
    pred = core.fw.plugin("predictor")
    assert pred.predict(q) == (pytest.approx(expected) if expected is not None else None)
    got = pred.quantiles(q, t)
    assert (got.level if got else None) == level


def test_predictor_records_its_error_at_submit_and_learns_only_successes():
    core = make_core(config(["fifo", "gang", "binpack", "predictor"], predictor={"trust": 1}), [("n0", 8)])
    pred = core.fw.plugin("predictor")
    run(core, job("a", user="u", name="n"), now=0.0)
    finish(core, "a", now=10.0)  # learns 10 s, no prediction made at submit
    run(core, job("b", user="u", name="n", t=20.0), now=20.0)  # predicted 10 s at submit
    finish(core, "b", now=40.0)  # ran 20 s
    run(core, job("c", user="u", name="n", t=50.0), now=50.0)
    finish(core, "c", now=1000.0, code=1)  # failed: not learned
    acc = pred.accuracy()
    assert (acc["predictions"], acc["uncovered"], acc["by_level"]) == (1, 1, {"exact+gpus": 1})
    assert acc["median_abs_pct_error"] == pytest.approx(0.5)
    assert (acc["within_2x"], acc["under_predicted"], acc["above_p90"]) == (1.0, 1.0, 1.0)
    assert pred.predict(job("d", user="u", name="n", t=1000.0)) == pytest.approx(10.0)  # median of 10, 20


def predicted_core(backfill):
    """One 8-GPU node; ann's job x ran 10, 20, 30, 400, 500 s (p50 30, p90 500); r (6 GPUs) runs to 1200."""
    cfg = config(["fifo", "gang", "binpack", "backfill", "predictor"], predictor={"trust": 1}, backfill=backfill)
    core = make_core(cfg, [("n0", 8)])
    run(core, job("r", gpus=6, estimate_s=1200.0))
    t = 0.0
    for i, d in enumerate((10.0, 20.0, 30.0, 400.0, 500.0)):
        run(core, job(f"h{i}", user="ann", name="x", t=t), now=t)
        finish(core, f"h{i}", now=t + d)
        t += d
    return core


@pytest.mark.parametrize("backfill, starts_now", [
    ({"admit": "p90"}, False),
    ({"admit": "p50"}, True),
    ({}, True),  # the default admits on the p50
    ({"quantile": "p90", "admit": "p90"}, False),
    ({"quantile": "p50"}, True),
])
def test_backfill_admits_on_the_predicted_quantile(backfill, starts_now):
    """At 1000 the head waits for 1200: x's p50 (30 s) would end in time, its p90 (500 s) would not."""
    core = predicted_core(backfill)
    q = core.fw.plugin("predictor").quantiles(job("x", user="ann", name="x"), 1000.0)
    assert (q.p50, q.p90, q.level) == (30.0, 500.0, "exact+gpus")
    out = submit(core, job("head", gpus=8, t=1000), job("later", user="ann", name="x", t=1000), now=1000.0)
    assert ("later" in starts(out)) is starts_now
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", 1200.0)


@pytest.mark.parametrize("overdue, shadow, starts_now", [
    ("conditional", 6000.0, True),  # r ran 600 s, past all of x's history: p90 = 10 x 600 (the tail)
    ("now", 600.0, False),  # r is taken to end now: nothing ends by then, and the head needs every GPU
])
def test_an_overdue_running_job_is_reestimated_from_the_time_it_has_run(overdue, shadow, starts_now):
    """x ran 10 to 500 s (p90 500); r (6 GPUs, an x, no estimate) started at 0 and is still running at 600."""
    cfg = config(["fifo", "gang", "binpack", "backfill", "predictor"], predictor={"trust": 1, "near": 0},
                 backfill={"overdue": overdue})
    core = make_core(cfg, [("n0", 8), ("n1", 2)])
    for i, d in enumerate((10.0, 20.0, 30.0, 400.0, 500.0)):
        run(core, job(f"h{i}", gpus=2, user="ann", name="x", t=-1000.0), now=-1000.0 + 1000 * i / 5)
        finish(core, f"h{i}", now=-1000.0 + 1000 * i / 5 + d)
    run(core, job("r", gpus=6, user="ann", name="x"), now=0.0)
    run(core, job("s", gpus=2, estimate_s=10_000.0), now=0.0)  # n1 busy: only n0's 2 GPUs are free
    out = submit(core, job("head", gpus=8, t=600), job("later", gpus=2, t=600, estimate_s=1000.0), now=600.0)
    assert ("later" in starts(out)) is starts_now
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", pytest.approx(shadow))


def test_progress_moves_the_reservation():
    """r has no estimate and no history (never expected to end: no shadow time) until its progress
    report projects its end; the next cycle reserves the head's start there."""
    core = make_core(config(["fifo", "gang", "binpack", "backfill", "predictor"]), [("n0", 8)])
    run(core, job("r", gpus=6))
    out = submit(core, job("head", gpus=8, t=1), job("later", t=2, estimate_s=50.0), now=5.0)
    assert starts(out) == {} and core.fw.plugin("backfill").reservation("default") is None
    pred = core.fw.plugin("predictor")
    assert pred.progress(core.job("r"), 10, 100, 1.0, now=10.0)  # 90 iterations of 1 s left: ends at 100
    assert pred.expected_end(core.job("r"), "p90", 10.0) == 100.0
    out = core.schedule(20.0)
    assert "later" in starts(out)  # 20 + 50 <= 100
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", 100.0)


def quota_core(borrow=True, reclaim=True, **extra):
    cfg = config(["fifo", "gang", "binpack", "quota"],
                 quota={"quotas": {"a": 4, "b": 4}, "borrow": borrow, "reclaim": reclaim, **extra})
    return make_core(cfg, [("n0", 4), ("n1", 4)])


@pytest.mark.parametrize("borrow, started", [(True, ["a1", "a2", "a3"]), (False, ["a1", "a2"])])
def test_quota_borrowing(borrow, started):
    core = quota_core(borrow=borrow)
    placed = run(core, *[job(f"a{i}", gpus=2, queue="a", t=i) for i in (1, 2, 3)])
    assert sorted(placed) == started


@pytest.mark.parametrize("jobs, started", [
    ([("big", 8, 2)], ["big"]),  # 16 GPUs of one tenant whose quota is 8: the cluster is empty
    ([("a1", 8, 1), ("a2", 8, 1)], ["a1", "a2"]),  # the second borrows the 8 GPUs no quota covers
])
def test_quota_borrows_the_gpus_no_quota_covers(jobs, started):
    """One tenant known (quota 8) on 16 GPUs: the quotas cover fewer GPUs than the cluster has, and the rest is
    idle quota too (a job above the known tenants' total quota waited for ever on an empty cluster)."""
    cfg = config(["fifo", "gang", "binpack", "quota"], quota={"tenant": "user", "default_quota": 8})
    core = make_core(cfg, [("n0", 8), ("n1", 8)])
    placed = run(core, *[job(name, gpus=g, workers=w, user="A", t=i) for i, (name, g, w) in enumerate(jobs)])
    assert sorted(placed) == started


def test_quota_counts_the_placements_a_restart_restores():
    """A restored core counts the running jobs toward their tenant's quota (it counted none: after a restart a
    tenant at its quota started more)."""
    core = quota_core(borrow=False)
    run(core, job("a1", gpus=2, queue="a"), job("a2", gpus=2, queue="a", t=1))
    submit(core, job("a3", gpus=2, queue="a", t=2), now=2.0)
    assert core.job("a3").state == PENDING
    new = SchedulerCore(core.config, random.Random(0))
    new.restore(core.records(), 10.0)
    out = new.handle_batch([ev.NodeJoined(NodeSpec(n, 4), 5) for n in ("n0", "n1")], 11.0)
    assert "a3" not in starts(out) and new.state.free_gpus() == 4
    assert new.job("a3").state == PENDING
    assert new.fw.plugin("quota").used["a"] == 4000


def test_a_job_above_its_quota_without_borrowing_is_refused_at_submit():
    """It could never start: refused at once (it was queued, and failed only once the pre-filter examined it, which
    a blocked head before it could put off until a restart)."""
    core = quota_core(borrow=False)
    assert core.validate(job("big", gpus=1, workers=5, queue="a")) == "quota: needs 5 GPUs, quota of 'a' is 4"
    assert core.validate(job("ok", gpus=4, queue="a")) is None
    assert quota_core().validate(job("big", gpus=1, workers=5, queue="a")) is None  # borrowing: it may run on idle quota


def test_quota_reclaim_preempts_the_youngest_borrower():
    core = quota_core()
    for i in (1, 2, 3):  # a borrows 2 GPUs of b's idle quota; a3 is the youngest
        run(core, job(f"a{i}", gpus=2, queue="a", t=i), now=float(i))
    out = submit(core, job("b1", gpus=4, queue="b", t=10), now=10.0)
    assert [d.job_id for d in stops(out)] == ["a3"]
    assert stops(out)[0].reason == "preempted"
    assert changes(out, "a3") == [PENDING]
    assert "b1" not in starts(out)  # the GPUs come free once the stop is confirmed
    assert core.job("a1").state == RUNNING and core.job("a2").state == RUNNING
    again = core.schedule(11.0)  # no second round of victims while the first is stopping
    assert stops(again) == []
    out = confirm_stops(core, out, now=12.0)
    assert "b1" in starts(out)
    assert core.job("a3").state == PENDING
    core.state.check_invariants()


def test_quota_no_reclaim_beyond_own_quota():
    core = quota_core()
    for i in (1, 2, 3):
        run(core, job(f"a{i}", gpus=2, queue="a", t=i), now=float(i))
    out = submit(core, job("b1", gpus=6, queue="b", t=10), now=10.0)  # beyond b's quota of 4
    assert stops(out) == [] and "b1" not in starts(out)


@pytest.mark.parametrize("default_quota, state", [(-1, "failed"), (2, "placing")])
def test_quota_unknown_queue(default_quota, state):
    core = quota_core(default_quota=default_quota)
    submit(core, job("x", gpus=1, queue="other"))
    assert core.job("x").state == state
    if state == "failed":
        assert "unknown queue 'other'" in core.job("x").reason


def test_quota_reclaim_takes_the_youngest_borrower_across_queues():
    cfg = config(["fifo", "gang", "binpack", "quota"], quota={"quotas": {"a": 2, "b": 2, "c": 2}})
    core = make_core(cfg, [("n0", 3), ("n1", 3)])
    for i, (name, q, g) in enumerate([("a1", "a", 2), ("a2", "a", 1), ("b1", "b", 2), ("b2", "b", 1)]):
        run(core, job(name, gpus=g, queue=q, t=i), now=float(i))
    assert core.state.free_gpus() == 0
    out = submit(core, job("c1", gpus=1, queue="c", t=10), now=10.0)
    assert [d.job_id for d in stops(out)] == ["b2"]


def test_a_users_quota_failure_does_not_hold_back_another_users_job_of_the_same_shape():
    """Per-user quotas behind a blocked head: the pre-filter result depends on the tenant, so a
    refusal of one user's 1-GPU job is not reused for another user's 1-GPU job in the same cycle."""
    cfg = config(["fifo", "gang", "binpack", "backfill", "quota"],
                 quota={"tenant": "user", "quotas": {"u1": 1, "u2": 1, "big": 8}, "borrow": False})
    core = make_core(cfg, [("n0", 4), ("n1", 4)])
    run(core, job("r1", gpus=1, user="u1", estimate_s=100.0))  # u1 is at its quota
    out = submit(core, job("head", gpus=4, workers=2, user="big", t=1, estimate_s=10.0),  # 8 GPUs, 7 free: blocked
                 job("j1", gpus=1, user="u1", t=2, estimate_s=1.0),  # over u1's quota
                 job("j2", gpus=1, user="u2", t=3, estimate_s=1.0), now=5.0)  # same shape, within u2's
    assert "j1" not in starts(out)
    assert "j2" in starts(out)


def test_a_progress_event_moves_the_reservation_and_costs_a_cycle_only_when_a_job_waits():
    """The same as above through the core's event (what the live scheduler sends from a node's status)."""
    from cluster import events as ev

    core = make_core(config(["fifo", "gang", "binpack", "backfill", "predictor"]), [("n0", 8)])
    run(core, job("r", gpus=6))
    cycles = core.stats["cycles"]
    core.handle(ev.JobProgressed("r", 5, 100, 1.0, 1.0), 3.0)  # nothing waits: no cycle
    assert core.stats["cycles"] == cycles
    out = submit(core, job("head", gpus=8, t=1), job("later", t=2, estimate_s=150.0), now=5.0)
    assert starts(out) == {} and core.fw.plugin("backfill").reservation("default")[:2] == ("head", 3.0 + 95 * 1.0)
    out = core.handle(ev.JobProgressed("r", 10, 100, 2.0, 2.0, age_s=2.0), 12.0)  # reported at 10: 90 x 2 s left
    assert core.fw.plugin("backfill").reservation("default")[:2] == ("head", 190.0)
    assert "later" in starts(out)  # 12 + 150 <= 190: the cycle the progress caused backfilled it
    core.handle(ev.JobProgressed("nobody", 1, 2, 1.0, 1.0), 13.0)  # unknown or not running: ignored
