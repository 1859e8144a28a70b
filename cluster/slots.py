"""The records ``ClusterState`` keeps: per node (``NodeState``), per GPU (``GpuState``) and per worker slot
held (``Alloc``), and the GPU's key in the utilization index (``util_key``).

Changed only by ``cluster.state.ClusterState`` (through a ``Statement``); everyone else reads them. Units as in
``cluster.spec``: milli-GPUs, bytes of GPU memory, milli-cores, MiB of host memory. Pure: no clock, no I/O.
"""

from __future__ import annotations

from cluster.spec import MILLI, NodeSpec
from colocate.base.vocab import JobClass

UTIL_BUCKETS = 101  # 0..100 percent
NOPP_LEVELS = 4  # opportunistic workers on a GPU, as a tie-break within a utilization bucket (3 = 3 or more)


class Alloc:
    """One worker slot held on one node: what ``release`` gives back."""

    __slots__ = ("pid", "rank", "node_id", "gpus", "milli", "mem", "cpu", "host_mem", "klass", "start")

    def __init__(self, pid: str, rank: int, node_id: str, gpus: tuple[int, ...], milli: int, mem: int,
                 cpu: int, host_mem: int, klass: str, start: float = 0.0) -> None:
        self.pid, self.rank, self.node_id, self.gpus = pid, rank, node_id, gpus
        self.milli, self.mem, self.cpu, self.host_mem, self.klass = milli, mem, cpu, host_mem, klass
        self.start = start  # when the slot was allocated (scheduler clock): victims' age

    @property
    def guaranteed(self) -> bool:
        return self.klass == JobClass.GUARANTEED


class GpuState:
    """One GPU: guaranteed milli and memory allocated, who sits there, last report."""

    __slots__ = ("node", "index", "mem_total", "milli", "mem", "g", "o", "opportunistic", "utilization", "mem_used",
                 "ukey")

    def __init__(self, node: NodeState, index: int, mem_total: int) -> None:
        self.node, self.index, self.mem_total = node, index, mem_total
        self.milli = 0  # guaranteed milli allocated, 0..1000
        self.mem = 0  # bytes allocated (guaranteed + opportunistic)
        self.g: dict[str, int] = {}  # guaranteed placement id -> milli
        self.o: dict[str, int] = {}  # opportunistic placement id -> workers of it here
        # read as a colocate.base.pick.Room too: plain attributes, not properties, on the opportunistic pick's hot path
        self.opportunistic = 0  # opportunistic workers here
        self.utilization = 0.0  # reported busy fraction over the last 10 s (0 until reported)
        self.mem_used = 0  # reported bytes in use
        self.ukey = -1  # key in the utilization index, -1 when not indexed

    @property
    def free_milli(self) -> int:
        return MILLI - self.milli

    def mem_free(self) -> float:
        """Allocatable bytes (inf when the node states no GPU memory)."""
        return float("inf") if not self.mem_total else self.mem_total - self.mem

    def mem_free_reported(self) -> float:
        """Free bytes by the larger of allocation and the last report (opportunistic fit)."""
        return float("inf") if not self.mem_total else self.mem_total - max(self.mem, self.mem_used)

    # the rest of the GPU as the opportunistic pick sees it (colocate.base.pick.Room)
    @property
    def mem_room(self) -> float:
        return self.mem_free_reported()

    @property
    def beside_guaranteed(self) -> bool:
        return bool(self.g)



class NodeState:
    __slots__ = ("spec", "node_id", "model", "up", "epoch", "gpus", "free", "cpu", "host_mem", "slots", "keys")

    def __init__(self, spec: NodeSpec, epoch: int) -> None:
        self.spec, self.node_id, self.model = spec, spec.node_id, spec.gpu_model
        self.up, self.epoch = True, epoch
        self.gpus = [GpuState(self, i, spec.gpu_mem) for i in range(spec.gpus)]
        self.free = spec.gpus  # GPUs with no guaranteed milli
        self.cpu = 0  # milli-cores allocated
        self.host_mem = 0  # MiB allocated
        self.slots: dict[tuple[str, int], Alloc] = {}
        self.keys: tuple[str, ...] = ("",) if not spec.gpu_model else ("", spec.gpu_model)

    def cpu_free(self) -> float:
        return float("inf") if not self.spec.cpu_milli else self.spec.cpu_milli - self.cpu

    def host_mem_free(self) -> float:
        return float("inf") if not self.spec.mem_mib else self.spec.mem_mib - self.host_mem


def util_key(gpu: GpuState, cap: int = 0) -> int:
    """The GPU's bucket in the utilization index; -1 (not indexed) when it holds ``cap``
    opportunistic workers already."""
    if cap and gpu.opportunistic >= cap:
        return -1
    b = int(gpu.utilization * 100)
    b = 0 if b < 0 else (100 if b > 100 else b)
    # reports lag placements: at equal utilization, fewer opportunistic workers first
    return (b * 2 + (0 if gpu.g else 1)) * NOPP_LEVELS + min(gpu.opportunistic, NOPP_LEVELS - 1)
