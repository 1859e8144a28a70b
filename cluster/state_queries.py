"""The read side of the cluster state's indexes (``cluster.state``'s docstring says what each holds): free whole GPUs,
capacity, the largest partial free share and node size (each O(1)), worker slots by free counts alone, and the
ordered iterators the placement plugins walk: nodes by free GPUs, partially allocated GPUs by free milli (best fit
first), GPUs by reported utilization (least first). The iterators are live views of the indexes: finish or drop
one before changing the state. Units as in ``cluster.spec``.

``StateQueries`` is a part of ``cluster.state.ClusterState`` (its base class), kept apart by what it owns: it reads
the indexes that ``ClusterState`` keeps (declared below for the type checker) and changes none, except that
``gpus_by_util`` turns the utilization index back on when its owner had turned it off.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cluster.slots import NOPP_LEVELS, UTIL_BUCKETS, GpuState, NodeState


class StateQueries:
    if TYPE_CHECKING:  # the state's, which this part reads
        nodes: dict[str, NodeState]
        _by_free: dict[str, list[dict[str, NodeState]]]
        _free_total: dict[str, int]
        _partial: dict[str, dict[int, dict[GpuState, None]]]
        _partial_keys: dict[str, list[int]]
        _util: dict[str, list[dict[GpuState, None]]]
        _util_keys: dict[str, list[int]]
        _util_on: bool
        _capacity: dict[str, int]
        _max_per_node: dict[str, int]

        def use_utilization_index(self, on: bool) -> None: ...

    def free_gpus(self, model: str = "") -> int:
        """Free whole GPUs on up nodes of ``model`` ("" any). O(1)."""
        return self._free_total.get(model, 0)

    def capacity(self, model: str = "") -> int:
        """GPUs on every known node (up or down) of ``model``. O(1)."""
        return self._capacity.get(model, 0)

    def max_partial_free(self, model: str = "") -> int:
        """The most free milli on a partially allocated up GPU of ``model`` (0: none). O(1)."""
        keys = self._partial_keys.get(model)
        return keys[-1] if keys else 0

    def max_gpus_per_node(self, model: str = "") -> int:
        return self._max_per_node.get(model, 0)

    def worker_slots(self, model: str, gpus: int, limit: int) -> int:
        """How many workers of ``gpus`` whole GPUs fit now by free counts alone (at most
        ``limit``; O(largest node))."""
        buckets = self._by_free.get(model)
        if not buckets:
            return 0
        n = 0
        for free in range(len(buckets) - 1, gpus - 1, -1):
            b = buckets[free]
            if b:
                n += len(b) * (free // gpus)
                if n >= limit:
                    return n
        return n

    def nodes_by_free(self, model: str, lo: int, hi: int, descending: bool = False) -> Iterator[NodeState]:
        """Up nodes with ``lo <= free whole GPUs <= hi``, by free count (ascending unless
        ``descending``), within a count in the order they entered it."""
        buckets = self._by_free.get(model)
        if not buckets:
            return
        hi = min(hi, len(buckets) - 1)
        rng = range(hi, lo - 1, -1) if descending else range(max(lo, 0), hi + 1)
        for free in rng:
            b = buckets[free]
            if b:
                yield from b.values()

    def partial_gpus(self, model: str, min_free: int, descending: bool = False) -> Iterator[GpuState]:
        """Up GPUs with some guaranteed milli allocated and at least ``min_free`` milli free,
        best fit first (least free) unless ``descending``."""
        keys = self._partial_keys.get(model)
        if not keys:
            return
        part = self._partial[model]
        start = bisect_left(keys, min_free)
        sel = keys[start:]
        if descending:
            sel.reverse()
        for free in sel:
            b = part.get(free)
            if b:
                yield from b

    def gpus_by_util(self, model: str, max_util: float) -> Iterator[GpuState]:
        """Up GPUs whose reported utilization is below ``max_util``, least utilized first;
        within a 1% bucket, GPUs beside a guaranteed worker first, then those holding fewer
        opportunistic workers."""
        if not self._util_on:
            self.use_utilization_index(True)
        buckets = self._util.get(model)
        if not buckets:
            return
        top = min(UTIL_BUCKETS - 1, max(0, int(max_util * 100 + 0.999999)))
        end = (top * 2 + 2) * NOPP_LEVELS
        for key in self._util_keys[model]:  # the non-empty buckets only
            if key >= end:
                return
            for gpu in buckets[key]:
                if gpu.utilization < max_util:
                    yield gpu

    def up_nodes(self) -> Iterator[NodeState]:
        return (n for n in self.nodes.values() if n.up)
