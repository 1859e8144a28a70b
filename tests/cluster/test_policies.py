"""Queue orderings and placement policies, table-driven: FIFO vs multi-queue, binpack vs spread,
gang all-or-none."""

from __future__ import annotations

import pytest

from cluster.events import FAILED, PENDING, PLACING, NodeJoined, NodeLost, Tick
from cluster.spec import NodeSpec
from tests.cluster.helpers import changes, config, job, make_core, nodes_of, run, starts, submit


@pytest.mark.parametrize("policy, small_starts", [
    ("fifo", False),
    ("gang-binpack", False),
    ("multi-queue", True),
])
def test_blocked_large_head(policy, small_starts):
    """A large gang that does not fit blocks a FIFO queue; under multi-queue the small job runs."""
    core = make_core(policy, [("n0", 4), ("n1", 4)])
    run(core, job("running", gpus=4))
    out = submit(core, job("large", workers=2, gpus=4, t=1), job("small", gpus=1, t=2), now=1)
    assert "large" not in starts(out)
    assert ("small" in starts(out)) is small_starts
    assert core.job("large").state == PENDING
    if small_starts:
        assert core.queues() == {"large": ["large"]}
    else:
        assert core.blocked()["default"][0] == "large"


@pytest.mark.parametrize("size_queues, gpus, workers, queue", [
    ({"small": 2, "large": float("inf")}, 2, 1, "small"),
    ({"small": 2, "large": float("inf")}, 1, 3, "large"),
    ({"tiny": 1, "mid": 4, "huge": float("inf")}, 2, 2, "mid"),
    ({"tiny": 1, "mid": 4, "huge": float("inf")}, 8, 1, "huge"),
])
def test_multi_queue_sizes(size_queues, gpus, workers, queue):
    core = make_core(config(["multi_queue", "gang", "binpack"], multi_queue={"size_queues": size_queues}))
    submit(core, job("j", gpus=gpus, workers=workers))
    assert core.queues() == {queue: ["j"]}


def test_multi_queue_named_and_unknown_queues():
    core = make_core(config(["multi_queue", "gang", "binpack"], multi_queue={"queues": ["research"]}))
    out = submit(core, job("a", queue="research"), job("b", queue="nope"), job("c"))
    assert core.queues() == {"research": ["a"], "small": ["c"]}
    assert core.job("b").state == FAILED and "unknown queue 'nope'" in core.job("b").reason
    assert changes(out, "b") == [FAILED]
    assert core.validate(job("d", queue="nope")) is not None
    assert core.validate(job("d", queue="research")) is None


@pytest.mark.parametrize("policy, gpus, node", [
    ("gang-binpack", 1, "n2"),  # closest free count >= 1
    ("gang-binpack", 2, "n2"),
    ("gang-binpack", 3, "n4"),
    ("gang-binpack", 5, "n8"),
    ("fifo", 1, "n8"),  # spread: the emptiest
    ("fifo", 3, "n8"),
    ("fifo", 2, "n8"),
])
def test_binpack_closest_spread_emptiest(policy, gpus, node):
    core = make_core(policy, [("n8", 8), ("n2", 2), ("n4", 4)])
    placed = run(core, job("j", gpus=gpus))
    assert nodes_of(placed["j"]) == [node]


@pytest.mark.parametrize("plugin, gpus, node", [("binpack", 1, "n2"), ("binpack", 3, "n4"), ("spread", 1, "n8")])
def test_candidate_order_alone_without_scoring(plugin, gpus, node):
    """With one feasible node wanted, the plugin's candidate order decides by itself."""
    core = make_core(config(["fifo", plugin], scheduler={"feasible_nodes": 1}), [("n8", 8), ("n2", 2), ("n4", 4)])
    assert nodes_of(run(core, job("j", gpus=gpus))["j"]) == [node]


@pytest.mark.parametrize("policy, distinct_nodes", [("gang-binpack", 1), ("fifo", 2)])
def test_gang_packed_or_spread(policy, distinct_nodes):
    core = make_core(policy, [("n0", 4), ("n1", 4), ("n2", 4)])
    placed = run(core, job("g", workers=2, gpus=2))
    assert len(set(nodes_of(placed["g"]))) == distinct_nodes
    core.state.check_invariants()


def test_binpack_gang_prefers_fewest_nodes_when_split():
    """6 workers x 1 GPU on nodes with 4, 4 and 1 free: two nodes, not three."""
    core = make_core("gang-binpack", [("a", 4), ("b", 4), ("c", 1)])
    placed = run(core, job("g", workers=6, gpus=1))
    assert sorted(set(nodes_of(placed["g"]))) == ["a", "b"]


@pytest.mark.parametrize("pre, spec, why", [
    (job("pre", gpus=2), job("g", workers=2, gpus=3), "fit"),  # 6 GPUs free, but only one node has 3
    # 8 GPUs free, but a CPU-only job holds 6000 of one node's 8000 milli-CPU: the 2nd worker finds no CPU
    (job("pre", gpus=0, cpu_milli=6000), job("g", workers=2, gpus=4, cpu_milli=4000), "framework"),
])
def test_gang_all_or_none(pre, spec, why):
    core = make_core("gang-binpack", [NodeSpec("n0", 4, cpu_milli=8000), NodeSpec("n1", 4, cpu_milli=8000)])
    assert run(core, pre)
    before = {p: dict(a) for p, a in core.state.allocs.items()}
    out = submit(core, spec)
    assert starts(out) == {}
    assert core.job("g").state == PENDING
    assert core.state.allocs == before  # no partial allocation left behind
    assert core.state.free_gpus() == 8 - pre.gpus
    assert core.blocked()["default"][1].startswith(why)
    core.state.check_invariants()


@pytest.mark.parametrize("spec, reason", [
    (job("g", gpus=16), "largest node has 8"),
    (job("g", workers=3, gpus=8), "cluster has 16"),
])
def test_gang_never_fits_fails(spec, reason):
    core = make_core("gang-binpack", [("n0", 8), ("n1", 8)])
    out = submit(core, spec)
    assert changes(out, "g") == [FAILED]  # refused at submit: it never queued
    assert reason in core.job("g").reason
    assert core.queues() == {}


def test_an_accepted_gang_waits_when_nodes_go_away():
    """Nodes come and go (a restarted scheduler learns them one by one): a queued gang is never
    failed for the cluster's size, it waits until the nodes are back."""
    core = make_core("gang-binpack", [("n0", 8), ("n1", 8)])
    core.handle(NodeLost("n1", "gone"), 1.0)
    submit(core, job("g", gpus=8, workers=2, t=2.0), now=2.0)  # a known node is down: it waits
    core.handle(Tick(), 3.0)
    assert core.job("g").state == PENDING
    out = core.handle(NodeJoined(NodeSpec("n1", 8), 2), 4.0)
    assert starts(out)["g"].nodes() and core.job("g").state == PLACING


def test_gang_waits_while_no_node_is_known():
    core = make_core("gang-binpack")
    submit(core, job("g", gpus=16))
    assert core.job("g").state == PENDING


def test_fractional_shares_best_fit_and_never_over_1000():
    core = make_core("gang-binpack", [("n0", 2)])
    placed = run(core, job("a", gpu_milli=600), job("b", gpu_milli=300, t=1), job("c", gpu_milli=500, t=2))
    gpu_a = placed["a"].slots[0].gpus
    assert placed["b"].slots[0].gpus == gpu_a  # best fit: the partly used GPU
    assert placed["c"].slots[0].gpus != gpu_a  # 600 + 300 + 500 > 1000
    out = submit(core, job("d", gpu_milli=600, t=3))
    assert "d" not in starts(out)
    core.state.check_invariants()
    assert max(g.milli for g in core.state.nodes["n0"].gpus) <= 1000


def test_two_whole_gpu_jobs_never_share_a_gpu():
    core = make_core("gang-binpack", [("n0", 1)])
    out = submit(core, job("a"), job("b", t=1))
    assert list(starts(out)) == ["a"]
    assert core.job("b").state == PENDING and core.job("a").state == PLACING
