"""``opportunistic`` (AntMan): places opportunistic workers. A worker goes on GPUs whose reported
utilization over the last 10 s is under ``util_threshold`` (0.8) and whose free memory (by the
larger of allocation and report) fits its ``gpu_mem``, least utilized first and, at equal
utilization, beside a guaranteed worker; at most ``max_per_gpu`` opportunistic workers per GPU
(0: no limit), and never two ranks of one gang on one GPU, nor on a node a preemption plan holds
for a guaranteed job (``fw.reserved_nodes``). It takes no guaranteed milli. Its
queue never blocks: a job that does not fit is passed over (up to ``depth`` jobs per cycle)."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.fitting import gpu_fits_opportunistic, pick_opportunistic
from cluster.jobs import Request
from cluster.params import Param
from cluster.plugins.binpack import BIG
from cluster.points import SUCCESS, Plugin, Status, register, unschedulable
from cluster.state import NodeState
from colocate.base.vocab import JobClass


@register
class Opportunistic(Plugin):
    name = "opportunistic"
    serves = frozenset((JobClass.OPPORTUNISTIC,))
    PARAMS = {
        "util_threshold": Param(0.8, "float", lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
        "max_per_gpu": Param(2, "int", lambda v: v >= 0, "an integer >= 0 (0: no limit)"),
        "depth": Param(1000, "int", lambda v: v >= 1, "an integer >= 1"),
    }

    def bind(self, fw) -> None:
        super().bind(fw)
        self.threshold = self.p["util_threshold"]
        self.max_per_gpu = self.p["max_per_gpu"]
        fw.state.set_opportunistic_cap(self.max_per_gpu)  # full GPUs leave the utilization index
        self._no = unschedulable(self.name, f"no GPU under {self.threshold:g} utilization with room")
        self._reserved = unschedulable(self.name, "node held for a guaranteed job whose preemption victims are stopping")

    def node_order(self, req: Request) -> Iterator[NodeState]:
        state = self.fw.state
        if req.gpus == 0:
            yield from state.nodes_by_free(req.model, 0, BIG, descending=True)
            return
        seen = req.seen
        seen.clear()
        mem, th, cap, pid = req.mem, self.threshold, self.max_per_gpu, req.pid
        reserved = self.fw.reserved_nodes
        for gpu in state.gpus_by_util(req.model, th):
            node = gpu.node
            if node not in seen and node.node_id not in reserved and gpu_fits_opportunistic(gpu, mem, th, cap, pid):
                seen.add(node)
                yield node

    def filter(self, req: Request, node: NodeState) -> Status:
        if node.node_id in self.fw.reserved_nodes:
            return self._reserved
        if req.gpus == 0:
            return SUCCESS
        n = 0
        for gpu in node.gpus:
            if gpu_fits_opportunistic(gpu, req.mem, self.threshold, self.max_per_gpu, req.pid):
                n += 1
                if n >= req.gpus:
                    return SUCCESS
        return self._no

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_opportunistic(node, req.gpus, req.mem, self.threshold, self.max_per_gpu, req.pid)

    def on_blocked(self, req: Request, status: Status) -> int:
        return self.p["depth"]
