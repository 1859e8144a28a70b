"""``backfill`` (EASY, seed 000): when a queue's head is blocked, it gets a reserved start (the
shadow time): the earliest expected end of running guaranteed placements at which the GPUs they
free, with those free now, cover the head's demand. A later job of that queue may then start
only if it does not delay that start: by its estimate it ends by the shadow time, or it uses
only the extra GPUs the head will not need at the shadow time (which it then consumes).

Estimate: the job's ``estimate_s``, else the ``predictor`` plugin's run time: a running job is
expected to end at quantile ``quantile`` (p90 by default, so the shadow time is a late one), and a
job behind a blocked head is admitted if it ends by the shadow time at quantile ``admit`` (p50 by
default: its median run time, as system-generated predictions are used in EASY++, Tsafrir, Etsion &
Feitelson, IEEE TPDS 2007; p90 admits only the jobs that are short at their p90, which on the
replays in ``docs/evaluation.md`` lets fewer short jobs pass); else unknown: a job with an unknown
estimate is not backfilled, a running one with none counts as never ending (then no shadow time may
exist and the queue waits).
A running placement that outlives its expected end (``overdue = "conditional"``, the default), or
had none, gets a new one when a head is blocked: the predictor's ``expected_end``, from the run-time
distribution conditioned on the time it has run (run times are heavy-tailed: a job past its p90 is
likely to run long yet, so taking it to end now would reserve the head on GPUs that stay busy and
let long jobs into the ones it needs); ``overdue = "now"``: it is expected to end now (the rule
before issue 25). A placement with an ``estimate_s`` keeps it. When the predictor's progress
reports move a running job's projected end, its expected end moves at the next cycle (the shadow
times are recomputed every cycle). Capacity is counted in guaranteed milli of the head's GPU model (topology is not
modelled); reservations hold per queue and per cycle (jobs of other queues are not checked).
At most ``depth`` jobs behind a blocked head are examined per cycle, in the order ``order`` gives:
``shortest`` (the default), by the run time they are admitted on, shortest first, ties and unknown
estimates (never admitted) in queue order: EASY++'s shortest-job-backfilled-first (SJBF, Tsafrir, Etsion &
Feitelson 2007), so the holes before a reservation go to the short jobs first; ``queue``: queue order
(classic EASY). The head's reservation is the same either way; only which of the jobs behind it pass first
changes."""

from __future__ import annotations

import math
from bisect import bisect_left, insort

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.points import SUCCESS, Plugin, Status, register, unschedulable
from cluster.spec import MILLI, JobSpec, Placement, allowed_models, model_allows
from cluster.statement import Statement
from colocate.base.vocab import JobClass

_UNKNOWN = math.inf  # SJBF's key for a job without an estimate: after every job with one


class _Reservation:
    __slots__ = ("head", "shadow", "extra", "model")

    def __init__(self, head: str, shadow: float, extra: int, model: str) -> None:
        self.head, self.shadow, self.extra, self.model = head, shadow, extra, model


@register
class Backfill(Plugin):
    name = "backfill"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {
        "depth": Param(100, "int", lambda v: v >= 1, "an integer >= 1"),
        "quantile": Param("p90", "str", lambda v: v in ("p50", "p90"), "p50 or p90"),
        "overdue": Param("conditional", "str", lambda v: v in ("conditional", "now"), "conditional or now"),
        "admit": Param("p50", "str", lambda v: v in ("p50", "p90"), "p50 or p90"),
        "order": Param("shortest", "str", lambda v: v in ("shortest", "queue"), "shortest or queue"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._ends: list[tuple[float, str]] = []  # (expected end, placement id), sorted
        self._info: dict[str, tuple[float, int, str, str]] = {}  # pid -> (end, milli, model, job id)
        self._res: dict[str, _Reservation] = {}
        self._admitted: tuple[Job, int] | None = None
        self._admit_est: dict[str, float | None] = {}  # job id -> admission estimate, from backfill_order this cycle
        self._unknown = unschedulable(self.name, "no run-time estimate (cannot backfill)")

    def estimate(self, spec: JobSpec, now: float | None = None, quantile: str | None = None) -> float | None:
        """Run time (seconds) backfill plans with for a job not yet started, at ``quantile`` (default the
        ``quantile`` parameter); None: unknown."""
        if spec.estimate_s is not None:
            return spec.estimate_s
        pred = self.fw.plugin("predictor")
        if pred is None:
            return None
        q = pred.quantiles(spec, spec.submit_time if now is None else now)  # type: ignore[attr-defined]
        if q is None:
            return None
        return q.p90 if (quantile or self.p["quantile"]) == "p90" else q.p50

    # running guaranteed placements by expected end
    def on_placed(self, job: Job, placement: Placement, now: float) -> None:
        if placement.klass == JobClass.GUARANTEED:
            self._track(job, placement, now)

    def on_promoted(self, job: Job, placement: Placement, now: float) -> None:
        start = job.running_since if job.running_since is not None else now
        self._track(job, placement, start)

    def _track(self, job: Job, placement: Placement, start: float) -> None:
        pid = placement.placement_id
        if pid in self._info:
            return
        est = self._planned_run_s(job, start)
        end = start + est if est is not None else math.inf
        node = self.fw.state.nodes.get(placement.slots[0].node_id) if placement.slots else None
        self._info[pid] = (end, job.spec.total_milli, node.model if node else "", job.job_id)
        insort(self._ends, (end, pid))

    def _planned_run_s(self, job: Job, start: float) -> float | None:
        """Run time (s) a placement of ``job`` started at ``start`` is expected to end after (None: never, as far as
        backfill knows): its ``estimate`` at ``quantile``."""
        return self.estimate(job.spec, start)

    def on_released(self, job: Job, placement: Placement, now: float) -> None:
        pid = placement.placement_id
        info = self._info.pop(pid, None)
        if info is not None:
            i = bisect_left(self._ends, (info[0], pid))
            del self._ends[i]

    def _move(self, pid: str, end: float) -> None:
        old, milli, model, job_id = self._info[pid]
        del self._ends[bisect_left(self._ends, (old, pid))]
        self._info[pid] = (end, milli, model, job_id)
        insort(self._ends, (end, pid))

    def cycle_start(self, now: float) -> None:
        self._res.clear()
        self._admitted = None
        self._admit_est.clear()
        pred = self.fw.plugin("predictor")
        moved = pred.take_moved() if pred is not None else None  # type: ignore[attr-defined]
        if moved:
            jobs = self.fw.jobs
            for job_id, end in moved.items():
                job = jobs.get(job_id)
                if job is None or job.spec.estimate_s is not None:
                    continue
                pid = job.placement_id
                if pid is not None and pid in self._info:
                    self._move(pid, end)

    def _reestimate(self, now: float) -> None:
        """Running placements past their expected end, or with none (no history at their start), get a
        new one from the predictor's run-time distribution conditioned on the time they have run."""
        pred = self.fw.plugin("predictor")
        if pred is None or not self._ends:
            return
        due = []
        for end, pid in self._ends:
            if end > now:
                break
            due.append(pid)
        for end, pid in reversed(self._ends):
            if end != math.inf:
                break
            due.append(pid)
        jobs = self.fw.jobs
        for pid in due:
            job = jobs.get(self._info[pid][3])
            if job is None or job.spec.estimate_s is not None:
                continue
            end = pred.expected_end(job, self.p["quantile"], now)  # type: ignore[attr-defined]
            if end is not None and end > now:
                self._move(pid, end)

    def on_blocked(self, req: Request, status: Status) -> int:
        if self.p["overdue"] == "conditional":
            self._reestimate(req.now)
        need = req.spec.total_milli
        model = req.model
        have = self.fw.state.free_gpus(model) * MILLI
        shadow = None
        for end, pid in self._ends:
            if end == math.inf:
                break
            _, milli, pmodel, _ = self._info[pid]
            if not model_allows(model, pmodel):  # the head's constraint (one model or several) does not take them
                continue
            have += milli
            if have >= need:
                shadow = max(end, req.now)
                break
        if shadow is None:
            return 0
        self._res[req.queue] = _Reservation(req.job.job_id, shadow, have - need, model)
        return self.p["depth"]

    def backfill_order(self, req: Request, jobs: list[Job]) -> list[Job]:
        if self.p["order"] == "queue" or req.queue not in self._res:
            return jobs
        est = self._admit_est
        est.clear()
        admit, now = self.p["admit"], req.now
        for j in jobs:
            est[j.job_id] = self.estimate(j.spec, now, admit)
        return sorted(jobs, key=lambda j: _UNKNOWN if (e := est[j.job_id]) is None else e)  # stable: ties keep queue order

    def backfill_admit(self, req: Request) -> Status:
        res = self._res.get(req.queue)
        if res is None or (res.model and req.model and allowed_models(res.model).isdisjoint(allowed_models(req.model))):
            return SUCCESS  # no GPU this job may take is one the head may: it cannot delay the head
        job_id = req.job.job_id
        est = self._admit_est[job_id] if job_id in self._admit_est else self.estimate(req.spec, req.now, self.p["admit"])
        if est is None:
            return self._unknown
        if req.now + est <= res.shadow:
            self._admitted = None
            return SUCCESS
        milli = req.spec.total_milli
        if milli <= res.extra:
            self._admitted = (req.job, milli)
            return SUCCESS
        return unschedulable(self.name, f"would delay {res.head}, reserved to start at {res.shadow:g}")

    def reserve(self, req: Request, stmt: Statement) -> Status:
        adm = self._admitted
        if adm is not None and adm[0] is req.job:
            self._res[req.queue].extra -= adm[1]
        self._admitted = None
        return SUCCESS

    def reservation(self, queue: str) -> tuple[str, float, int] | None:
        """(head job id, shadow time, extra milli) of ``queue`` in the last cycle, if any."""
        r = self._res.get(queue)
        return None if r is None else (r.head, r.shadow, r.extra)
