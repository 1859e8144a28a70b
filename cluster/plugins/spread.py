"""``spread``: the opposite of ``binpack``: a guaranteed worker goes to the node with the most
free GPUs (gang workers land on different nodes while whole nodes are free); a fractional share
to the emptiest GPU."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.fitting import pick_guaranteed
from cluster.jobs import Request
from cluster.plugins.binpack import BIG, WEIGHT
from cluster.points import Plugin, register
from cluster.spec import MILLI
from cluster.state import NodeState
from colocate.base.vocab import JobClass


@register
class Spread(Plugin):
    name = "spread"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {"weight": WEIGHT}

    def node_order(self, req: Request) -> Iterator[NodeState]:
        state = self.fw.state
        m = req.model
        if req.gpus == 0:
            yield from state.nodes_by_free(m, 0, BIG, descending=True)
        elif req.whole:
            yield from state.nodes_by_free(m, req.gpus, BIG, descending=True)
        else:
            seen = req.seen
            seen.clear()
            for node in state.nodes_by_free(m, 1, BIG, descending=True):
                seen.add(node)
                yield node
            for gpu in state.partial_gpus(m, req.milli, descending=True):
                node = gpu.node
                if node not in seen:
                    seen.add(node)
                    yield node

    def order_ranked(self, req: Request) -> bool:
        """Yes for whole GPUs (or none): the candidates come by free GPUs, most first, which is the score (ties
        keep their order in both). A fractional share's nodes are ranked."""
        return req.whole or req.gpus == 0

    def score(self, req: Request, node: NodeState) -> float:
        if req.whole or req.gpus == 0:
            return node.free
        return max((MILLI - g.milli for g in node.gpus), default=0) / 10

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_guaranteed(node, req.gpus, req.milli, req.mem, best_fit=False)
