"""``multi_queue`` (seed 000): jobs of queue "default" go to a queue by request size (total GPUs
of the gang; a fractional worker counts as one): ``size_queues`` maps names to upper limits in
ascending order, the last ``inf`` (default small <= 2, large). Each queue is FIFO on its own, so
a blocked large job never blocks small ones. Queues named in ``queues`` are user queues, FIFO
each; any other ``spec.queue`` is rejected at submit. Opportunistic jobs: queue "opportunistic".
"""

from __future__ import annotations

import math

from cluster.framework import SUCCESS, Plugin, Status, register, unresolvable
from cluster.jobs import Job
from cluster.params import Param
from cluster.plugins.fifo import OPPORTUNISTIC_QUEUE
from cluster.spec import JobSpec


def _ascending_to_inf(d: dict) -> bool:
    v = list(d.values())
    return bool(v) and all(x >= 0 for x in v) and v == sorted(v) and len(set(v)) == len(v) and math.isinf(v[-1])


@register
class MultiQueue(Plugin):
    name = "multi_queue"
    PARAMS = {
        "size_queues": Param({"small": 2.0, "large": math.inf}, "dict[str,float]", _ascending_to_inf,
                             "queue = largest total GPUs, ascending, the last inf"),
        "queues": Param((), "list[str]", lambda v: "default" not in v and OPPORTUNISTIC_QUEUE not in v,
                        "user queue names; not 'default' or 'opportunistic'"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._limits = list(params["size_queues"].items())
        self._named = frozenset(params["queues"])
        clash = self._named & set(params["size_queues"]) | ({OPPORTUNISTIC_QUEUE} & set(params["size_queues"]))
        if clash:
            raise ValueError(f"plugins.multi_queue: queue name {sorted(clash)[0]!r} used twice")

    def pre_enqueue(self, job: Job) -> Status:
        q = job.spec.queue
        if q != "default" and q not in self._named:
            known = ", ".join(["default", *sorted(self._named)])
            return unresolvable(self.name, f"unknown queue {q!r} (known: {known})")
        return SUCCESS

    def queue_of(self, spec: JobSpec) -> str:
        if spec.priority == "opportunistic":
            return OPPORTUNISTIC_QUEUE
        if spec.queue in self._named:
            return spec.queue
        total = spec.workers * max(spec.gpus, 0)
        for name, limit in self._limits:
            if total <= limit:
                return name
        return self._limits[-1][0]

    def sort_key(self, job: Job) -> tuple:
        return (job.spec.submit_time,)
