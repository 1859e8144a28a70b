"""The opportunistic GPU pick is one rule (``colocate.base.pick``), used by the scheduler's ``opportunistic`` plugin
(``cluster.fitting``) and by the node (``colocate.node.pick``): both choose the same GPU from the same facts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.fitting import pick_opportunistic
from cluster.spec import NodeSpec
from cluster.state import NodeState
from colocate.base.pick import fits, pick
from colocate.node.pick import GpuRoom, pick_gpu

GiB = 1 << 30


def test_the_least_utilized_then_beside_a_guaranteed_worker_then_fewer_opportunistic_then_the_lowest_index():
    rooms = [GpuRoom(0, 0.5, GiB), GpuRoom(1, 0.2, GiB, opportunistic=1), GpuRoom(2, 0.2, GiB),
             GpuRoom(3, 0.2, GiB, beside_guaranteed=True, opportunistic=1), GpuRoom(4, 0.2, GiB)]
    assert pick(rooms, 1, 1, 0.8) == (3,)  # beside a guaranteed worker, though it holds one already
    assert pick(rooms, 2, 1, 0.8) == (2, 3)  # then no opportunistic worker yet, lowest index first
    assert pick(rooms, 4, 1, 0.8) == (1, 2, 3, 4) and pick(rooms, 6, 1, 0.8) is None and pick(rooms, 0, 1, 0.8) == ()


def test_a_gpu_fits_under_the_threshold_with_the_room_asked_and_under_the_cap():
    room = GpuRoom(0, 0.5, GiB, opportunistic=2)
    assert fits(room, GiB, 0.8) and fits(room, 0, 0.8, max_per_gpu=3)
    assert not fits(room, GiB + 1, 0.8) and not fits(room, 1, 0.5) and not fits(room, 1, 0.8, max_per_gpu=2)


gpu_facts = st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.5, 0.79, 0.8, 0.95]), st.integers(0, 4),
                               st.booleans(), st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(gpus=gpu_facts, need_gib=st.integers(1, 4))
def test_the_node_and_the_scheduler_pick_the_same_gpu(gpus, need_gib):
    """GPUs with the same utilization, free memory, guaranteed neighbour and opportunistic workers: the node's
    pick for a worker asking ``need`` is the scheduler's for a one-GPU opportunistic worker."""
    node = NodeState(NodeSpec("n", len(gpus), gpu_mem=4 * GiB), 1)
    for gpu, (util, free_gib, beside, opp) in zip(node.gpus, gpus, strict=True):
        gpu.utilization, gpu.mem_used, gpu.opportunistic = util, (4 - free_gib) * GiB, opp
        gpu.g = {"guaranteed.1": 1000} if beside else {}
    rooms = [GpuRoom(i, util, free_gib * GiB, beside, opp) for i, (util, free_gib, beside, opp) in enumerate(gpus)]
    by_node = pick_gpu(rooms, need_gib * GiB)
    assert pick_opportunistic(node, 1, need_gib * GiB, 0.8, 0) == (None if by_node is None else (by_node,))
