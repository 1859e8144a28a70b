"""``cluster.core_views``: what the read-only views of the scheduler core say about one small cluster with a
job in each state (running, placing, pending behind a blocked head, set aside), and that reading them changes
no decision."""

from __future__ import annotations

from cluster import events as ev
from cluster.events import PENDING, PLACING, RUNNING
from colocate.base.vocab import JobClass
from tests.cluster.helpers import config, finish, job, make_core, starts, submit


def small_cluster():
    """n1 (2 GPUs) runs ``a`` and is placing ``b`` (1 GPU each); ``e`` (16 GPUs), submitted first, fits no node:
    accepted (``refuse_unplaceable`` off) and set aside; then ``c`` (2 GPUs) heads the queue, blocked, and ``d``
    (1 GPU) waits behind it. Returns (core, a's and b's placements)."""
    core = make_core(config(["fifo", "gang", "binpack"], scheduler={"refuse_unplaceable": False}), [("n1", 2)])
    placed = starts(submit(core, job("a"), job("b")))
    core.handle(ev.RankStarted("a", placed["a"].placement_id, 0), 1.0)
    submit(core, job("e", gpus=16, t=2.0), job("c", gpus=2, t=2.0), job("d", t=2.0), now=2.0)
    return core, placed


def test_each_view_tells_the_state_of_each_job():
    core, placed = small_cluster()
    assert core.queues() == {"default": ["c", "d"]}
    assert core.running() == {"a": placed["a"], "b": placed["b"]}
    assert core.blocked()["default"][0] == "c"
    assert list(core.set_aside()) == ["e"] and core.set_aside()["e"]  # with why
    assert (core.job("a").state, core.job("b").state, core.job("zz")) == (RUNNING, PLACING, None)
    records = core.records()
    assert [(r.spec.job_id, r.state) for r in records] == [  # arrival order
        ("a", RUNNING), ("b", PLACING), ("e", PENDING), ("c", PENDING), ("d", PENDING)]
    assert (records[0].placement, records[1].placement, records[3].placement) == (placed["a"], placed["b"], None)
    (n1,) = core.nodes()
    assert (n1["node_id"], n1["up"], n1["free_gpus"], n1["workers"]) == ("n1", True, 0, 2)
    assert sorted(p for g in n1["gpus"] for p in g[JobClass.GUARANTEED]) == [placed["a"].placement_id,
                                                                            placed["b"].placement_id]
    c = core.counters()
    assert (c["pending"], c["running"], c["placements"], c["stopping"]) == (3, 1, 2, 0)


def test_reading_the_views_changes_no_decision():
    """The same events give the same decisions whether or not every view was read before them."""
    def drive(read: bool) -> list:
        core, placed = small_cluster()
        if read:
            for view in (core.queues, core.running, core.blocked, core.set_aside, core.nodes, core.counters,
                         core.records):
                view()
        core.handle(ev.RankStarted("b", placed["b"].placement_id, 0), 3.0)
        finish(core, "a", 10.0)
        return finish(core, "b", 11.0)  # both GPUs free: the head c starts

    decisions = drive(False)
    assert list(starts(decisions)) == ["c"]
    assert drive(True) == decisions


def test_timers_fall_due_when_a_tick_would_act_on_them():
    """b was placed at 0 and never started: its start deadline (start_timeout_s, 300 s by default) falls due
    at 300, and a Tick then fails its start; before that, nothing a Tick does is due."""
    core, _ = small_cluster()
    assert not core.timers_due(299.0)
    assert core.timers_due(300.0)
    out = core.handle(ev.Tick(), 300.0)
    assert any(isinstance(d, ev.JobChanged) and d.job_id == "b" for d in out)
    assert core.retry["b"][0] == float("inf")  # b waits for its node to say its worker is gone: no timer ends that
    assert not core.timers_due(1e9)
