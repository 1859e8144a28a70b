"""``gang``: all workers or none. The framework always places a job whole (a Statement); this
plugin refuses at submit a gang that no placement could ever give on the nodes known then (a
worker larger than the largest node, or more GPUs than every known node has: UNRESOLVABLE with
the reason), and its permit refuses a statement that lacks a rank. Once accepted, a job is never
failed for the cluster's size: nodes come and go (a scheduler that restarted learns them again one
by one), so it waits. With no node known yet, a submit cannot be judged and is accepted."""

from __future__ import annotations

from cluster.framework import SUCCESS, Plugin, Status, register, unresolvable, unschedulable
from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.statement import Statement


@register
class Gang(Plugin):
    name = "gang"
    PARAMS = {"fail_unfit": Param(True, "bool", doc="fail a gang no placement could ever give")}

    def pre_enqueue(self, job: Job) -> Status:
        spec = job.spec
        if not spec.gpus or not self.p["fail_unfit"]:
            return SUCCESS
        state = self.fw.state
        cap = state.capacity(spec.gpu_model)
        if not cap:
            return SUCCESS
        model = f" {spec.gpu_model}" if spec.gpu_model else ""
        largest = state.max_gpus_per_node(spec.gpu_model)
        if spec.gpus > largest:
            return unresolvable(self.name, f"a worker needs {spec.gpus}{model} GPUs on one node; the largest node has {largest}")
        whole = spec.gpu_milli >= 1000
        total = spec.workers * spec.gpus if whole else -(-spec.workers * spec.gpu_milli // 1000)
        if total > cap:
            return unresolvable(self.name, f"the gang needs {total}{model} GPUs; the cluster has {cap}")
        return SUCCESS

    def permit(self, req: Request, stmt: Statement) -> Status:
        if len(stmt) != req.workers:
            return unschedulable(self.name, f"{len(stmt)} of {req.workers} workers placed")
        return SUCCESS
