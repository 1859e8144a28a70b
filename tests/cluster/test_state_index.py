"""The state's indexes (kept by ``cluster.state``, read through ``cluster.state_queries``) against a naive
scan, under random allocations, releases, reports, node losses and returns (hypothesis): the utilization index
(only its non-empty buckets are visited) yields exactly the GPUs a scan of every up GPU finds, least utilized
first, and the same whether it was kept from the start or dropped and rebuilt; the free-count index yields the
nodes a scan finds, in count order, a node that changed last within its count; ``check_invariants`` holds after
every step."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.spec import MILLI, NodeSpec
from cluster.state import Alloc, ClusterState, util_key

NODES = [NodeSpec("a", 4, gpu_model="A"), NodeSpec("b", 2, gpu_model="B"), NodeSpec("c", 8, gpu_model="A"),
         NodeSpec("d", 1)]
KEYS = ("", "A", "B", "A|B")

ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 3), st.integers(0, 7), st.integers(1, 3),
              st.sampled_from([MILLI, MILLI, 500, 250]), st.sampled_from(["guaranteed", "opportunistic"])),
    st.tuples(st.just("release"), st.integers(0, 60)),
    st.tuples(st.just("report"), st.integers(0, 3), st.integers(0, 7), st.floats(0, 1.2)),
    st.tuples(st.just("down"), st.integers(0, 3)),
    st.tuples(st.just("up"), st.integers(0, 3)),
    st.tuples(st.just("cap"), st.integers(0, 3)),
), min_size=1, max_size=60)


def naive_util(st_: ClusterState, model: str, max_util: float) -> list:
    """Every up GPU the utilization index should yield, by its key (the order between keys)."""
    out = []
    for node in st_.nodes.values():
        if node.up and model in node.keys:
            for gpu in node.gpus:
                key = util_key(gpu, st_.opp_cap)
                top = min(100, max(0, int(max_util * 100 + 0.999999)))
                if 0 <= key < (top * 2 + 2) * 4 and gpu.utilization < max_util:
                    out.append(gpu)
    return out


def check(st_: ClusterState) -> None:
    st_.check_invariants()
    for model in KEYS:
        for th in (0.05, 0.8, 1.0):
            got = list(st_.gpus_by_util(model, th))
            keys = [util_key(g, st_.opp_cap) for g in got]
            assert keys == sorted(keys), "not least utilized first"
            assert len(got) == len(set(got))
            assert set(got) == set(naive_util(st_, model, th))
        by_free = list(st_.nodes_by_free(model, 0, 99))
        counts = [n.free for n in by_free]
        assert counts == sorted(counts)
        assert set(by_free) == {n for n in st_.nodes.values() if n.up and model in n.keys}
        assert list(st_.nodes_by_free(model, 0, 99, descending=True)) == sorted(
            by_free, key=lambda n: -n.free), "descending: counts reversed, order within a count kept"
        assert st_.free_gpus(model) == sum(n.free for n in by_free)


def run_ops(program, index_from_start: bool) -> ClusterState:
    st_ = ClusterState()
    if not index_from_start:
        st_.use_utilization_index(False)
    st_.ensure_key("A|B")
    for spec in NODES:
        st_.add_node(spec, 1)
    held: list[Alloc] = []
    n = 0
    for op in program:
        kind = op[0]
        if kind == "alloc":
            _, ni, gi, width, milli, klass = op
            node = st_.nodes[NODES[ni].node_id]
            if not node.up or not node.gpus:
                continue
            gpus = tuple(sorted({(gi + k) % len(node.gpus) for k in range(width if milli == MILLI else 1)}))
            if klass == "guaranteed" and any(node.gpus[g].milli + milli > MILLI for g in gpus):
                continue
            n += 1
            a = Alloc(f"p{n}", 0, node.node_id, gpus, milli, 0, 0, 0, klass)
            st_.apply(a)
            held.append(a)
        elif kind == "release" and held:
            a = held.pop(op[1] % len(held))
            st_.release(a.pid, a.rank)
        elif kind == "report":
            node = st_.nodes[NODES[op[1]].node_id]
            if node.gpus:
                st_.report_gpu(node.node_id, op[2] % len(node.gpus), op[3], 0)
        elif kind == "down":
            released = st_.node_down(NODES[op[1]].node_id)
            held = [a for a in held if a not in released]
        elif kind == "up":
            spec = NODES[op[1]]
            if not st_.nodes[spec.node_id].up:
                st_.add_node(spec, 2)
        elif kind == "cap":
            st_.set_opportunistic_cap(op[1])
        check(st_)
    return st_


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_indexes_match_a_naive_scan(program):
    kept = run_ops(program, index_from_start=True)
    rebuilt = run_ops(program, index_from_start=False)  # dropped, then built by the first gpus_by_util
    for model in KEYS:
        a = [(g.node.node_id, g.index) for g in kept.gpus_by_util(model, 0.8)]
        b = [(g.node.node_id, g.index) for g in rebuilt.gpus_by_util(model, 0.8)]
        assert sorted(a) == sorted(b)


def test_dropped_index_has_no_upkeep_and_is_rebuilt_on_use():
    st_ = ClusterState()
    st_.use_utilization_index(False)
    st_.add_node(NodeSpec("a", 2), 1)
    st_.apply(Alloc("p.1", 0, "a", (0,), MILLI, 0, 0, 0, "guaranteed"))
    assert all(g.ukey == -1 for g in st_.nodes["a"].gpus) and not any(st_._util_keys[""])
    assert st_.report_gpu("a", 1, 0.5, 0) is True  # the bucket it would be in changed
    assert st_.report_gpu("a", 1, 0.501, 0) is False
    st_.check_invariants()
    assert [(g.node.node_id, g.index) for g in st_.gpus_by_util("", 0.8)] == [("a", 0), ("a", 1)]
    st_.check_invariants()
