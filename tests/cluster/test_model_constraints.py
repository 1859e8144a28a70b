"""GPU model constraints: one model, or several (``"A|B"``: any of them will do), for guaranteed and
opportunistic, whole and fractional requests, with nodes joining before and after the constraint is seen."""

from __future__ import annotations

import pytest

from cluster import events as ev
from cluster.events import FAILED, PENDING
from cluster.spec import NodeSpec
from tests.cluster.helpers import job, make_core, report, run, starts, submit

NODES = [NodeSpec("p100", 2, gpu_model="P100"), NodeSpec("t4", 2, gpu_model="T4"), NodeSpec("v100", 4, gpu_model="V100")]


@pytest.mark.parametrize("policy", ["gang-binpack", "fifo", "first-fit", "best-fit", "tetris", "fgd", "antman"])
@pytest.mark.parametrize("constraint, gpus, milli, allowed", [
    ("T4", 2, 1000, {"t4"}),
    ("T4|V100", 4, 1000, {"v100"}),  # only the V100 node has 4 GPUs
    ("P100|T4", 1, 1000, {"p100", "t4"}),
    ("P100|T4", 1, 300, {"p100", "t4"}),  # a fractional share
    ("A100|H100", 1, 1000, set()),  # no such node has joined: refused at submit
])
def test_a_job_runs_only_on_a_model_its_constraint_allows(policy, constraint, gpus, milli, allowed):
    core = make_core(policy, NODES)
    out = submit(core, job("j", gpus=gpus, gpu_milli=milli, gpu_model=constraint))
    placed = starts(out)
    if not allowed:
        assert placed == {} and core.job("j").state == FAILED
        assert "no known node has A100|H100 GPUs" in core.job("j").reason
    else:
        assert set(placed["j"].nodes()) <= allowed, placed
    core.state.check_invariants()


def test_nodes_joining_after_the_constraint_was_seen_are_indexed_for_it():
    core = make_core("gang-binpack", [NodeSpec("p100", 1, gpu_model="P100")])
    run(core, job("busy", gpu_model="P100"))
    submit(core, job("j", gpu_model="P100|T4", t=1.0), now=1.0)
    assert core.job("j").state == PENDING  # the only allowed node is full
    out = core.handle(ev.NodeJoined(NodeSpec("t4", 1, gpu_model="T4"), 1), 2.0)
    assert starts(out)["j"].nodes() == ("t4",)
    core.state.check_invariants()


def test_an_opportunistic_job_with_several_models():
    core = make_core("antman", NODES)
    for n in ("p100", "t4", "v100"):
        report(core, n, [0.5] * (4 if n == "v100" else 2))
    out = submit(core, job("o", gpu_model="T4|V100", klass="opportunistic"))
    assert set(starts(out)["o"].nodes()) <= {"t4", "v100"}
