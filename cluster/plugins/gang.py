"""``gang``: all workers or none. The framework always places a job whole (a Statement); this
plugin rejects at once a gang that no placement could ever give (a worker larger than the
largest node, or more GPUs than every known node has: UNRESOLVABLE with the reason), and its
permit refuses a statement that lacks a rank. With no node known yet a gang only waits."""

from __future__ import annotations

from cluster.framework import SUCCESS, Plugin, Status, register, unresolvable, unschedulable
from cluster.jobs import Request
from cluster.params import Param
from cluster.statement import Statement


@register
class Gang(Plugin):
    name = "gang"
    PARAMS = {"fail_unfit": Param(True, "bool", doc="fail a gang no placement could ever give")}

    def pre_filter(self, req: Request) -> Status:
        if not req.gpus or not self.p["fail_unfit"]:
            return SUCCESS
        state = self.fw.state
        cap = state.capacity(req.model)
        if not cap:
            return SUCCESS
        model = f" {req.model}" if req.model else ""
        largest = state.max_gpus_per_node(req.model)
        if req.gpus > largest:
            return unresolvable(self.name, f"a worker needs {req.gpus}{model} GPUs on one node; the largest node has {largest}")
        total = req.workers * req.gpus if req.whole else -(-req.workers * req.milli // 1000)
        if total > cap:
            return unresolvable(self.name, f"the gang needs {total}{model} GPUs; the cluster has {cap}")
        return SUCCESS

    def permit(self, req: Request, stmt: Statement) -> Status:
        if len(stmt) != req.workers:
            return unschedulable(self.name, f"{len(stmt)} of {req.workers} workers placed")
        return SUCCESS
