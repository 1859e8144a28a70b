"""``multi_queue`` (seed 000): jobs of queue "default" go to a queue by request size (total GPUs
of the gang; a fractional worker counts as one): ``size_queues`` maps names to upper limits in
ascending order, the last ``inf`` (default small <= 2, large). Each queue is FIFO on its own, so
a blocked large job never blocks small ones. Queues named in ``queues`` are user queues, FIFO
each; any other ``spec.queue`` is rejected at submit. Opportunistic jobs: queue "opportunistic".

Aging (no starvation): separate queues let a stream of small jobs take every GPU a large gang
would need, forever. So once a queue's head has been blocked for ``starvation_s`` seconds since it
became pending, no guaranteed job of another queue starts (its pre-filter says why) until that
head has started: the GPUs that free up drain towards it. ``starvation_s = inf`` turns aging off
(seed 000's plain multi-queue).
"""

from __future__ import annotations

import math

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.plugins.fifo import OPPORTUNISTIC_QUEUE
from cluster.points import SUCCESS, Plugin, Status, fails_job, held, register
from cluster.spec import JobSpec
from colocate.base.vocab import JobClass, JobState


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
        "starvation_s": Param(300.0, "float", lambda v: v >= 0, "seconds >= 0 a blocked head waits before the "
                              "other queues hold for it (inf: never)"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._limits = list(params["size_queues"].items())
        self._named = frozenset(params["queues"])
        self._starve = params["starvation_s"]
        self._hold: tuple[str, str, Status] | None = None  # (queue, job id, why others wait) while aging
        clash = self._named & set(params["size_queues"]) | ({OPPORTUNISTIC_QUEUE} & set(params["size_queues"]))
        if clash:
            raise ValueError(f"plugins.multi_queue: queue name {sorted(clash)[0]!r} used twice")

    def pre_enqueue(self, job: Job) -> Status:
        q = job.spec.queue
        if q != "default" and q not in self._named:
            known = ", ".join(["default", *sorted(self._named)])
            return fails_job(self.name, f"unknown queue {q!r} (known: {known})")
        return SUCCESS

    def queue_of(self, spec: JobSpec) -> str:
        if spec.klass == JobClass.OPPORTUNISTIC:
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

    def cycle_start(self, now: float) -> None:
        """Hold the other queues for the longest-waiting head blocked at least ``starvation_s``."""
        self._hold = None
        oldest = None
        for queue, (job_id, _) in self.fw.blocked.items():
            job = self.fw.jobs.get(job_id)
            if (queue == OPPORTUNISTIC_QUEUE or job is None or job.state != JobState.PENDING
                    or now - job.enqueued_at < self._starve):
                continue
            if oldest is None or job.enqueued_at < oldest[1].enqueued_at:
                oldest = (queue, job)
        if oldest is not None:
            queue, job = oldest
            self._hold = (queue, job.job_id, held(
                self.name, f"held for job {job.job_id} of queue {queue}, waiting {now - job.enqueued_at:.0f} s"))

    def pre_filter(self, req: Request) -> Status:
        hold = self._hold
        if hold is None or req.klass != JobClass.GUARANTEED or req.job.queue == hold[0]:
            return SUCCESS
        return hold[2]
