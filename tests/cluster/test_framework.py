"""cluster/framework.py: the closed framework. A plugin that raises never leaves a statement open
(observation 13 of issue 13); the status set is closed (HELD and ERROR in it); exactly one node-order
and one GPU-pick plugin per placed class, checked when the config loads; scores normalized before
they are weighted."""

from __future__ import annotations

import random

import pytest

from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.events import PENDING, PLACING
from cluster.params import Param
from cluster.points import SUCCESS, Code, Plugin, Status, held, register
from tests.cluster.helpers import (
    config,
    finish,
    job,
    make_core,
    start_all,
    starts,
    submit,
)

ATTEMPT_POINTS = ("pre_filter", "filter", "score", "reserve", "permit", "unreserve")


@register
class _Boom(Plugin):
    """Test plugin: raises at ``armed`` (a point name), for job "gang" only (on the worker of rank ``rank``
    for filter and score)."""

    name = "_boom"
    serves = frozenset(("guaranteed",))
    PARAMS = {"weight": Param(1, "int", lambda v: v >= 0)}

    def __init__(self, params) -> None:
        super().__init__(params)
        self.armed = ""
        self.rank = 0
        self.unreserved = 0

    def _maybe(self, point: str, req=None, rank: int = 0) -> None:
        if self.armed == point and (req is None or (req.job.job_id == "gang" and rank == self.rank)):
            raise KeyError(f"bug at {point}")

    def cycle_start(self, now):
        self._maybe("cycle_start")

    def pre_filter(self, req):
        self._maybe("pre_filter", req)
        return SUCCESS

    def filter(self, req, node):
        self._maybe("filter", req, req.rank)
        return SUCCESS

    def score(self, req, node):
        self._maybe("score", req, req.rank)
        return 0.0

    def reserve(self, req, stmt):
        self._maybe("reserve", req)
        return SUCCESS

    def unreserve(self, req, stmt):
        self.unreserved += 1
        self._maybe("unreserve", req)

    def permit(self, req, stmt):
        self._maybe("permit", req)
        if self.armed == "unreserve" and req.job.job_id == "gang":  # refuse, so that unreserve runs (and raises)
            return Status(Code.UNSCHEDULABLE, self.name, "refused")
        return SUCCESS

    def post_filter(self, req, status):
        self._maybe("post_filter", req)


def boom_core():
    cfg = config(["fifo", "gang", "binpack", "_boom"], scheduler={"feasible_nodes": 2})
    return make_core(cfg, [("n0", 1), ("n1", 1), ("n2", 2)])


def snapshot(core):
    return {p: {r: (a.node_id, a.gpus) for r, a in per.items()} for p, per in core.state.allocs.items()}


@pytest.mark.parametrize("point", ATTEMPT_POINTS)
def test_a_plugin_that_raises_in_an_attempt_is_an_error_status_and_leaves_nothing_open(point):
    core = boom_core()
    boom = core.fw.plugin("_boom")
    # filter and score raise on the 2nd worker, when rank 0 is held in the statement; the others raise with
    # both workers held (reserve, permit, unreserve) or before any (pre_filter)
    boom.armed, boom.rank = point, (1 if point in ("filter", "score") else 0)
    before = snapshot(core)
    out = submit(core, job("gang", workers=2, gpus=1))
    assert starts(out) == {}
    assert core.fw._stmt.allocs == []  # no statement left open
    assert snapshot(core) == before  # nothing half-allocated
    core.state.check_invariants()
    gang = core.job("gang")
    assert gang.state == PENDING and gang.reason.startswith("_boom: internal error: KeyError")
    if point in ("reserve", "permit", "unreserve"):
        assert boom.unreserved == 1  # reserve was reached: every reserve plugin's unreserve ran
    # the erring job is passed over, never blocking its queue: a job behind it still starts
    out = submit(core, job("small", gpus=2, t=1.0), now=1.0)
    assert starts(out)["small"].nodes() == ("n2",)
    # the same core schedules correctly once the plugin behaves
    boom.armed = ""
    out = core.handle(ev.Tick(), 3.0)
    assert len(starts(out)["gang"].slots) == 2 and core.job("gang").state == PLACING
    core.state.check_invariants()


@pytest.mark.parametrize("point", ["cycle_start", "post_filter"])
def test_an_exception_the_framework_cannot_turn_into_a_status_propagates_with_no_statement_open(point):
    """Where no status can say it (outside an attempt, or an unreserve that fails while undoing one), the
    exception reaches the caller (the live service rebuilds the core from its journal); no statement is
    left open, so a core rebuilt from the records, or this one, schedules correctly."""
    core = boom_core()
    boom = core.fw.plugin("_boom")
    start_all(core, submit(core, job("hold", gpus=2)))  # n2 busy: a 2-GPU job then blocks and reaches post_filter
    before = snapshot(core)
    boom.armed = point
    with pytest.raises(KeyError):
        submit(core, job("gang", gpus=2, t=1.0), now=1.0)
    assert core.fw._stmt.allocs == []
    assert snapshot(core) == before
    core.state.check_invariants()
    # a fresh core rebuilt from the records (what the service does) holds the same jobs, and places the job
    # once the nodes are back and the capacity it waits for is free
    fresh = SchedulerCore(core.config, random.Random(0))
    fresh.restore(core.records(), 2.0)
    assert fresh.queues() == {"default": ["gang"]}
    fresh.handle_batch([ev.NodeJoined(n.spec, 1) for n in core.state.nodes.values()], 2.0)
    fresh.state.check_invariants()
    out = fresh.handle(ev.JobCancelled("hold"), 2.5)
    assert [d.job_id for d in out if isinstance(d, ev.JobChanged)] == ["hold"]  # its slots wait for the exits
    boom.armed = ""
    out = finish(core, "hold", 3.0)  # the same core, once the plugin behaves
    assert starts(out)["gang"].nodes() == ("n2",)


def test_the_status_set_is_closed_and_held_is_one_of_its_codes():
    assert {c.name for c in Code} == {"SUCCESS", "UNSCHEDULABLE", "FAILS_JOB", "HELD", "UNPLACEABLE", "ERROR"}
    st = held("multi_queue", "held for job 3")
    assert st.code == Code.HELD and st.held and not st.ok
    assert not Status(Code.UNSCHEDULABLE, "fit", "no room").held
    assert Status(Code.ERROR, "x", "internal error").held  # no remedy for want of capacity acts on a bug


@pytest.mark.parametrize("plugins, message", [
    (["fifo"], "plugins: guaranteed jobs need exactly one node-order plugin (one of "),
    (["fifo"], "binpack, fgd, first_fit, genetic, round_robin, spread, tetris, topology), got none"),
    (["fifo", "binpack", "spread"], "guaranteed jobs need exactly one node-order plugin"),
    (["fifo", "first_fit", "binpack"], "got first_fit, binpack"),
    (["fifo", "gang", "_order_only"], "guaranteed jobs need exactly one GPU-pick plugin"),
    (["fifo", "binpack", "opportunistic", "_opp_order"], "opportunistic jobs need exactly one node-order plugin "),
    (["fifo", "binpack", "opportunistic", "_opp_order"], "got opportunistic, _opp_order"),
])
def test_one_node_order_and_one_gpu_pick_plugin_per_class_at_config_load(plugins, message):
    with pytest.raises(ValueError) as err:
        config(plugins)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_class_with_no_placing_plugin_is_allowed_and_refused_at_submit():
    core = make_core(config(["fifo", "binpack"]), [("n0", 1)])
    submit(core, job("o", klass="opportunistic"))
    assert core.job("o").state == "failed" and "no plugin places opportunistic jobs" in core.job("o").reason


@register
class _OrderOnly(Plugin):
    name = "_order_only"
    serves = frozenset(("guaranteed",))

    def node_order(self, req):
        return iter(self.fw.state.up_nodes())


@register
class _OppOrder(Plugin):
    name = "_opp_order"
    serves = frozenset(("opportunistic",))

    def node_order(self, req):
        return iter(self.fw.state.up_nodes())

    def pick_gpus(self, req, node):
        return (0,)


@register
class _Index(Plugin):
    """Test score: ``scale`` x (the node's join index), or minus that with ``flip``."""

    name = "_index"
    serves = frozenset(("guaranteed",))
    PARAMS = {"weight": Param(1, "int", lambda v: v >= 0), "scale": Param(1.0, "float"),
              "flip": Param(False, "bool")}

    def score(self, req, node):
        i = int(node.node_id[1:]) * self.p["scale"]
        return -i if self.p["flip"] else i


@register
class _Index2(_Index):
    name = "_index2"


@pytest.mark.parametrize("big_w, small_w, expect", [
    (1, 2, "n0"),  # normalized: n0 = 2 x 100, n2 = 1 x 100: the heavier weight wins whatever the raw scale
    (2, 1, "n2"),
    (1, 1, "n0"),  # a tie (100 each at both ends): candidate order keeps n0 first
])
def test_scores_are_normalized_before_they_are_weighted(big_w, small_w, expect):
    """Raw scores 0..2000 (``_index``) against 0..-2 (``_index2``): weights compare only if each plugin's
    scores are on one scale; on the raw scale the large one always won."""
    cfg = config(["fifo", "spread", "_index", "_index2"], spread={"weight": 0},
                 _index={"weight": big_w, "scale": 1000.0}, _index2={"weight": small_w, "flip": True},
                 scheduler={"feasible_nodes": 3})
    core = make_core(cfg, [("n0", 4), ("n1", 4), ("n2", 4)])
    out = submit(core, job("j", gpus=1))
    assert starts(out)["j"].nodes() == (expect,)


def test_a_score_that_is_not_a_number_is_the_plugins_error():
    cfg = config(["fifo", "spread", "_index"], _index={"scale": float("inf")}, scheduler={"feasible_nodes": 3})
    core = make_core(cfg, [("n1", 4), ("n2", 4)])
    submit(core, job("j", gpus=1))
    assert core.job("j").reason == "_index: internal error: PluginError: score inf is not a finite number"
    assert core.fw._stmt.allocs == [] and core.state.allocs == {}
