"""``first_fit`` (seed 004's First-Fit baseline): a guaranteed worker goes to the lowest-indexed
node that fits it, nodes indexed in the order they first joined (a node that rejoins keeps its
place), and there to the lowest-indexed GPUs that fit (the first GPU with enough free milli for a
share). No score: the order alone decides. Cost per worker: one vectorized fit test over every
node (``NodeTable``), O(nodes)."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.jobs import Request
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import TablePlugin, pick_first
from cluster.points import register
from cluster.state import NodeState


@register
class FirstFit(TablePlugin):
    name = "first_fit"

    def node_order(self, req: Request) -> Iterator[NodeState]:
        return self.table.yield_rows(np.flatnonzero(self.candidates(req)))

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_first(node, req.gpus, req.milli, req.mem)
