"""``promotion`` (AntMan, optional): (1) a guaranteed job that blocks its queue after waiting at
least ``wait_s`` since it last became pending starts at once as opportunistic, on idle GPUs, if
some plugin places opportunistic workers; (2) every ``interval_s``, an opportunistic placement
that is running where guaranteed capacity is free (every GPU it sits on has its share free) is
upgraded in place: the core records it as guaranteed and emits a Promote. Upgrades are skipped
in a cycle where a guaranteed queue is blocked (that capacity may be its), unless
``when_blocked``."""

from __future__ import annotations

import math

from cluster.events import RUNNING
from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.plugins.fifo import OPPORTUNISTIC_QUEUE
from cluster.points import SUCCESS, Plugin, PostFilterResult, Status, Upgrade, register
from cluster.spec import Placement
from colocate.base.vocab import JobClass


@register
class Promotion(Plugin):
    name = "promotion"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {
        "wait_s": Param(600.0, "float", lambda v: v >= 0, "seconds >= 0"),
        "start_opportunistic": Param(True, "bool"),
        "upgrade": Param(True, "bool"),
        "interval_s": Param(30.0, "float", lambda v: v >= 0, "seconds >= 0"),
        "when_blocked": Param(False, "bool"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._opp: dict[str, Job] = {}  # opportunistic placements holding resources
        self._last = -math.inf

    def post_filter(self, req: Request, status: Status) -> PostFilterResult | None:
        if not self.p["start_opportunistic"] or req.now - req.job.enqueued_at < self.p["wait_s"]:
            return None
        return PostFilterResult(SUCCESS, retry_as=JobClass.OPPORTUNISTIC)

    def on_placed(self, job: Job, placement: Placement, now: float) -> None:
        if placement.klass == JobClass.OPPORTUNISTIC:
            self._opp[placement.placement_id] = job

    def on_released(self, job: Job, placement: Placement, now: float) -> None:
        self._opp.pop(placement.placement_id, None)

    def on_promoted(self, job: Job, placement: Placement, now: float) -> None:
        self._opp.pop(placement.placement_id, None)

    def cycle_end(self, now: float) -> list[Upgrade]:
        if not self.p["upgrade"] or not self._opp or now - self._last < self.p["interval_s"]:
            return []
        if not self.p["when_blocked"] and any(q != OPPORTUNISTIC_QUEUE for q in self.fw.blocked):
            return []
        self._last = now
        state, stopping = self.fw.state, self.fw.stopping
        out = []
        for pid, job in self._opp.items():
            if job.state != RUNNING or pid in stopping or job.placement_id != pid:
                continue
            if state.promotable(pid):
                out.append(Upgrade(pid))
        return out
