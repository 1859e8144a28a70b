"""``fifo``: one queue in submit-time order (arrival order on ties); a blocked head blocks it.
Opportunistic jobs wait in their own queue "opportunistic" (they use other capacity).
``spec.queue`` is not used for ordering."""

from __future__ import annotations

from cluster.jobs import Job
from cluster.points import Plugin, register
from cluster.spec import JobSpec
from colocate.base.vocab import JobClass

OPPORTUNISTIC_QUEUE = JobClass.OPPORTUNISTIC


@register
class Fifo(Plugin):
    name = "fifo"

    def queue_of(self, spec: JobSpec) -> str:
        return OPPORTUNISTIC_QUEUE if spec.klass == JobClass.OPPORTUNISTIC else "default"

    def sort_key(self, job: Job) -> tuple:
        return (job.spec.submit_time,)
