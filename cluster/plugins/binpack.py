"""``binpack`` (seed 000): a guaranteed worker goes to the node whose free GPUs are closest to
the request, so whole nodes stay free for large jobs. For a gang the request is what its
unplaced workers still need: a node already holding workers of the gang first, then the node
that holds them all with the least to spare, else the node with the most free GPUs below that
(few nodes per gang). A fractional share goes to
the partially used GPU with the least free milli that fits (best fit), then to the fullest node
with a free GPU. CPU-only workers go to the nodes with the fewest free GPUs."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.fitting import pick_guaranteed
from cluster.jobs import Request
from cluster.params import Param
from cluster.points import Plugin, register
from cluster.spec import MILLI
from cluster.state import NodeState
from colocate.base.vocab import JobClass

BIG = 1 << 30
WEIGHT = Param(1, "int", lambda v: v >= 0, "score weight >= 0")


def closeness(free: int, target: int) -> int:
    """Score of a node with ``free`` GPUs for ``target``: a node that holds all scores above any
    that does not; then the less to spare (or the more it holds) the better."""
    return 200 - (free - target) if free >= target else 100 - (target - free)


@register
class BinPack(Plugin):
    name = "binpack"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {"weight": WEIGHT}

    def node_order(self, req: Request) -> Iterator[NodeState]:
        state = self.fw.state
        m = req.model
        if req.gpus == 0:
            yield from state.nodes_by_free(m, 0, BIG)
        elif req.whole:
            for node in req.gang_nodes:  # the gang's own nodes first: few nodes per gang
                if node.free >= req.gpus:
                    yield node
            target = req.remaining * req.gpus
            yield from state.nodes_by_free(m, target, BIG)
            if target > req.gpus:
                yield from state.nodes_by_free(m, req.gpus, target - 1, descending=True)
        else:
            seen = req.seen
            seen.clear()
            for gpu in state.partial_gpus(m, req.milli):
                node = gpu.node
                if node not in seen:
                    seen.add(node)
                    yield node
            for node in state.nodes_by_free(m, 1, BIG):
                if node not in seen:
                    yield node

    def order_ranked(self, req: Request) -> bool:
        """Yes, but for a gang with a node that could take this worker (its nodes come first, in placement
        order, and again further on, with the gang's bonus), and where a node could have over 100 GPUs
        more than the request (it would score below a node short of it)."""
        if req.gpus and req.whole:
            need = req.gpus
            for node in req.gang_nodes:
                if node.free >= need:
                    return False
            return self.fw.state.max_gpus_per_node(req.model) - req.remaining * need <= 100
        return True

    def score(self, req: Request, node: NodeState) -> float:
        if req.gpus == 0:
            return 100 - node.free
        if req.whole:
            return closeness(node.free, req.remaining * req.gpus) + (1000 if node in req.gang_nodes else 0)
        least = min((MILLI - g.milli for g in node.gpus if MILLI - g.milli >= req.milli), default=MILLI)
        return 100 - least / 10

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_guaranteed(node, req.gpus, req.milli, req.mem, best_fit=True)
