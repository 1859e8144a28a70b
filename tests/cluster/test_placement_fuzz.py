"""The placement presets under random event sequences (hypothesis): no over-allocation of GPU
milli, CPU or host memory, gangs whole, the plugin's node table as fresh as a new one after every
batch, and the same events give the same decisions (the GA's randomness comes from the core's
seeded rng only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import events as ev
from cluster.events import PLACING, RUNNING
from cluster.plugins.nodetable import NodeTable
from cluster.spec import JobSpec, NodeSpec
from tests.cluster.helpers import make_core

PRESETS = ["first-fit", "round-robin", "best-fit", "tetris", "fgd", "genetic", "genetic-after"]
NODES = [NodeSpec("n0", 4, gpu_model="A", cpu_milli=16000, mem_mib=65536),
         NodeSpec("n1", 2, gpu_model="B", cpu_milli=8000, mem_mib=32768),
         NodeSpec("n2", 8, gpu_model="A", cpu_milli=32000),
         NodeSpec("n3", 0, cpu_milli=8000)]

ops = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 2), st.sampled_from([0, 1, 1, 2, 4]),
              st.sampled_from([1000, 1000, 700, 500, 250]), st.sampled_from([0, 2000, 6000]),
              st.sampled_from([0, 0, 16384]), st.sampled_from(["", "", "A", "B", "A|B"])),
    st.tuples(st.just("exit"), st.integers(0, 40)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("lose"), st.integers(0, 3)),
    st.tuples(st.just("join"), st.integers(0, 3)),
), min_size=3, max_size=40)


def events_for(core, op, n):
    kind = op[0]
    jobs = sorted(core.jobs.values(), key=lambda j: j.seq)
    live = [j for j in jobs if j.state in (PLACING, RUNNING)]
    if kind == "submit":
        _, workers, gpus, milli, cpu, mem, model = op
        if milli < 1000 and gpus != 1:
            milli = 1000
        return [ev.JobSubmitted(JobSpec(f"j{n}", submit_time=float(n), workers=workers, gpus=gpus, gpu_milli=milli,
                                        cpu_milli=cpu, mem_mib=mem, gpu_model=model))]
    if kind == "exit" and live:
        j = live[op[1] % len(live)]
        return [ev.RankExited(j.job_id, j.placement_id, r, 0) for r in range(j.spec.workers)]
    if kind == "cancel" and jobs:
        return [ev.JobCancelled(jobs[op[1] % len(jobs)].job_id)]
    if kind == "lose":
        return [ev.NodeLost(NODES[op[1]].node_id, "test")]
    if kind == "join":
        node = core.state.nodes.get(NODES[op[1]].node_id)
        if node is not None and node.up:
            return []
        return [ev.NodeJoined(NODES[op[1]], (node.epoch if node else 0) + 1)]
    return []


def check(core, plugin):
    core.state.check_invariants()  # milli <= 1000 per GPU, CPU and memory within capacity, indexes
    for j in core.jobs.values():
        if j.state in (PLACING, RUNNING):
            held = core.state.allocs.get(j.placement_id, {})
            assert set(held) == set(range(j.spec.workers)), f"{j.job_id}: gang not whole"
            for a in held.values():
                node = core.state.nodes[a.node_id]
                assert not j.spec.gpu_model or node.model in j.spec.gpu_model.split("|"), "model constraint broken"
    plugin.table.sync(core.state)
    fresh = NodeTable()
    fresh.sync(core.state)
    t = plugin.table
    assert t.rows == fresh.rows and [n.node_id for n in t.nodes] == [n.node_id for n in fresh.nodes]
    n = t.rows
    for name in ("whole", "ngpu", "cpu", "mem", "up"):
        assert np.array_equal(getattr(t, name)[:n], getattr(fresh, name)[:n]), f"stale table: {name}"
    w = fresh.free.shape[1]
    assert np.array_equal(t.free[:n, :w], fresh.free[:n, :w]), "stale table: free milli"


def drive(policy, program):
    core = make_core(policy, NODES, seed=3)
    plugin = core.fw.plugin(core.config.plugins[-1])
    decisions = []
    for i, op in enumerate(program):
        evs = events_for(core, op, i)
        out = core.handle_batch(evs, float(i + 1)) if evs else []
        starts = [d for d in out if isinstance(d, ev.StartWorkers)]
        if starts:  # every placed worker starts at once
            core.handle_batch([ev.RankStarted(d.placement.job_id, d.placement.placement_id, s.rank)
                               for d in starts for s in d.placement.slots], float(i + 1))
        check(core, plugin)
        decisions.append(out)
    return decisions


@pytest.mark.parametrize("policy", PRESETS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
def test_placement_presets_keep_invariants_and_are_deterministic(policy, program):
    first = drive(policy, program)
    assert drive(policy, program) == first
