"""A tentative gang placement (Volcano's Statement): worker slots are applied to the state one by
one (so the indexes see them at once and the next worker is placed against them), then committed
whole as a ``Placement`` or discarded whole, leaving the state exactly as before.

One Statement is open at a time per ``ClusterState``; callers are the framework and plugins that
plan hypothetically (preemption), always ending with ``commit`` or ``discard``.
"""

from __future__ import annotations

from cluster.spec import Placement, WorkerSlot
from cluster.state import Alloc, ClusterState, NodeState
from colocate.base.vocab import JobClass


class Statement:
    __slots__ = ("state", "pid", "klass", "allocs")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.pid = ""
        self.klass = JobClass.GUARANTEED  # set by begin()
        self.allocs: list[Alloc] = []

    def begin(self, pid: str, klass: JobClass) -> Statement:
        if self.allocs:
            raise RuntimeError(f"statement for {self.pid} still open")
        self.pid, self.klass = pid, klass
        return self

    def allocate(self, rank: int, node: NodeState, gpus: tuple[int, ...], milli: int, mem: int,
                 cpu: int, host_mem: int, now: float) -> Alloc:
        a = Alloc(self.pid, rank, node.node_id, gpus, milli, mem, cpu, host_mem, self.klass, now)
        self.state.apply(a)
        self.allocs.append(a)
        return a

    def __len__(self) -> int:
        return len(self.allocs)

    def nodes(self) -> set[str]:
        return {a.node_id for a in self.allocs}

    def discard(self) -> None:
        """Release every slot allocated so far, newest first."""
        release = self.state.release
        for a in reversed(self.allocs):
            release(a.pid, a.rank)
        self.allocs.clear()

    def commit(self, job_id: str) -> Placement:
        """Keep the slots; the placement they form (ranks in order)."""
        allocs = self.allocs
        if len(allocs) > 1 and any(allocs[i].rank > allocs[i + 1].rank for i in range(len(allocs) - 1)):
            allocs.sort(key=lambda a: a.rank)
        slots = tuple([WorkerSlot(a.rank, a.node_id, a.gpus) for a in allocs])
        self.allocs = []
        return Placement(self.pid, job_id, slots, self.klass)
