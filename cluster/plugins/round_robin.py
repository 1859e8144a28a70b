"""``round_robin`` (seed 004's Round-Robin baseline): nodes are taken in turn from a rotating
pointer kept in the plugin: a worker goes to the first node at or after the pointer (in join
order, wrapping around) that fits it, and the pointer then moves just past the node of the job's
last worker. Later workers of a gang continue after the previous worker's node. GPUs within the
node: first fit. An unreserved placement puts the pointer back. Deterministic (no randomness).
Cost per worker: one vectorized fit test over every node, O(nodes)."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.jobs import Request
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import TablePlugin, pick_first
from cluster.points import Status, register
from cluster.state import NodeState
from cluster.statement import Statement


@register
class RoundRobin(TablePlugin):
    name = "round_robin"

    def bind(self, fw) -> None:
        super().bind(fw)
        self.pointer = 0  # row the next job's search starts at
        self._before: dict[str, int] = {}  # placement id -> pointer before its reserve

    def node_order(self, req: Request) -> Iterator[NodeState]:
        ok = self.candidates(req)
        start = self.pointer
        if req.gang_nodes:
            last = next(reversed(req.gang_nodes))
            start = self.table.row_of[last.node_id] + 1
        rows = np.flatnonzero(ok)
        k = int(np.searchsorted(rows, start))
        return self.table.yield_rows(np.concatenate((rows[k:], rows[:k])))

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_first(node, req.gpus, req.milli, req.mem)

    def reserve(self, req: Request, stmt: Statement) -> Status:
        if stmt.allocs:
            self._before[stmt.pid] = self.pointer
            self.pointer = self.table.row_of[stmt.allocs[-1].node_id] + 1
        return super().reserve(req, stmt)

    def unreserve(self, req: Request, stmt: Statement) -> None:
        if stmt.pid in self._before:
            self.pointer = self._before.pop(stmt.pid)
        super().unreserve(req, stmt)

    def on_placed(self, job, placement, now: float) -> None:
        self._before.pop(placement.placement_id, None)
