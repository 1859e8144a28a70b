"""Node selection for one worker: the framework's filter, score and GPU-pick points over the candidates of a
node order (``Selector``), and the Kubernetes-style normalised ranking of the feasible nodes (``rank``).

Cost per worker is independent of cluster size: filtering stops after ``feasible_nodes`` feasible nodes or
``max_nodes_examined`` candidates, and where the node order's plugin is the only scorer and says its order is
already the ranking (``order_ranked``), the first feasible node the pick accepts wins without ranking."""

from __future__ import annotations

import math
from collections.abc import Callable

from cluster.jobs import Request
from cluster.points import MAX_NODE_SCORE, SUCCESS, Code, PluginError, Status, unschedulable
from cluster.state import NodeState


def _scores(score, req: Request, nodes: list[NodeState]) -> tuple[list[float], float, float]:
    """One score plugin's raw scores of ``nodes``, their least and greatest; a PluginError unless finite."""
    raw = [score(req, node) for node in nodes]
    lo, hi = min(raw), max(raw)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise PluginError(score.__self__.name, f"score {hi if math.isfinite(lo) else lo!r} is not a finite number")
    return raw, lo, hi


class Selector:
    """Chooses a node and GPUs for one worker of one placement class: candidates from the class's node order,
    filtered until ``feasible_nodes`` pass (or ``max_nodes_examined`` candidates were seen), best score first,
    ties in candidate order; then the class's GPU pick. The framework builds one per class that has a node order,
    from its plugins' bound methods (fixed once the framework is made)."""

    __slots__ = ("filters", "scorers", "pick", "want", "limit", "ranked")

    def __init__(self, filters: list[Callable], scorers: list[tuple[Callable, float]], pick: Callable,
                 feasible_nodes: int, max_examined: int, ranked: Callable | None) -> None:
        self.filters, self.scorers, self.pick = filters, scorers, pick
        self.want = feasible_nodes if scorers else 1  # with no scorer the first feasible node wins
        self.limit = max_examined
        self.ranked = ranked  # the order plugin's ``order_ranked`` where it is the only scorer, else None

    def select(self, req: Request, order) -> tuple[NodeState, tuple[int, ...]] | Status:
        """Choose a node and GPUs for worker ``req.rank``: candidates from ``order`` filtered
        until ``feasible_nodes`` pass, best score first; ties keep the candidate order."""
        filters, scorers, pick, want, limit = self.filters, self.scorers, self.pick, self.want, self.limit
        feasible: list[NodeState] = []
        last: Status | None = None
        n = 0
        ranked = self.ranked
        if ranked is not None and ranked(req):
            # the same choice as below without ranking: the pick tries the feasible nodes in candidate order
            for node in order(req):
                n += 1
                for f in filters:
                    st = f(req, node)
                    if st is not SUCCESS and st.code != Code.SUCCESS:
                        last = st
                        break
                else:
                    gpus = pick(req, node)
                    if gpus is not None:
                        return node, gpus
                    want -= 1
                    if not want:
                        break
                if limit and n >= limit:
                    break
            return no_node(req, n, last)
        for node in order(req):
            n += 1
            for f in filters:
                st = f(req, node)
                if st is not SUCCESS and st.code != Code.SUCCESS:
                    last = st
                    break
            else:
                feasible.append(node)
                if len(feasible) >= want:
                    break
            if limit and n >= limit:
                break
        if len(feasible) > 1 and scorers:
            feasible = rank(req, feasible, scorers)
        for node in feasible:
            gpus = pick(req, node)
            if gpus is not None:
                return node, gpus
        return no_node(req, n, last)


def no_node(req: Request, n: int, last: Status | None) -> Status:
    """Why worker ``req.rank`` found no node after ``n`` candidates (``last``: the last filter's refusal)."""
    why = f" (last: {last})" if last is not None else ""
    shape = f"{req.gpus} GPU" + ("s" if req.gpus != 1 else "") + (f" x {req.milli} milli" if req.milli < 1000 else "")
    return unschedulable("framework", f"worker {req.rank} ({shape}): no feasible node among {n} examined{why}")


def rank(req: Request, feasible: list[NodeState], scorers: list) -> list[NodeState]:
    """``feasible`` best first by the weighted sum of the scorers' normalized scores: each
    plugin's raw scores over these nodes are mapped onto 0..MAX_NODE_SCORE (its lowest to 0,
    its highest to MAX_NODE_SCORE, all equal to MAX_NODE_SCORE), as Kubernetes' NormalizeScore
    does, then weighted. Ties keep the candidate order. A score that is not a finite number is
    the plugin's error."""
    if len(scorers) == 1:  # one plugin: normalizing keeps its order, so sort by its raw scores
        f, w = scorers[0]
        raw, lo, hi = _scores(f, req, feasible)
        if not w or lo == hi:
            return feasible
        order = sorted(range(len(feasible)), key=raw.__getitem__, reverse=True)  # stable: ties keep order
        return [feasible[i] for i in order]
    total = [0.0] * len(feasible)
    for f, w in scorers:
        raw, lo, hi = _scores(f, req, feasible)
        if not w:
            continue
        if hi == lo:
            for i in range(len(total)):
                total[i] += w * MAX_NODE_SCORE
        else:
            k = w * MAX_NODE_SCORE / (hi - lo)
            for i, r in enumerate(raw):
                total[i] += (r - lo) * k
    order = sorted(range(len(feasible)), key=total.__getitem__, reverse=True)  # stable: ties keep order
    return [feasible[i] for i in order]
