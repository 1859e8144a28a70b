"""A node policy's labels are one vocabulary (``SloState``), and ``adaptive`` keeps its per-GPU state in a
typed record (``AdaptiveState``), made afresh for each guaranteed job and dropped when there is none."""

from __future__ import annotations

import pytest

from colocate.base.vocab import SloState
from colocate.node.policies import AdaptiveState
from tests.colocate.node.test_core import FAST, Node


@pytest.mark.parametrize("policy", ["exclusive", "pack", "static", "adaptive"])
def test_every_label_a_policy_gives_is_a_slo_state_member(policy):
    n = Node(policy=policy, **(FAST if policy == "adaptive" else {}))
    n.register("g")
    n.register("o", priority="opportunistic", pid=1001)
    seen = set()
    for _ in range(12):
        n.report("g")
        n.report("o")
        seen |= {type(j.slo_state) for j in n.core.jobs.values()}
    assert seen == {SloState}


def test_adaptive_keeps_a_typed_record_per_guaranteed_job():
    n = Node(**FAST)
    n.register("g")
    n.register("o", priority="opportunistic", pid=1001)
    gpu = n.core.gpus[0]
    first = gpu.policy
    assert isinstance(first, AdaptiveState) and first.job == "g" and first.profiling
    for _ in range(12):
        n.report("g")
        n.report("o")
    assert gpu.policy is first and not first.profiling and first.baseline > 0  # the profile ended: a baseline
    assert n.state("g") in (SloState.OK, SloState.VIOLATED) and type(n.state("o")) is SloState
