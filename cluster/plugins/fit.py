"""``fit``: node resources (always on). Pre-filter answers "cannot fit now" from the state's
totals in O(largest node); filter checks a node's CPU, host memory and, for guaranteed workers,
free whole GPUs / GPU share and allocatable GPU memory."""

from __future__ import annotations

from cluster.fitting import fits_guaranteed, node_host_fits
from cluster.jobs import Job, Request
from cluster.points import SUCCESS, Plugin, Status, register, unschedulable
from cluster.state import NodeState
from colocate.base.vocab import JobClass


@register
class Fit(Plugin):
    name = "fit"

    def bind(self, fw) -> None:
        super().bind(fw)
        self._host = unschedulable(self.name, "CPU or host memory")
        self._gpu = unschedulable(self.name, "free GPUs or GPU memory")

    def pre_enqueue(self, job: Job) -> Status:
        """A constraint naming several GPU models becomes an index key of its own (state.ensure_key)."""
        self.fw.state.ensure_key(job.spec.gpu_model)
        return SUCCESS

    def pre_filter(self, req: Request) -> Status:
        if req.klass != JobClass.GUARANTEED or req.gpus == 0:
            return SUCCESS
        state = self.fw.state
        free = state.free_gpus(req.model)
        if req.whole:
            total = req.workers * req.gpus
            if free < total:
                return unschedulable(self.name, f"needs {total} free GPUs, {free} free")
            if state.worker_slots(req.model, req.gpus, req.workers) < req.workers:
                return unschedulable(self.name, f"no room for {req.workers} worker(s) of {req.gpus} GPUs on single nodes")
        elif free == 0 and state.max_partial_free(req.model) < req.milli:
            return unschedulable(self.name, f"no GPU has {req.milli} milli free")
        return SUCCESS

    def filter(self, req: Request, node: NodeState) -> Status:
        if (req.cpu or req.host_mem) and not node_host_fits(node, req.cpu, req.host_mem):
            return self._host
        if req.klass == JobClass.GUARANTEED and not fits_guaranteed(node, req.gpus, req.milli, req.mem):
            return self._gpu
        return SUCCESS
