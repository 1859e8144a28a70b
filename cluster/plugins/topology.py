"""``topology``: network-aware gang placement. A guaranteed gang of whole-GPU workers goes where it
spans, in this order, the fewest nodes, then the fewest switches, then the fewest racks (the labels
nodes carry: ``NodeSpec.switch``/``rack``); among equal spreads, where it leaves the least free
capacity in the switch and the node it uses (bin-packing, so whole switches stay free for large
gangs). A gang whose best placement now is looser than the tightest it could ever get on this
cluster's nodes waits up to ``wait_s`` seconds (the core's clock, from the first attempt that found
only a looser placement) for a tighter one, then takes the looser one; while it waits, later jobs of
its queue may pass, but not onto a node with room for one of its workers. Single workers, fractional
shares and CPU-only workers are placed as ``binpack`` places them.

Why the waiting gang keeps its nodes from the jobs behind it: else the first node to free up beside
one of them goes to a job behind it, and on a loaded cluster waiting never paid off. It keeps them
until it is placed or its wait is over. The end of a wait is the plugin's ``wake_at``: the simulator
ticks then, so a wait ends on time even when nothing else happens (the live scheduler ticks every
0.1 s anyway).

The plan is made once per attempt, at rank 0, from the free whole GPUs of the nodes that are up and
allow the job's GPU model (a worker of G GPUs fits ``free // G`` times on a node), by comparing
candidate plans: the best-fitting single node; per switch, per rack and over the whole cluster,
nodes filled greedily (fuller switches first within a rack or the cluster, nodes with more room
first, the last one best-fitting). Cost per gang attempt: O(nodes) plus sorting. Nodes without
labels count as one switch and one rack each (their spread is measured by nodes alone).
"""

from __future__ import annotations

from collections.abc import Iterator

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.plugins.binpack import BinPack
from cluster.points import SUCCESS, Plugin, Status, held, register, unschedulable
from cluster.spec import Placement
from cluster.state import NodeState
from cluster.statement import Statement
from colocate.base.vocab import JobClass

Spread = tuple[int, int, int]  # nodes, switches, racks a placement spans


def labels(node: NodeState) -> tuple[str, str]:
    """(switch, rack) of ``node``; an unlabelled node is a switch and a rack of its own."""
    s = node.spec
    return (s.switch or f"\0{node.node_id}", s.rack or (f"\0{s.switch}" if s.switch else f"\0{node.node_id}"))


def spread_of(nodes: list[NodeState]) -> Spread:
    """Distinct nodes, switches and racks among ``nodes``."""
    ls = [labels(n) for n in dict.fromkeys(nodes)]
    return (len(ls), len({s for s, _ in ls}), len({r for _, r in ls}))


def _fill(cands: list[tuple[NodeState, int]], need: int) -> list[tuple[NodeState, int]] | None:
    """Workers per node to place ``need`` workers on ``cands`` ((node, room), in preference order): take
    nodes in order while the rest does not fit on one, then the fitting node with the least room."""
    out: list[tuple[NodeState, int]] = []
    left = need
    for i, (node, room) in enumerate(cands):
        if room <= 0:
            continue
        if room >= left:
            best = min((c for c in cands[i:] if c[1] >= left), key=lambda c: c[1])
            out.append((best[0], left))
            return out
        out.append((node, room))
        left -= room
    return None


def _grouped(cands: list[tuple[NodeState, int]], level: int) -> list[tuple[NodeState, int]]:
    """``cands`` grouped by switch (level 0) or rack (1), groups with more room first, nodes with more
    room first inside a group (so a plan fills few groups, and few nodes in each)."""
    groups: dict[str, list[tuple[NodeState, int]]] = {}
    for c in cands:
        groups.setdefault(labels(c[0])[level], []).append(c)
    out: list[tuple[NodeState, int]] = []
    for g in sorted(groups.values(), key=lambda g: -sum(r for _, r in g)):
        out.extend(sorted(g, key=lambda c: -c[1]))
    return out


def plan(cands: list[tuple[NodeState, int]], need: int) -> list[tuple[NodeState, int]] | None:
    """The (node, workers) list with the least (nodes, switches, racks, spare room in the nodes and
    switches used) among the candidate plans (module docstring); None when ``need`` workers do not fit.
    ``cands`` is (node, workers it can still hold), in a stable order (ties keep it)."""
    cands = [c for c in cands if c[1] > 0]
    if sum(r for _, r in cands) < need:
        return None
    single = [c for c in cands if c[1] >= need]
    if single:
        node, _ = min(single, key=lambda c: c[1])
        return [(node, need)]
    by_switch: dict[str, list[tuple[NodeState, int]]] = {}
    by_rack: dict[str, list[tuple[NodeState, int]]] = {}
    for c in cands:
        s, r = labels(c[0])
        by_switch.setdefault(s, []).append(c)
        by_rack.setdefault(r, []).append(c)
    options: list[list[tuple[NodeState, int]]] = []
    for group in by_switch.values():
        if sum(r for _, r in group) >= need:
            got = _fill(sorted(group, key=lambda c: -c[1]), need)
            if got:
                options.append(got)
    for group in by_rack.values():
        if len({labels(n)[0] for n, _ in group}) > 1 and sum(r for _, r in group) >= need:
            got = _fill(_grouped(group, 0), need)
            if got:
                options.append(got)
    for order in (_grouped(_grouped(cands, 0), 1), sorted(cands, key=lambda c: -c[1])):
        got = _fill(order, need)
        if got:
            options.append(got)
    if not options:
        return None

    def cost(p: list[tuple[NodeState, int]]) -> tuple:
        nodes = [n for n, _ in p]
        room = {n: r for n, r in cands}
        switches = {labels(n)[0] for n in nodes}
        spare_sw = sum(r for n, r in cands if labels(n)[0] in switches) - need
        return (*spread_of(nodes), spare_sw, sum(room[n] for n in nodes) - need)

    return min(options, key=cost)


def tightest(per_node: list[tuple[NodeState, int]], need: int) -> Spread | None:
    """The spread of ``need`` workers placed by ``plan`` on an empty cluster (``per_node``: each node's
    whole capacity in workers): what waiting could at best achieve. None if they never fit."""
    p = plan(per_node, need)
    return spread_of([n for n, _ in p]) if p else None


@register
class Topology(Plugin):
    name = "topology"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {
        "wait_s": Param(0.0, "float", lambda v: v >= 0, "seconds >= 0 a gang may wait for a tighter placement "
                        "(0: take the best placement there is now)"),
        "depth": Param(100, "int", lambda v: v >= 1, "an integer >= 1: jobs behind a waiting gang examined per cycle "
                       "(as backfill's depth)"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._binpack = BinPack({"weight": 1})
        self._ranks: list[NodeState] = []  # the current attempt's planned node per rank
        self._pid = ""
        self._loose_since: dict[str, float] = {}  # job id -> when it first could be placed only loosely
        # job id of a gang waiting for a tighter placement -> (its job, GPUs per worker, GPU model, end of its
        # wait): nodes with room for one of its workers are kept from the jobs behind it in its queue
        self._waiting: dict[str, tuple[Job, int, str, float]] = {}
        self._kept = unschedulable(self.name, "kept for a gang ahead that waits for a tighter placement")

    def bind(self, fw) -> None:
        super().bind(fw)
        self._binpack.bind(fw)

    def _gang(self, req: Request) -> bool:
        return req.whole and req.gpus > 0 and req.workers > 1

    def wake_at(self) -> float | None:
        """When the first wait ends: the next cycle then places that gang loosely (or finds it blocked)."""
        return min((until for _, _, _, until in self._waiting.values()), default=None)

    def _candidates(self, req: Request, whole: bool) -> list[tuple[NodeState, int]]:
        """(node, workers of ``req`` it can hold): on its whole GPUs, or on its free GPUs less the nodes kept
        from ``req`` for a waiting gang ahead of it."""
        g = req.gpus
        if whole:
            return [(n, len(n.gpus) // g) for n in self.fw.state.nodes.values() if n.up and req.model in n.keys]
        ahead = self._ahead(req) if self._waiting else ()
        return [(n, 0 if ahead and self._keeps(ahead, n) else n.free // g) for n in self.fw.state.nodes.values()
                if n.up and req.model in n.keys]

    def _ahead(self, req: Request) -> list[tuple[int, str]]:
        """(GPUs per worker, GPU model) of each gang ahead of ``req``'s job in its queue that is still waiting."""
        job, now = req.job, req.now
        return [(gpus, model) for g, gpus, model, until in self._waiting.values()
                if now < until and g is not job and g.queue == job.queue and g.key < job.key]

    @staticmethod
    def _keeps(ahead: list[tuple[int, str]], node: NodeState) -> bool:
        """Whether ``node`` has room for a worker of one of the waiting gangs ``ahead``."""
        return any(node.free >= gpus and model in node.keys for gpus, model in ahead)

    def cache_key(self, job: Job) -> tuple:
        """The waiting gangs ahead of ``job``: what else ``filter`` reads."""
        waiting = self._waiting
        if not waiting:
            return ()
        q, k = job.queue, job.key
        return tuple([jid for jid, w in waiting.items() if w[0].queue == q and w[0].key < k])

    def filter(self, req: Request, node: NodeState) -> Status:
        if self._waiting and req.gpus:
            ahead = self._ahead(req)
            if ahead and self._keeps(ahead, node):
                return self._kept
        return SUCCESS

    def node_order(self, req: Request) -> Iterator[NodeState]:
        if not self._gang(req):
            yield from self._binpack.node_order(req)
            return
        if req.rank == 0 or self._pid != req.pid:
            self._pid = req.pid
            p = plan(self._candidates(req, False), req.workers) or []
            self._ranks = [n for n, k in p for _ in range(k)]
        if req.rank < len(self._ranks):
            yield self._ranks[req.rank]
        yield from self._binpack.node_order(req)  # the planned node was filtered out: bin-pack the rest

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return self._binpack.pick_gpus(req, node)

    def permit(self, req: Request, stmt: Statement) -> Status:
        wait = self.p["wait_s"]
        if not wait or not self._gang(req):
            return SUCCESS
        job = req.job
        self._waiting.pop(job.job_id, None)  # placed now (its nodes are free for the jobs behind), or held again
        nodes = self.fw.state.nodes
        got = spread_of([nodes[a.node_id] for a in stmt.allocs])
        best = tightest(self._candidates(req, True), req.workers)
        if best is None or got <= best:
            return SUCCESS
        since = self._loose_since.setdefault(job.job_id, req.now)
        if req.now - since >= wait:
            return SUCCESS
        self._waiting[job.job_id] = (job, req.gpus, req.model, since + wait)
        return held(self.name, f"waiting up to {wait:g} s for a tighter placement: {best[0]} node(s) / {best[1]} "
                               f"switch(es) possible, {got[0]} / {got[1]} free now")

    def on_placed(self, job: Job, placement: Placement, now: float) -> None:
        self._loose_since.pop(job.job_id, None)
        self._waiting.pop(job.job_id, None)

    def on_ended(self, job: Job, now: float) -> None:
        self._loose_since.pop(job.job_id, None)
        self._waiting.pop(job.job_id, None)

    def on_blocked(self, req: Request, status: Status) -> int:
        """A gang waiting by choice lets the next ``depth`` jobs behind it be examined (the queue is not blocked
        by it; a bound keeps a cycle's cost apart from the queue's length, as backfill's does). The
        waits that are over are forgotten here (a gang whose wait ended was tried this cycle, or its queue is
        blocked ahead of it), so ``wake_at`` no longer names them."""
        if self._waiting:
            for jid in [j for j, (_, _, _, until) in self._waiting.items() if until <= req.now]:
                del self._waiting[jid]
        return self.p["depth"] if status.plugin == self.name else 0
