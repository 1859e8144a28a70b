"""The cluster's allocation state and the indexes that keep placement cost independent of size.

Owned by one ``SchedulerCore``; only the core, the framework and a ``Statement`` change it. Pure:
no clock, no I/O. Its per-node, per-GPU and per-slot records are ``cluster.slots``'. Units as in ``cluster.spec``: milli-GPUs, bytes of GPU memory, milli-cores,
MiB of host memory.

Accounting rules:
  * a GPU holds at most 1000 guaranteed milli (so at most one whole-GPU guaranteed worker);
  * opportunistic workers never take guaranteed milli; they take GPU memory (when stated), node
    CPU and host memory, and they are counted per GPU;
  * GPU memory is allocated by both classes; a node or GPU with 0 capacity for a resource
    (not stated) is never limited by it.

Indexes (only nodes that are up are in them), each keyed by GPU model and by ``""`` (any model):
  * nodes bucketed by free whole GPUs (GPUs with no guaranteed milli), plus the total of free
    whole GPUs: ``free_gpus`` and ``worker_slots`` answer "cannot fit now" without a scan;
  * partially allocated GPUs bucketed by free milli (fractional requests), keys kept sorted;
  * GPUs bucketed by reported utilization (1% buckets), those beside a guaranteed worker first
    within a bucket, GPUs already holding ``opp_cap`` opportunistic workers left out
    (opportunistic placement), with the keys of the non-empty buckets kept sorted. Kept from the
    start by default; an owner whose policy never reads it may turn it off
    (``use_utilization_index(False)``), and ``gpus_by_util`` then builds it again on first use.
The ``nodes_by_free``/``partial_gpus``/``gpus_by_util`` iterators are live views: finish or drop
one before changing the state.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from cluster.slots import NOPP_LEVELS, UTIL_BUCKETS, Alloc, GpuState, NodeState, util_key
from cluster.spec import MILLI, NodeSpec, allowed_models
from cluster.state_check import check_invariants
from cluster.state_queries import StateQueries
from colocate.base.vocab import JobClass

__all__ = ["NOPP_LEVELS", "UTIL_BUCKETS", "Alloc", "ClusterState", "GpuState", "NodeState", "util_key"]


class ClusterState(StateQueries):
    """Nodes, GPUs, slot allocations and their indexes. Not thread-safe; one owner. The indexes' read side (free
    counts, capacity, the ordered iterators) is ``cluster.state_queries``', a base class."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.allocs: dict[str, dict[int, Alloc]] = {}  # placement id -> rank -> slot
        self._by_free: dict[str, list[dict[str, NodeState]]] = {}
        self._free_total: dict[str, int] = {}
        self._partial: dict[str, dict[int, dict[GpuState, None]]] = {}
        self._partial_keys: dict[str, list[int]] = {}
        self._util: dict[str, list[dict[GpuState, None]]] = {}
        self._util_keys: dict[str, list[int]] = {}  # keys of the non-empty utilization buckets, sorted
        self._util_on = True  # the utilization index is kept (use_utilization_index)
        self._capacity: dict[str, int] = {}  # GPUs on every known node (up or down), per model
        self._max_per_node: dict[str, int] = {}  # largest GPU count of a known node, per model
        self.version = 0  # bumped on every change that can add capacity, and when a node goes down
        self.opp_cap = 0  # opportunistic workers per GPU that take a GPU out of the utilization index
        self._constraints: dict[str, frozenset[str]] = {}  # "A|B" -> {A, B}: index keys over several models
        # the specs of every known node (up or down), as (gpus, model, gpu_mem, cpu_milli, mem_mib) -> nodes of
        # that shape: what the cluster could ever hold (cluster.capacity); ``shapes_version`` bumps on a change
        self.shapes: dict[tuple[int, str, int, int, int], int] = {}
        self.shapes_version = 0

    def ensure_key(self, constraint: str) -> None:
        """Make a multi-model constraint (``"A|B"``: a node of model A or B will do) an index key of its
        own, over every node whose model it allows, now and later; every lookup by model then works for
        it. One-model constraints and ``""`` are keys already. Idempotent."""
        if "|" not in constraint or constraint in self._constraints:
            return
        models = allowed_models(constraint)
        self._constraints[constraint] = models
        self._init_key(constraint, 0)
        for node in self.nodes.values():
            if node.model in models:
                self._add_key(node, constraint)

    def set_opportunistic_cap(self, cap: int) -> None:
        """GPUs holding ``cap`` opportunistic workers (0: no limit) leave the utilization index."""
        self.opp_cap = cap
        for node in self.nodes.values():
            for gpu in node.gpus:
                self._reindex_util(gpu)

    def use_utilization_index(self, on: bool) -> None:
        """Keep the utilization index (on, the default) or drop it and stop its upkeep on every
        allocation and report (off: for an owner whose policy never calls ``gpus_by_util``; a call
        builds it again, GPUs within a bucket then in node and GPU order). Idempotent."""
        if on == self._util_on:
            return
        self._util_on = on
        for k, buckets in self._util.items():
            for b in buckets:
                b.clear()
            self._util_keys[k].clear()
        for node in self.nodes.values():
            for gpu in node.gpus:
                gpu.ukey = -1
            if on and node.up:
                self._index_util(node, node.keys)

    # ------------------------------------------------------------------ nodes

    def add_node(self, spec: NodeSpec, epoch: int) -> NodeState:
        """Register a node (or bring back a down one, replacing its spec). Raises ValueError if
        an up node of that id exists or a down one still holds slots."""
        old = self.nodes.get(spec.node_id)
        if old is not None:
            if old.up or old.slots:
                raise ValueError(f"node {spec.node_id}: already registered and up")
            for k in old.keys:
                self._capacity[k] -= old.spec.gpus
            self._count_shape(old.spec, -1)
        self._count_shape(spec, 1)
        node = NodeState(spec, epoch)
        node.keys += tuple(c for c, models in self._constraints.items() if node.model in models)
        self.nodes[spec.node_id] = node
        for k in node.keys:
            self._capacity[k] = self._capacity.get(k, 0) + spec.gpus
            self._init_key(k, spec.gpus)
        self._index_node(node)
        self.version += 1
        return node

    def _count_shape(self, spec: NodeSpec, step: int) -> None:
        shape = (spec.gpus, spec.gpu_model, spec.gpu_mem, spec.cpu_milli, spec.mem_mib)
        n = self.shapes.get(shape, 0) + step
        if n:
            self.shapes[shape] = n
        else:
            del self.shapes[shape]
        self.shapes_version += 1

    def _init_key(self, k: str, gpus: int) -> None:
        if gpus > self._max_per_node.get(k, 0):
            self._max_per_node[k] = gpus
        buckets = self._by_free.setdefault(k, [])
        while len(buckets) <= gpus:
            buckets.append({})
        self._capacity.setdefault(k, 0)
        self._free_total.setdefault(k, 0)
        self._partial.setdefault(k, {})
        self._partial_keys.setdefault(k, [])
        self._util.setdefault(k, [{} for _ in range(UTIL_BUCKETS * 2 * NOPP_LEVELS)])
        self._util_keys.setdefault(k, [])

    def _add_key(self, node: NodeState, k: str) -> None:
        """Index an existing node under key ``k`` as well (a constraint seen after the node joined)."""
        node.keys += (k,)
        self._capacity[k] += node.spec.gpus
        self._init_key(k, node.spec.gpus)
        if node.up:
            self._index_node(node, (k,))

    def _index_node(self, node: NodeState, keys: tuple[str, ...] | None = None) -> None:
        """Put an up node into the indexes of ``keys`` (default: all of its keys)."""
        keys = node.keys if keys is None else keys
        for k in keys:
            self._by_free[k][node.free][node.node_id] = node
            self._free_total[k] += node.free
        for gpu in node.gpus:
            if 0 < gpu.milli < MILLI:
                self._partial_add(node, gpu, keys)
        if self._util_on:
            self._index_util(node, keys)

    def _index_util(self, node: NodeState, keys: tuple[str, ...]) -> None:
        for gpu in node.gpus:
            gpu.ukey = util_key(gpu, self.opp_cap)
            if gpu.ukey >= 0:
                for k in keys:
                    self._util_put(k, gpu.ukey, gpu)

    def node_down(self, node_id: str) -> list[Alloc]:
        """Mark a node down: out of every index, every slot on it released (returned)."""
        node = self.nodes[node_id]
        released = list(node.slots.values())
        for a in released:
            self.release(a.pid, a.rank)
        if node.up:
            node.up = False
            for k in node.keys:
                del self._by_free[k][node.free][node_id]
                self._free_total[k] -= node.free
            for gpu in node.gpus:
                if 0 < gpu.milli < MILLI:
                    self._partial_remove(node, gpu)
                if gpu.ukey >= 0:
                    for k in node.keys:
                        self._util_del(k, gpu.ukey, gpu)
                gpu.ukey = -1
            self.version += 1  # readers of per-node copies (the placement node table) re-read it
        return released

    def set_epoch(self, node_id: str, epoch: int) -> None:
        self.nodes[node_id].epoch = epoch

    # ------------------------------------------------------------------ index upkeep

    def _partial_add(self, node: NodeState, gpu: GpuState, keys: tuple[str, ...] | None = None) -> None:
        free = MILLI - gpu.milli
        for k in node.keys if keys is None else keys:
            b = self._partial[k].get(free)
            if b is None:
                b = self._partial[k][free] = {}
                insort(self._partial_keys[k], free)
            b[gpu] = None

    def _partial_remove(self, node: NodeState, gpu: GpuState) -> None:
        free = MILLI - gpu.milli
        for k in node.keys:
            b = self._partial[k][free]
            del b[gpu]
            if not b:
                del self._partial[k][free]
                keys = self._partial_keys[k]
                del keys[bisect_left(keys, free)]

    def _gpu_milli(self, node: NodeState, gpu: GpuState, delta: int) -> int:
        """Change a GPU's guaranteed milli (partial index kept); the change of the node's free whole GPUs
        it makes (-1, 0, 1), for the caller to apply with ``_move_free``."""
        before = gpu.milli
        after = before + delta
        up = node.up
        if up and 0 < before < MILLI:
            self._partial_remove(node, gpu)
        gpu.milli = after
        if up and 0 < after < MILLI:
            self._partial_add(node, gpu)
        if before == 0:
            return -1 if after else 0
        return 1 if not after else 0

    def _move_free(self, node: NodeState, step: int) -> None:
        """The node's free whole GPUs change by ``step``: one move between count buckets (the node ends
        last in its new bucket, as after ``abs(step)`` moves of one)."""
        if node.up:
            nid, free = node.node_id, node.free
            for k in node.keys:
                buckets = self._by_free[k]
                del buckets[free][nid]
                buckets[free + step][nid] = node
                self._free_total[k] += step
        node.free += step

    def _util_put(self, k: str, key: int, gpu: GpuState) -> None:
        b = self._util[k][key]
        if not b:
            insort(self._util_keys[k], key)
        b[gpu] = None

    def _util_del(self, k: str, key: int, gpu: GpuState) -> None:
        b = self._util[k][key]
        del b[gpu]
        if not b:
            keys = self._util_keys[k]
            del keys[bisect_left(keys, key)]

    def _reindex_util(self, gpu: GpuState) -> bool:
        """Move ``gpu`` to the bucket ``util_key`` gives it now; False when it stays. The hot path of every
        placement and release under a co-locating policy: ``util_key``, ``_util_del`` and ``_util_put`` are
        inlined (``state_check`` holds every GPU's key to ``util_key``)."""
        node = gpu.node
        if not node.up or not self._util_on:
            return False
        cap, o = self.opp_cap, gpu.opportunistic
        if cap and o >= cap:
            key = -1
        else:
            b = int(gpu.utilization * 100)
            b = 0 if b < 0 else (100 if b > 100 else b)
            key = (b * 2 + (0 if gpu.g else 1)) * NOPP_LEVELS + (o if o < NOPP_LEVELS - 1 else NOPP_LEVELS - 1)
        old = gpu.ukey
        if key == old:
            return False
        util, util_keys = self._util, self._util_keys
        for k in node.keys:
            if old >= 0:
                bucket = util[k][old]
                del bucket[gpu]
                if not bucket:
                    keys = util_keys[k]
                    del keys[bisect_left(keys, old)]
            if key >= 0:
                bucket = util[k][key]
                if not bucket:
                    insort(util_keys[k], key)
                bucket[gpu] = None
        gpu.ukey = key
        return True

    # ------------------------------------------------------------------ allocation

    def apply(self, a: Alloc) -> None:
        """Hold one worker slot. The caller has checked it fits (``fits`` for guaranteed);
        raises ValueError if the slot is already held or the node is unknown/down."""
        node = self.nodes.get(a.node_id)
        if node is None or not node.up:
            raise ValueError(f"node {a.node_id}: not up")
        per = self.allocs.setdefault(a.pid, {})
        if a.rank in per:
            raise ValueError(f"placement {a.pid} rank {a.rank}: already allocated")
        per[a.rank] = a
        node.slots[(a.pid, a.rank)] = a
        node.cpu += a.cpu
        node.host_mem += a.host_mem
        pid, mem, gpus = a.pid, a.mem, node.gpus
        if a.klass == JobClass.GUARANTEED:
            milli, util, step = a.milli, self._util_on, 0
            for i in a.gpus:
                gpu = gpus[i]
                gpu.mem += mem
                held = gpu.g
                before = gpu.milli  # _gpu_milli, inlined (the node is up)
                after = before + milli
                if 0 < before < MILLI:
                    self._partial_remove(node, gpu)
                gpu.milli = after
                if 0 < after < MILLI:
                    self._partial_add(node, gpu)
                if not before:
                    if after:
                        step -= 1
                elif not after:
                    step += 1
                if held:
                    held[pid] = held.get(pid, 0) + milli
                else:
                    held[pid] = milli
                    if util:
                        self._reindex_util(gpu)
            if step:
                self._move_free(node, step)
        else:
            for i in a.gpus:
                gpu = gpus[i]
                gpu.mem += mem
                gpu.o[pid] = gpu.o.get(pid, 0) + 1
                gpu.opportunistic += 1
                if self.opp_cap or gpu.opportunistic < NOPP_LEVELS:  # the count is part of the index key
                    self._reindex_util(gpu)

    def release(self, pid: str, rank: int) -> Alloc | None:
        """Give back one slot; None (and no change) if it is not held. Idempotent."""
        per = self.allocs.get(pid)
        a = per.pop(rank, None) if per else None
        if a is None:
            return None
        if not per:
            del self.allocs[pid]
        node = self.nodes[a.node_id]
        del node.slots[(pid, rank)]
        node.cpu -= a.cpu
        node.host_mem -= a.host_mem
        mem, gpus = a.mem, node.gpus
        if a.klass == JobClass.GUARANTEED:
            milli, util, step = a.milli, self._util_on, 0
            for i in a.gpus:
                gpu = gpus[i]
                gpu.mem -= mem
                held = gpu.g
                left = held[pid] - milli
                if left:
                    held[pid] = left
                else:
                    del held[pid]
                before = gpu.milli
                if before == MILLI and milli == MILLI:  # a whole GPU freed (_gpu_milli's outcome, inlined)
                    gpu.milli = 0
                    step += 1
                else:
                    step += self._gpu_milli(node, gpu, -milli)
                if util and not held:
                    self._reindex_util(gpu)
            if step:
                self._move_free(node, step)
        else:
            cap = self.opp_cap
            for i in a.gpus:
                gpu = gpus[i]
                gpu.mem -= mem
                left = gpu.o[pid] - 1
                if left:
                    gpu.o[pid] = left
                else:
                    del gpu.o[pid]
                gpu.opportunistic -= 1
                if cap or gpu.opportunistic < NOPP_LEVELS - 1:
                    self._reindex_util(gpu)
        self.version += 1
        return a

    def release_placement(self, pid: str, node_id: str | None = None) -> list[Alloc]:
        """Release every slot of ``pid`` (on ``node_id`` only, when given)."""
        per = self.allocs.get(pid)
        if not per:
            return []
        ranks = [r for r, a in per.items() if node_id is None or a.node_id == node_id]
        return [a for r in ranks if (a := self.release(pid, r)) is not None]

    def promotable(self, pid: str) -> bool:
        """Whether ``promote(pid)`` would succeed now: an opportunistic placement on up nodes whose
        GPUs each have its guaranteed milli free (memory needs nothing more: it already holds it)."""
        per = self.allocs.get(pid)
        if not per or any(a.klass == JobClass.GUARANTEED for a in per.values()):
            return False
        need: dict[GpuState, int] = {}
        for a in per.values():
            node = self.nodes[a.node_id]
            if not node.up:
                return False
            for i in a.gpus:
                gpu = node.gpus[i]
                need[gpu] = need.get(gpu, 0) + a.milli
        return all(gpu.milli + m <= MILLI for gpu, m in need.items())

    def promote(self, pid: str) -> bool:
        """Turn an opportunistic placement's slots into guaranteed ones in place when
        ``promotable(pid)``. Returns whether it did; no change when it cannot."""
        if not self.promotable(pid):
            return False
        for a in list(self.allocs[pid].values()):
            self.release(pid, a.rank)
            a.klass = JobClass.GUARANTEED
            self.apply(a)
        return True

    # ------------------------------------------------------------------ reports

    def report_gpu(self, node_id: str, index: int, util: float, mem_used: int) -> bool:
        """Record a GPU's last report; True when its utilization bucket changed."""
        node = self.nodes.get(node_id)
        if node is None or not (0 <= index < len(node.gpus)):
            return False
        gpu = node.gpus[index]
        if not self._util_on:
            before = util_key(gpu, self.opp_cap)
            gpu.utilization, gpu.mem_used = float(util), int(mem_used)
            return node.up and util_key(gpu, self.opp_cap) != before
        gpu.utilization, gpu.mem_used = float(util), int(mem_used)
        return self._reindex_util(gpu)

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """Recompute every counter and index from the slots; raise AssertionError on the first
        mismatch. O(cluster): for tests (``cluster.state_check``)."""
        check_invariants(self)
