"""The ``topology`` plugin's ``wait_s`` in the simulator, table-driven: a 2 x 4 gang arrives (t=10) when the
only free nodes are a1 (switch s1) and b1 (s2); a2, beside a1, frees at t=100. With no wait the gang spans two
switches at once; with a wait shorter than 90 s it waits, then takes the two switches when its wait ends (the
simulator ticks for it: nothing else happens then); with a longer one it gets s1 whole at t=100. A job behind it
(``w``) may not take a1 or b1 while it waits. The live core replaying the recorded events decides the same."""

from __future__ import annotations

import pytest

from cluster.spec import NodeSpec
from tests.cluster.sim.helpers import config, job, replay, run

NODES = [NodeSpec("a1", 4, switch="s1", rack="r1"), NodeSpec("a2", 4, gpu_model="P", switch="s1", rack="r1"),
         NodeSpec("b1", 4, switch="s2", rack="r1"), NodeSpec("b2", 4, gpu_model="Q", switch="s2", rack="r1")]
BUSY = [job("fa", 0.0, 100.0, gpus=4, gpu_model="P"), job("fb", 0.0, 1000.0, gpus=4, gpu_model="Q")]  # a2, b2
GANG = job("g", 10.0, 100.0, gpus=4, workers=2)
BEHIND = job("w", 20.0, 500.0, gpus=4)


@pytest.mark.parametrize("wait_s, behind, g_start, g_span, w_start, w_node", [
    (0.0, False, 10.0, (2, 2, 1), None, None),  # no wait: two switches at once
    (50.0, False, 60.0, (2, 2, 1), None, None),  # a2 frees after the wait ends: two switches at t=60
    (200.0, False, 100.0, (2, 1, 1), None, None),  # a2 frees within the wait: one switch at t=100
    (0.0, True, 10.0, (2, 2, 1), 100.0, "a2"),  # w waits for a2
    (50.0, True, 60.0, (2, 2, 1), 100.0, "a2"),  # a1 and b1 kept from w until t=60, then the gang takes them
    (200.0, True, 100.0, (2, 1, 1), 100.0, "b1"),  # w may not take a1 or b1 at t=20: the wait pays off
])
def test_wait_s_changes_where_and_when_a_gang_starts(wait_s, behind, g_start, g_span, w_start, w_node):
    policy = config(["fifo", "gang", "topology"], topology={"wait_s": wait_s})
    jobs = BUSY + [GANG] + ([BEHIND] if behind else [])
    sim, rows, _ = run(policy, jobs, NODES)
    row = {r["job_id"]: r for r in rows}
    assert (row["g"]["start_s"], sim.by_id["g"].span) == (g_start, g_span)
    if behind:
        assert row["w"]["start_s"] == w_start
        assert [s.node_id for s in sim.by_id["w"].placement.slots] == [w_node]
    assert replay(sim.log, policy) == [out for _, _, out in sim.log]
