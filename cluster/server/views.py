"""What clients see of jobs and nodes: ``JobView`` from a journal row (plus the core's live reason
for a pending job, the latest progress and the run-time prediction), ``NodeView`` from the core's node state."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from cluster.core import SchedulerCore
from cluster.jobs import Job
from cluster.plugins.predictor import job_key
from cluster.predict.predictor import RunTimePredictor
from cluster.server.journal_file import placement_from_json, spec_from_dict
from cluster.server.node_gpus import shown_models
from colocate import protocol as P
from colocate.base.vocab import TERMINAL, JobClass, JobState


class QueueView:
    """The core's queues as one reply reads them, computed once per reply: ``queued`` (queue -> pending
    jobs), ``positions`` (job id -> (queue, 1-based position)), ``blocked`` (job id -> why its queue waits)."""

    def __init__(self, core: SchedulerCore):
        queues = core.queues()
        self.queued = {q: len(ids) for q, ids in queues.items() if ids}
        self.positions: dict[str, tuple[str, int]] = {}
        for q, ids in queues.items():
            for k, job_id in enumerate(ids, 1):
                self.positions.setdefault(job_id, (q, k))
        self.blocked = {job_id: why for job_id, why in core.blocked().values()}


def _queue_of(core: SchedulerCore, spec: dict) -> str:
    """The queue the policy puts a job of this spec (its journaled JSON, parsed) in: for a job the core no longer
    holds (ended before a restart; the spec keeps only the queue the request named, 'default' where the policy
    chose one by its size)."""
    try:
        return core.fw.queue_of(spec_from_dict(spec))
    except Exception:  # a view never fails for one row: the request's own queue then
        return str(spec.get("queue", ""))


def held_by(job: Job | None, node_id: str) -> bool:
    """Whether ``job`` has a rank of its current placement on node ``node_id``: a node speaks only for those jobs'
    progress (another job's, from a stale node or a forged report, would move its prediction and backfill's plan)."""
    placement = job.placement if job is not None else None
    return placement is not None and any(slot.node_id == node_id for slot in placement.slots)


class Progress:
    """The latest ``JobProgress`` nodes reported per job (in memory; the most recent ``keep`` jobs).

    A job's lowest rank speaks for it; a report without features keeps the features last reported. Reports the
    caller says the sender may not make (``speaks``: a job the scheduler does not know, such as a worker started by
    hand beside the node, or one not placed on the reporting node) are dropped."""

    def __init__(self, keep: int = 100_000):
        self.keep = keep
        self.jobs: dict[str, P.JobProgress] = {}

    def note(self, entries, speaks: Callable[[str], bool]) -> list[P.JobProgress]:
        """Keep the ``entries`` whose job the sender ``speaks`` for; returns those kept that moved a job's iterations
        (what the core's predictor hears)."""
        moved = []
        for p in entries:
            if not speaks(p.job_id):
                continue
            old = self.jobs.get(p.job_id)
            if old is not None and old.rank < p.rank:
                continue
            if p.features is None and old is not None and old.features is not None:
                p = dataclasses.replace(p, features=old.features)
            if old is None or old.iterations != p.iterations or old.total_iterations != p.total_iterations:
                moved.append(p)
            self.jobs.pop(p.job_id, None)  # most recent last
            self.jobs[p.job_id] = p
            if len(self.jobs) > self.keep:
                del self.jobs[next(iter(self.jobs))]
        return moved

    def of(self, job_id: str, features: bool) -> P.JobProgress | None:
        """Job ``job_id``'s latest progress (None if none), with its features only if ``features``."""
        p = self.jobs.get(job_id)
        if p is None or features or p.features is None:
            return p
        return dataclasses.replace(p, features=None)


def prediction_view(job: Job | None, model: RunTimePredictor, now: float) -> P.PredictionView | None:
    """What ``model`` predicts of ``job`` at ``now``: its run time while it waits, what is left of it while it runs
    (None: ended, unknown to the core, or nothing known)."""
    if job is None or job.state in TERMINAL:
        return None
    key = job_key(job.spec)
    running = job.state == JobState.RUNNING
    pred = model.remaining(job.job_id, key, now) if running else model.predict(key, now)
    if pred is None:
        return None
    return P.PredictionView(p50_s=max(0.0, pred.p50), p90_s=max(0.0, pred.p90), level=pred.level[:P.MAX_ID_CHARS],
                            history=max(0, pred.n), remaining=running)


def job_view(row: dict, core: SchedulerCore, queues: QueueView, progress: P.JobProgress | None = None,
             prediction: P.PredictionView | None = None) -> P.JobView:
    spec = json.loads(row["spec"])
    placement = placement_from_json(row["placement"])
    reason = row["reason"] or ""
    job = core.job(row["job_id"])
    if job is not None and row["state"] == JobState.PENDING:
        where = queues.positions.get(row["job_id"])
        if row["job_id"] in queues.blocked:
            reason = f"blocked: {queues.blocked[row['job_id']]}"
        elif where is not None:
            queue, position = where
            reason = f"queued in {queue} (position {position})" + (f"; {reason}" if reason else "")
    return P.JobView(
        job_id=row["job_id"], name=P.printable(spec.get("name", "")), user=P.printable(spec.get("user", "")),
        queue=P.printable(job.queue if job is not None and job.queue else _queue_of(core, spec)),
        priority=placement.klass if placement else spec.get("priority", JobClass.GUARANTEED), state=row["state"],
        workers=spec["workers"], gpus=spec["gpus"], submitted_at=row["submitted_at"], started_at=row["started_at"],
        ended_at=row["ended_at"], reason=reason[:P.MAX_TEXT_CHARS], placement_id=placement.placement_id if placement else "",
        nodes=placement.nodes() if placement else (), attempts=row["attempt"], exit_code=row["exit_code"],
        progress=progress, prediction=prediction, **_advice(row.get("advice")))


def _advice(text: str | None) -> dict:
    """A job's ``advice`` and ``learning`` view fields from its journaled advice (``cluster.server.advice``)."""
    if not text:
        return {}
    advice = json.loads(text)
    return {"advice": str(advice.get("text", ""))[:P.MAX_TEXT_CHARS], "learning": bool(advice.get("learning"))}


def node_views(core: SchedulerCore, hosts: dict[str, str], models: dict[str, dict[int, str]] | None = None
               ) -> list[P.NodeView]:
    def job_of(pid: str) -> str:
        holder = core.holders.get(pid)
        return holder.job_id if holder is not None else pid.rsplit(".", 1)[0]

    out = []
    for n in core.nodes():
        gpus = n["gpus"]
        views = tuple(P.GpuView(index=g["index"], utilization=min(1.0, max(0.0, g["utilization"])),
                                guaranteed=tuple(job_of(p) for p in g[JobClass.GUARANTEED]),
                                opportunistic=tuple(job_of(p) for p in g[JobClass.OPPORTUNISTIC])) for g in gpus)
        util = sum(g["utilization"] for g in gpus) / len(gpus) if gpus else 0.0
        out.append(P.NodeView(
            node_id=n["node_id"], host=hosts.get(n["node_id"], ""), up=n["up"],
            gpu_model=(n["gpu_model"] or shown_models((models or {}).get(n["node_id"], {})))[:P.MAX_ID_CHARS],
            gpus=len(gpus), gpus_allocated=sum(1 for g in gpus if g[JobClass.GUARANTEED]),
            gpus_shared=sum(1 for g in gpus if g[JobClass.OPPORTUNISTIC]), utilization=min(1.0, max(0.0, util)),
            workers=n["workers"], gpu_views=views, switch=P.printable(n.get("switch", ""))[:P.MAX_ID_CHARS],
            rack=P.printable(n.get("rack", ""))[:P.MAX_ID_CHARS]))
    return out
