"""The placement plugins' choices on small hand-made clusters, table-driven: first fit, round robin,
FGD's best fit, Tetris, FGD, the genetic planner; the queue_order extension point."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cluster import events as ev
from cluster.plugins.fgd import TypicalWorkload, deltas, fragmentation, node_fragment, typical
from cluster.plugins.genetic import Search, evolve, mutation_rate
from cluster.plugins.nodetable import NodeTable
from cluster.points import REGISTRY, Plugin, register
from cluster.spec import NodeSpec
from cluster.state import Alloc, ClusterState
from tests.cluster.helpers import config, job, make_core, nodes_of, run, starts, submit

K = 1000  # milli-cores per core


def gpus_of(placement):
    return [s.gpus for s in placement.slots]


def where(core, *specs, now=0.0):
    """Submit ``specs`` one at a time; job id -> (node, gpus) of its (single) worker."""
    got = {}
    for i, s in enumerate(specs):
        p = run(core, s, now=now + i).get(s.job_id)
        got[s.job_id] = (p.slots[0].node_id, p.slots[0].gpus) if p else None
    return got


# ---------------------------------------------------------------- first fit


@pytest.mark.parametrize("jobs, expect", [
    ([job("a", 1)], {"a": ("n2", (0,))}),  # the first node that fits, by join order
    ([job("a", 4)], {"a": ("n8", (0, 1, 2, 3))}),  # n2 is too small: the next one
    ([job("a", 2), job("b", 1)], {"a": ("n2", (0, 1)), "b": ("n8", (0,))}),  # n2 full
    ([job("a", gpu_milli=600), job("b", gpu_milli=300), job("c", gpu_milli=500)],
     {"a": ("n2", (0,)), "b": ("n2", (0,)), "c": ("n2", (1,))}),  # lowest GPU with room
    ([job("a", 1, gpu_model="V")], {"a": ("n4", (0,))}),  # model constraint
])
def test_first_fit_takes_the_first_fitting_node(jobs, expect):
    core = make_core("first-fit", [NodeSpec("n2", 2), NodeSpec("n8", 8), NodeSpec("n4", 4, gpu_model="V")])
    assert where(core, *jobs) == expect
    core.state.check_invariants()


def test_first_fit_rejoined_node_keeps_its_place():
    core = make_core("first-fit", [NodeSpec("a", 1), NodeSpec("b", 1)])
    core.handle(ev.NodeLost("a", "test"), 1.0)
    core.handle(ev.NodeJoined(NodeSpec("a", 1), 2), 2.0)
    assert where(core, job("x", 1), now=3.0) == {"x": ("a", (0,))}


# ---------------------------------------------------------------- round robin


@pytest.mark.parametrize("jobs, expect", [
    ([job("a"), job("b"), job("c"), job("d")], ["n0", "n1", "n2", "n0"]),  # in turn, wrapping
    ([job("a", 4), job("b"), job("c")], ["n1", "n2", "n0"]),  # after the chosen node, not after n0
    ([job("a"), job("b", 4), job("c")], ["n0", "n1", "n2"]),  # skips n0... n2 for b: n1 fits
])
def test_round_robin_rotates(jobs, expect):
    core = make_core("round-robin", [("n0", 2), ("n1", 4), ("n2", 2)])
    got = where(core, *jobs)
    assert [got[s.job_id][0] for s in jobs] == expect


def test_round_robin_gang_continues_after_the_previous_worker():
    core = make_core("round-robin", [("n0", 2), ("n1", 2), ("n2", 2)])
    run(core, job("a"))
    assert nodes_of(run(core, job("g", workers=3, t=1), now=1)["g"]) == ["n1", "n2", "n0"]
    assert nodes_of(run(core, job("h", t=2), now=2)["h"]) == ["n1"]


# ---------------------------------------------------------------- best fit (FGD paper)


@pytest.mark.parametrize("spec, node", [
    (job("j", 1, cpu_milli=1 * K), "small"),  # least left over: 0.5 cpu + 0.5 gpu, over cluster maxima
    (job("j", 1, cpu_milli=30 * K), "cpu"),  # small lacks CPU
    (job("j", 3, cpu_milli=1 * K), "cpu"),  # leftover small: -, cpu: 1 GPU + 31 cores, big: 5 GPUs + 63 cores
])
def test_best_fit_least_leftover(spec, node):
    core = make_core("best-fit", [NodeSpec("big", 8, cpu_milli=64 * K), NodeSpec("small", 2, cpu_milli=8 * K),
                                  NodeSpec("cpu", 4, cpu_milli=32 * K)])
    assert where(core, spec)["j"][0] == node


def test_best_fit_share_goes_to_the_fullest_gpu_that_fits():
    core = make_core("best-fit", [NodeSpec("n", 4)])
    got = where(core, job("a", gpu_milli=300), job("b", gpu_milli=600), job("c", gpu_milli=100), job("d", gpu_milli=400))
    assert got["b"] == ("n", (0,))  # 700 free on GPU 0 beats 1000 elsewhere
    assert got["c"] == ("n", (0,))  # 100 free left on GPU 0
    assert got["d"] == ("n", (1,))


# ---------------------------------------------------------------- tetris


@pytest.mark.parametrize("spec, node", [
    (job("j", 2, cpu_milli=1 * K), "B"),  # GPU-heavy: B's free vector (7/8 GPUs, 8/64 cores) aligns
    (job("j", 1, cpu_milli=8 * K), "A"),  # CPU-heavy: A's (2/8 GPUs, 64/64 cores)
])
def test_tetris_prefers_the_aligned_node(spec, node):
    core = make_core("tetris", [NodeSpec("A", 8, gpu_model="a", cpu_milli=64 * K),
                                NodeSpec("B", 8, gpu_model="b", cpu_milli=64 * K)])
    run(core, job("fa", 6, gpu_model="a"), job("fb", 1, gpu_model="b", cpu_milli=56 * K))
    assert where(core, spec, now=1)["j"][0] == node


# ---------------------------------------------------------------- FGD


def fgd_core(nodes, popularity):
    return make_core(config(["fifo", "gang", "fgd"], fgd={"popularity": popularity}), nodes)


POP_SHARE = {"0:1:500": 1, "0:1:1000": 1}  # half-GPU and whole-GPU work, equally common
POP_BIG = {"0:1:1000": 9, "0:8:1000": 1}  # mostly 1-GPU work, some 8-GPU work


@pytest.mark.parametrize("policy, expect", [("fgd", ("y", (0,))), ("first-fit", ("x", (0,)))])
def test_fgd_completes_a_half_used_gpu_rather_than_break_a_whole_one(policy, expect):
    nodes = [NodeSpec("x", 2, gpu_model="X"), NodeSpec("y", 2, gpu_model="Y")]
    core = fgd_core(nodes, POP_SHARE) if policy == "fgd" else make_core(policy, nodes)
    run(core, job("p", gpu_milli=500, gpu_model="Y"))  # y: GPU 0 half used
    assert where(core, job("j", gpu_milli=500), now=1)["j"] == expect  # FGD: Delta -250 on y vs +250 on x


@pytest.mark.parametrize("policy, expect", [("fgd", "n2"), ("first-fit", "n8")])
def test_fgd_keeps_the_8_gpu_node_whole_for_8_gpu_work(policy, expect):
    nodes = [("n8", 8), ("n2", 2)]
    core = fgd_core(nodes, POP_BIG) if policy == "fgd" else make_core(policy, nodes)
    assert where(core, job("j", 1))["j"][0] == expect  # FGD: Delta +700 on n8, -100 on n2
    if policy == "fgd":
        assert where(core, job("big", 8), now=1)["big"][0] == "n8"


def test_fgd_cpu_exhaustion_counts_every_free_gpu():
    """A pod that would leave a node too little CPU for the workload's tasks strands its GPUs."""
    pop = {"8000:1:1000": 1}
    core = fgd_core([NodeSpec("a", 2, cpu_milli=12 * K), NodeSpec("b", 2, cpu_milli=24 * K)], pop)
    assert where(core, job("j", 1, cpu_milli=6 * K))["j"][0] == "b"  # on a: 6 cores left < 8 strand GPU 1


def test_fgd_respects_model_constraints_and_learns_online():
    core = make_core("fgd", [NodeSpec("t4", 2, gpu_model="T4"), NodeSpec("v", 2, gpu_model="V100")])
    got = where(core, job("a", 1, gpu_model="V100"), job("b", gpu_milli=500, gpu_model="T4"))
    assert got == {"a": ("v", (0,)), "b": ("t4", (0,))}
    assert core.fw.plugin("fgd").current_workload().types  # learned from the submits


def random_state(seed):
    rng = random.Random(seed)
    st = ClusterState()
    for i in range(25):
        st.add_node(NodeSpec(f"n{i}", rng.choice([1, 2, 4, 8]), gpu_model=rng.choice(["A", "B"]),
                             cpu_milli=rng.choice([8 * K, 32 * K])), 1)
    k = 0
    for n in st.nodes.values():
        for g in n.gpus:
            m = rng.choice([0, 0, 1000, 250, 500, 800])
            if m:
                st.apply(Alloc(f"p{k}", 0, n.node_id, (g.index,), m, 0, rng.choice([0, K]), 0, "guaranteed"))
                k += 1
    shapes = [(0, 0), (1, 300), (1, 600), (1, 1000), (2, 1000), (4, 1000), (1, 900)]
    types = typical({(rng.choice([0, K, 4 * K]), g, m, rng.choice(["", "A", "B", "A|B"])): rng.random() for g, m in shapes}, 1.0)
    return st, types


@pytest.mark.parametrize("seed", range(4))
def test_fgd_vectorized_measure_matches_the_definition(seed):
    st, types = random_state(seed)
    wl = TypicalWorkload(types)
    table = NodeTable()
    table.sync(st)
    ref = [node_fragment([1000 - g.milli for g in n.gpus], n.cpu_free(), n.model, types) for n in st.nodes.values()]
    assert np.allclose(fragmentation(table, wl), ref)
    for gpus, milli, cpu in [(1, 300, 0), (1, 600, K), (2, 1000, 0), (1, 1000, 4 * K), (0, 1000, K)]:
        rows = np.flatnonzero(table.fits(gpus, milli, cpu, 0, ""))
        d, best = deltas(table, wl, rows, gpus, milli, cpu)
        for r, got, j in zip(rows, d, best):
            node = table.nodes[r]
            free = [1000 - g.milli for g in node.gpus]
            before = node_fragment(free, node.cpu_free(), node.model, types)
            options = []
            for i, f in enumerate(free):
                if milli >= 1000 and gpus:
                    after = [0 if x == 1000 and i2 in [k for k, y in enumerate(free) if y == 1000][:gpus] else x
                             for i2, x in enumerate(free)]
                    options = [(node_fragment(after, node.cpu_free() - cpu, node.model, types) - before, -1)]
                    break
                if not gpus:
                    options = [(node_fragment(free, node.cpu_free() - cpu, node.model, types) - before, -1)]
                    break
                if f >= milli:
                    after = list(free)
                    after[i] -= milli
                    options.append((node_fragment(after, node.cpu_free() - cpu, node.model, types) - before, i))
            want, want_j = min(options)
            assert got == pytest.approx(want)
            assert j == want_j


# ---------------------------------------------------------------- genetic


def ga_core(nodes, seed=0, **params):
    return make_core(config(["fifo", "gang", "genetic"], genetic=params) if params else "genetic", nodes, seed=seed)


def test_ga_plans_the_best_pair_first_and_reorders_the_queue():
    """(n2, 2-GPU job) fills a machine: fitness 1.0, the best pair; the 1-GPU job, first in
    FIFO order, then goes to n8 (1/8)."""
    core = ga_core([("n8", 8), ("n2", 2)])
    core.handle_batch([ev.JobSubmitted(job("one", 1, t=0)), ev.JobSubmitted(job("two", 2, t=1))], 0.0, schedule=False)
    out = core.schedule(0.0)
    placed = starts(out)
    assert [d.placement.job_id for d in out if isinstance(d, ev.StartWorkers)] == ["two", "one"]
    assert nodes_of(placed["two"]) == ["n2"] and nodes_of(placed["one"]) == ["n8"]
    assert list(core.fw.plugin("genetic").plan) == ["two", "one"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ga_reproducible_and_never_plans_a_pair_that_does_not_fit(seed):
    def once():
        core = ga_core([NodeSpec("a", 8, cpu_milli=32 * K), NodeSpec("b", 2, cpu_milli=8 * K, gpu_model="T4"),
                        NodeSpec("c", 4, cpu_milli=16 * K), NodeSpec("d", 1)], seed=seed, generations=5)
        rng = random.Random(seed)
        specs = [job(f"j{i}", rng.choice([1, 1, 2, 4]), t=i, cpu_milli=rng.choice([0, 2 * K, 8 * K]),
                     gpu_model=rng.choice(["", "", "T4"])) for i in range(12)]
        specs += [job(f"s{i}", gpu_milli=rng.choice([250, 500, 700]), t=20 + i) for i in range(6)]
        core.handle_batch([ev.JobSubmitted(s) for s in specs], 0.0, schedule=False)
        plugin = core.fw.plugin("genetic")
        plugin.table.sync(core.state)
        search = Search(plugin.table, specs)
        out = core.schedule(0.0)
        placed = starts(out)
        index = {s.job_id: i for i, s in enumerate(specs)}
        assert plugin.plan
        for job_id, row in plugin.plan.items():  # replayed in plan order, every pair fits
            t = index[job_id]
            assert search.fitness(np.array([row]), np.array([t]))[0] >= 0
            assert search.place(row, t, 1)
            assert nodes_of(placed[job_id])[0] == plugin.table.nodes[row].node_id  # and that is where it went
        core.state.check_invariants()
        return [(d.placement.job_id, d.placement.slots) for d in out if isinstance(d, ev.StartWorkers)]
    assert once() == once()


def test_ga_fitness_is_machine_utilization_gain_or_minus_one():
    st = ClusterState()
    for spec in (NodeSpec("a", 8, cpu_milli=8 * K), NodeSpec("b", 2, gpu_model="T4"), NodeSpec("c", 0, cpu_milli=4 * K)):
        st.add_node(spec, 1)
    table = NodeTable()
    table.sync(st)
    specs = [job("w", 2), job("s", gpu_milli=500), job("cpu", 0, cpu_milli=2 * K), job("big", 4), job("v", 1, gpu_model="V100"),
             job("hungry", 1, cpu_milli=9 * K)]
    s = Search(table, specs)
    m = np.array([0, 1, 0, 1, 2, 1, 0, 2, 0])
    t = np.array([0, 0, 1, 1, 2, 3, 4, 3, 5])
    assert s.fitness(m, t).tolist() == [0.25, 1.0, 0.0625, 0.25, 0.0, -1.0, -1.0, -1.0, -1.0]
    assert s.place(1, 0, 1) and s.fitness(np.array([1]), np.array([1]))[0] == -1.0  # b is full now


def test_ga_fitness_after_prefers_the_fuller_machine():
    core = make_core("genetic-after", [("a", 2), ("b", 2)])
    run(core, job("first", gpu_milli=500))  # equal machines, empty: the tie goes to either
    used = nodes_of(core.job("first").placement)[0]
    assert where(core, job("second", gpu_milli=500), now=1)["second"][0] == used  # 0.5 after on it, 0.25 elsewhere
    plugin = core.fw.plugin("genetic")
    plugin.table.sync(core.state)
    s = Search(plugin.table, [job("x", gpu_milli=500)], after=True)
    row = plugin.table.row_of[used]
    assert s.fitness(np.array([row, 1 - row]), np.array([0, 0])).tolist() == [0.75, 0.25]
    assert s.place(row, 0, 1) and s.fitness(np.array([row]), np.array([0])).tolist() == [1.0]  # the copy counts it


def test_ga_search_without_generations_is_the_best_of_the_random_population():
    st = ClusterState()
    for i in range(6):
        st.add_node(NodeSpec(f"n{i}", 2 ** (i % 4)), 1)
    table = NodeTable()
    table.sync(st)
    s = Search(table, [job("a", 1), job("b", 2)])
    params = dict(population=100, tournament=0.2, replace=0.4, mutation_above=0.25, mutation_below=0.1)
    m, t, f = evolve(s, np.arange(2), np.random.default_rng(7), {**params, "generations": 0})
    rng = np.random.default_rng(7)
    pm = s.up_rows[rng.integers(len(s.up_rows), size=100)]
    pt = np.arange(2)[rng.integers(2, size=100)]
    fit = s.fitness(pm, pt)
    assert (m, t, f) == (int(pm[fit.argmax()]), int(pt[fit.argmax()]), float(fit.max()))
    m, t, f = evolve(s, np.arange(2), np.random.default_rng(7), {**params, "generations": 20})
    assert f == 1.0  # 20 generations find a pair that fills a machine (a 1- or 2-GPU job on n0/n1)


def test_ga_mutation_is_adaptive_and_brings_new_genes():
    p = dict(population=4, tournament=0.5, replace=0.5, mutation_above=0.25, mutation_below=0.1, generations=100)
    assert mutation_rate(np.array([0.5, 0.1, 0.3]), 0.3, p).tolist() == [0.25, 0.1, 0.1]  # above the mean: 0.25
    st = ClusterState()
    for i in range(50):
        st.add_node(NodeSpec(f"n{i}", 1 if i == 37 else 8), 1)
    table = NodeTable()
    table.sync(st)
    s = Search(table, [job("a", 1)])
    first = set(np.random.default_rng(5).integers(50, size=4).tolist())  # the initial population's nodes
    assert 37 not in first
    m, _, f = evolve(s, np.arange(1), np.random.default_rng(5), {**p, "mutation_above": 0.0, "mutation_below": 0.0})
    assert m in first and f == 0.125  # crossover alone never leaves the initial gene pool
    m, _, f = evolve(s, np.arange(1), np.random.default_rng(5), {**p, "mutation_above": 1.0, "mutation_below": 1.0})
    assert (m, f) == (37, 1.0)  # mutation reaches the 1-GPU machine the task fills


def test_ga_crossover_joins_a_machine_and_a_task_from_different_parents():
    """Without mutation the best pair (the whole GPU job on the 1-GPU machine) must be built from
    the machine gene of one solution and the task gene of another."""
    p = dict(population=20, tournament=0.2, replace=0.4, mutation_above=0.0, mutation_below=0.0, generations=50)
    st = ClusterState()
    for i in range(50):
        st.add_node(NodeSpec(f"n{i}", 1 if i == 37 else 8), 1)
    table = NodeTable()
    table.sync(st)
    s = Search(table, [job(f"s{i}", gpu_milli=900) for i in range(9)] + [job("whole", 1)])
    for seed in range(200):  # a population holding machine 37 and task 9, never together
        rng = np.random.default_rng(seed)
        pm, pt = rng.integers(50, size=20), rng.integers(10, size=20)
        if 37 in pm and 9 in pt and not ((pm == 37) & (pt == 9)).any():
            break
    m, t, f = evolve(s, np.arange(10), np.random.default_rng(seed), p)
    assert (m, t, f) == (37, 9, 1.0)


# ---------------------------------------------------------------- queue_order (framework)


class _Reverse(Plugin):
    name = "test_reverse_order"

    def queue_order(self, queue, jobs):
        return list(reversed(jobs))


def test_queue_order_point_sets_the_examination_order():
    register(_Reverse)
    try:
        core = make_core(config(["fifo", "gang", "binpack", "test_reverse_order"]), [("n", 1)])
        out = submit(core, job("a", t=0), job("b", t=1), job("c", t=2))
        assert list(starts(out)) == ["c"]
        assert core.queues() == {"default": ["a", "b"]}  # the queue keeps its own order
        assert core.blocked()["default"][0] == "b"  # b blocked first, in the reversed walk
    finally:
        REGISTRY.pop("test_reverse_order")
