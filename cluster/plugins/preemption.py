"""``preemption`` (post-filter, AntMan): when a guaranteed job is blocked but would fit if some
opportunistic placements were stopped, it picks victims and the framework emits their stops.

Plan: worker by worker, over the guaranteed candidate order (at most ``max_nodes`` nodes), it
takes the node whose GPUs (guaranteed share free) and host resources become sufficient with the
fewest new victims (GPU memory, CPU and host memory held by opportunistic workers count as
freeable), victims on a GPU largest memory first then youngest; it plans the worker tentatively
(a Statement, discarded at the end) and goes on. Only opportunistic placements are ever chosen,
never one already stopping, at most ``max_victims``. The victims' jobs are requeued; the blocked
job gets the GPUs in a later cycle, once the stops are confirmed and the slots released (until
then no further victims are chosen for it, and the plan's nodes take no new opportunistic
worker: the framework's ``reserved_nodes``)."""

from __future__ import annotations

from cluster.jobs import Request
from cluster.params import Param
from cluster.points import SUCCESS, Code, Plugin, PostFilterResult, Status, register
from cluster.spec import MILLI
from cluster.state import Alloc, GpuState, NodeState
from cluster.statement import Statement
from colocate.base.vocab import JobClass


@register
class Preemption(Plugin):
    name = "preemption"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {
        "max_victims": Param(8, "int", lambda v: v >= 1, "an integer >= 1"),
        "max_nodes": Param(64, "int", lambda v: v >= 1, "an integer >= 1"),
    }

    def bind(self, fw) -> None:
        super().bind(fw)
        self._stmt = Statement(fw.state)

    def post_filter(self, req: Request, status: Status) -> PostFilterResult | None:
        if status.code != Code.UNSCHEDULABLE or req.gpus == 0:
            return None
        order = self.fw.node_order_for(JobClass.GUARANTEED)
        if order is None:
            return None
        state = self.fw.state
        victims: dict[str, None] = {}
        nodes: dict[str, None] = {}  # the plan's nodes, in rank order
        freed: dict[object, int] = {}  # GpuState -> bytes; (node, "cpu"|"mem") -> amount
        stmt = self._stmt.begin(req.pid, JobClass.GUARANTEED)
        try:
            for rank in range(req.workers):
                req.rank, req.remaining = rank, req.workers - rank
                best = None
                for n, node in enumerate(order(req)):
                    if n >= self.p["max_nodes"]:
                        break
                    plan = self._plan(node, req, victims, freed)
                    if plan is not None and (best is None or len(plan[1]) < len(best[2])):
                        best = (node, plan[0], plan[1])
                        if not plan[1]:
                            break
                if best is None:
                    return None
                node, gpus, new = best
                for pid in new:
                    victims[pid] = None
                    for a in state.allocs.get(pid, {}).values():
                        vnode = state.nodes[a.node_id]
                        for i in a.gpus:
                            g = vnode.gpus[i]
                            freed[g] = freed.get(g, 0) + a.mem
                        freed[(vnode, "cpu")] = freed.get((vnode, "cpu"), 0) + a.cpu
                        freed[(vnode, "mem")] = freed.get((vnode, "mem"), 0) + a.host_mem
                if len(victims) > self.p["max_victims"]:
                    return None
                stmt.allocate(rank, node, gpus, req.milli, req.mem, req.cpu, req.host_mem, req.now)
                nodes[node.node_id] = None
        finally:
            stmt.discard()
        if not victims:
            return None
        return PostFilterResult(SUCCESS, tuple(victims), nodes=tuple(nodes),
                                reason="preempted: room for guaranteed job " + req.job.job_id)

    def _plan(self, node: NodeState, req: Request, taken: dict, freed: dict) -> tuple[tuple[int, ...], list[str]] | None:
        """GPUs for the worker on ``node`` and the opportunistic placements (not yet taken) that
        must stop for it, or None when no stop makes it fit."""
        stopping = self.fw.stopping
        opp: dict[int, list[Alloc]] = {}
        host: list[Alloc] = []
        for a in node.slots.values():
            if a.klass != JobClass.GUARANTEED and a.pid not in taken and a.pid not in stopping:
                host.append(a)
                for i in a.gpus:
                    opp.setdefault(i, []).append(a)
        per_gpu = []
        for gpu in node.gpus:
            if gpu.milli + req.milli > MILLI:
                continue
            need = self._gpu_victims(gpu, req.mem, opp.get(gpu.index, ()), freed)
            if need is not None:
                per_gpu.append((len(need), gpu.index, need))
        if len(per_gpu) < req.gpus:
            return None
        per_gpu.sort(key=lambda x: (x[0], x[1]))
        chosen = per_gpu[:req.gpus]
        new: dict[str, None] = {}
        for _, _, need in chosen:
            new.update(dict.fromkeys(need))
        spec = node.spec
        for kind, want, cap, used in (("cpu", req.cpu, spec.cpu_milli, node.cpu), ("mem", req.host_mem, spec.mem_mib, node.host_mem)):
            if not want or not cap:
                continue
            free = cap - used + freed.get((node, kind), 0)
            free += sum((a.cpu if kind == "cpu" else a.host_mem) for a in host if a.pid in new)
            for a in sorted(host, key=lambda a: -a.start):
                if free >= want:
                    break
                if a.pid not in new:
                    new[a.pid] = None
                    free += sum(x.cpu if kind == "cpu" else x.host_mem for x in host if x.pid == a.pid)
            if free < want:
                return None
        return tuple(sorted(i for _, i, _ in chosen)), list(new)

    @staticmethod
    def _gpu_victims(gpu: GpuState, mem: int, allocs, freed: dict) -> list[str] | None:
        if not mem or not gpu.mem_total:
            return []
        free = gpu.mem_free() + freed.get(gpu, 0)
        out: list[str] = []
        for a in sorted(allocs, key=lambda a: (-a.mem, -a.start, a.pid)):
            if free >= mem:
                break
            if a.pid not in out:
                out.append(a.pid)
                free += a.mem
        return out if free >= mem else None
