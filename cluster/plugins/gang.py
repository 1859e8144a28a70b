"""``gang``: all workers or none. The framework always places a job whole (a Statement); this
plugin's permit refuses a statement that lacks a rank. (A gang no known node could ever hold is
refused at submit, or set aside, by the framework itself: ``scheduler.refuse_unplaceable``.)"""

from __future__ import annotations

from cluster.jobs import Request
from cluster.points import SUCCESS, Plugin, Status, register, unschedulable
from cluster.statement import Statement


@register
class Gang(Plugin):
    name = "gang"

    def permit(self, req: Request, stmt: Statement) -> Status:
        if len(stmt) != req.workers:
            return unschedulable(self.name, f"{len(stmt)} of {req.workers} workers placed")
        return SUCCESS
