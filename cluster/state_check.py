"""``check_invariants``: every counter and index of a ``ClusterState`` recomputed from its slots, for tests and
benchmarks (O(cluster)). Reads private fields of the state it checks: it is that module's, kept apart."""

from __future__ import annotations

from typing import Any

from cluster.slots import GpuState, util_key
from cluster.spec import MILLI


def check_invariants(state: Any) -> None:
    """Recompute every counter and index of ``state`` (a ``cluster.state.ClusterState``, which sits above this
    module) from its slots; raise AssertionError on the first mismatch. O(cluster): for tests."""
    cpu: dict[str, int] = {}
    hmem: dict[str, int] = {}
    milli: dict[tuple[str, int], int] = {}
    mem: dict[tuple[str, int], int] = {}
    opp: dict[tuple[str, int], int] = {}
    whole_g: dict[tuple[str, int], int] = {}
    for pid, per in state.allocs.items():
        assert per, f"{pid}: empty allocation record"
        for rank, a in per.items():
            assert a.pid == pid and a.rank == rank
            node = state.nodes[a.node_id]
            assert node.up, f"{pid}/{rank}: slot on down node {a.node_id}"
            assert node.slots.get((pid, rank)) is a
            assert len(set(a.gpus)) == len(a.gpus), f"{pid}/{rank}: a GPU twice"
            cpu[a.node_id] = cpu.get(a.node_id, 0) + a.cpu
            hmem[a.node_id] = hmem.get(a.node_id, 0) + a.host_mem
            for i in a.gpus:
                assert 0 <= i < len(node.gpus), f"{pid}/{rank}: no GPU {i} on {a.node_id}"
                key = (a.node_id, i)
                mem[key] = mem.get(key, 0) + a.mem
                if a.guaranteed:
                    milli[key] = milli.get(key, 0) + a.milli
                    if a.milli == MILLI:
                        whole_g[key] = whole_g.get(key, 0) + 1
                else:
                    opp[key] = opp.get(key, 0) + 1
    in_util: dict[str, dict[GpuState, int]] = {}  # per key: GPU -> utilization buckets holding it
    for k, buckets in state._util.items():
        seen = in_util[k] = {}
        for bucket in buckets:
            for gpu in bucket:
                seen[gpu] = seen.get(gpu, 0) + 1
    for node in state.nodes.values():
        nid, spec = node.node_id, node.spec
        n_slots = sum(1 for (p, r) in node.slots if state.allocs.get(p, {}).get(r) is not None)
        assert n_slots == len(node.slots), f"{nid}: stale slot records"
        assert node.cpu == cpu.get(nid, 0), f"{nid}: cpu {node.cpu} != {cpu.get(nid, 0)}"
        assert node.host_mem == hmem.get(nid, 0), f"{nid}: host mem mismatch"
        assert not spec.cpu_milli or node.cpu <= spec.cpu_milli, f"{nid}: cpu over capacity"
        assert not spec.mem_mib or node.host_mem <= spec.mem_mib, f"{nid}: host memory over capacity"
        free = 0
        for gpu in node.gpus:
            key = (nid, gpu.index)
            assert gpu.milli == milli.get(key, 0), f"{nid}/{gpu.index}: milli {gpu.milli} != {milli.get(key, 0)}"
            assert 0 <= gpu.milli <= MILLI, f"{nid}/{gpu.index}: {gpu.milli} guaranteed milli > 1000"
            assert whole_g.get(key, 0) <= 1, f"{nid}/{gpu.index}: two whole-GPU guaranteed workers"
            assert gpu.milli == sum(gpu.g.values())
            assert gpu.mem == mem.get(key, 0), f"{nid}/{gpu.index}: memory mismatch"
            assert not gpu.mem_total or gpu.mem <= gpu.mem_total, f"{nid}/{gpu.index}: memory over capacity"
            assert sum(gpu.o.values()) == opp.get(key, 0) == gpu.opportunistic, f"{nid}/{gpu.index}: opportunistic count"
            free += gpu.milli == 0
            if node.up:
                want_key = util_key(gpu, state.opp_cap) if state._util_on else -1
                assert gpu.ukey == want_key, f"{nid}/{gpu.index}: stale utilization index"
                for k in node.keys:
                    assert gpu.ukey < 0 or gpu in state._util[k][gpu.ukey]
                    assert in_util[k].get(gpu, 0) == (gpu.ukey >= 0), f"{nid}/{gpu.index}: utilization index"
                    in_part = gpu in state._partial[k].get(MILLI - gpu.milli, {})
                    assert in_part == (0 < gpu.milli < MILLI), f"{nid}/{gpu.index}: partial index"
        assert node.free == free, f"{nid}: free {node.free} != {free}"
        for k in node.keys:
            for count, b in enumerate(state._by_free[k]):
                assert (nid in b) == (node.up and count == free), f"{nid}: free-count index"
    for k, total in state._free_total.items():
        want = sum(n.free for n in state.nodes.values() if n.up and k in n.keys)
        assert total == want, f"model {k!r}: free total {total} != {want}"
        assert state._partial_keys[k] == sorted(state._partial[k]), f"model {k!r}: partial keys"
        assert state._util_keys[k] == [i for i, b in enumerate(state._util[k]) if b], f"model {k!r}: util keys"
        assert all(state._partial[k].values())
