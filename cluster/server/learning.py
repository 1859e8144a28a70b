"""What the live scheduler learns from its jobs, at its edge: the history record of each run that ends (built from
the core's job, its journal row and the latest progress its node reported), journaled in the transaction that
journals the end, and the run-time model its views and recommendations read.

``Learning`` (one per ``SchedulerService``):
  * ``record(d, core, progress, now, models, speeds)``: the ``HistoryRecord`` of the run a ``JobChanged`` ends (a
    terminal state, or an out-of-memory restart: back to pending with ``oom``), None for a job that never ran. Its
    wall time runs from the start this scheduler saw (``started``; after a restart, the journal's first start) to
    ``now``; its GPU type is the model of the GPUs it ran on (``gpu_type``: its placement's GPU indices, by the
    models its nodes' hellos listed); iterations, step times, peak memory (the reporting rank's reserved peak), busy
    fraction and features come from the progress its node last reported (None where none came); the cap and share
    it ran under, whether they were recommended, and its arguments' numbers from its journal row;
  * ``learned``: the records of this scheduler's life and those read from the journal at start (the most recent
    ``LOAD``), which every rebuilt core learns again (``SchedulerCore.learn``): a restart or a rebuild forgets
    nothing a prediction uses (each key keeps its most recent ``predictor`` window anyway);
  * ``gpu_type(placement, models, speeds, registered)``: the GPU model a placement ran on. Each of its GPUs has the
    model its node's hello listed for that index (a node may hold several models: ``--sim-gpus 2:V100,2:T4@0.6``),
    else the node's registered one (``NodeSpec.gpu_model``: "" for a node of several models). Where they differ (a gang across
    types, or one worker's GPUs of two models) it is the slowest by the speeds nodes declared: a synchronous gang
    runs at its slowest GPU's pace, so its timings belong to that type; a model with no declared speed counts as the
    fastest, and among equals the first rank's (its first GPU's) is taken;
  * ``model(core)``: the run-time model the views read: the policy's ``predictor`` plugin's when it has one (what
    backfill plans with), else ``own``, which ``started``/``ended``/``progressed`` feed the same way."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cluster import events as ev
from cluster.plugins.predictor import job_key
from cluster.predict.fingerprint import command_numbers
from cluster.predict.history import Exit, HistoryRecord
from cluster.predict.predictor import RunTimePredictor
from cluster.server.journal_file import placement_from_json
from colocate import protocol as P
from colocate.base.vocab import TERMINAL

if TYPE_CHECKING:
    from cluster.core import SchedulerCore
    from cluster.server.journal import Journal
    from cluster.spec import Placement

LOAD = 50_000  # history records a scheduler reads from its journal at start (the most recent)


def exit_of(d: ev.JobChanged) -> Exit:
    """The exit state of the run a ``JobChanged`` ends."""
    if d.oom:
        return Exit.OOM
    if d.state == ev.SUCCEEDED:
        return Exit.SUCCEEDED
    return Exit.FAILED if d.state == ev.FAILED else Exit.KILLED


def gpu_type(placement: Placement | None, models: Mapping[str, Mapping[int, str]], speeds: Mapping[str, float],
             registered: Callable[[str], str]) -> str:
    """The GPU model ``placement`` ran on (module docstring); "" when it is not known. ``models``: node id -> GPU
    index -> model (the nodes' hellos); ``speeds``: model -> declared relative speed (0 or absent: not declared);
    ``registered(node_id)``: the node's registered model ("" for a node not known)."""
    if placement is None:
        return ""
    ran = [m for s in placement.slots for g in s.gpus if (m := models.get(s.node_id, {}).get(g) or registered(s.node_id))]
    if not ran:  # no GPU index: its first node's model
        ran = [m for s in placement.slots[:1] if (m := registered(s.node_id))]
    return min(ran, key=lambda m: speeds.get(m) or math.inf, default="")  # min keeps the first of the slowest


def ends_a_run(d: ev.JobChanged) -> bool:
    """Whether ``d`` ends a run that the history records: the job's end, or its out-of-memory restart."""
    return d.state in TERMINAL or (d.oom and d.state == ev.PENDING)


class Learning:
    def __init__(self, journal: Journal, load: int = LOAD):
        self.journal = journal
        self.own = RunTimePredictor()  # the views' model when the policy has no predictor plugin
        self.started: dict[str, float] = {}  # job id -> when its current run started (scheduler clock)
        self.learned: deque[HistoryRecord] = deque((_lean(r) for r in journal.history_tail(load)), maxlen=load)
        for rec in self.learned:
            self.own.finished(rec)

    # ---- the core's model ---------------------------------------------------------------------------
    def model(self, core: SchedulerCore) -> RunTimePredictor:
        pred = core.fw.plugin("predictor")
        return pred.model if pred is not None else self.own  # type: ignore[attr-defined]

    def teach(self, core: SchedulerCore) -> None:
        """A fresh core (start, rebuild) learns the history, before its jobs are restored."""
        core.learn(self.learned)

    def restored(self, core: SchedulerCore, now: float) -> None:
        """After ``core.restore``: its running jobs run on (in ``own``, from when they first started)."""
        for job in core.jobs.values():
            if job.state == ev.RUNNING and job.job_id not in self.started:
                row = self.journal.job(job.job_id)
                self.started[job.job_id] = row["started_at"] if row and row["started_at"] else now
                self.own.started(job.job_id, job_key(job.spec), self.started[job.job_id])

    # ---- runs ---------------------------------------------------------------------------------------
    def changed(self, d: ev.JobChanged, core: SchedulerCore, now: float) -> None:
        """After ``d`` is committed: a run started or ended (``ended`` gets its record)."""
        if d.state == ev.RUNNING and d.job_id not in self.started:
            self.started[d.job_id] = now
            job = core.job(d.job_id)
            if job is not None:
                self.own.started(d.job_id, job_key(job.spec), now)
        elif d.state in TERMINAL or d.state == ev.PENDING:
            self.started.pop(d.job_id, None)
            self.own.forget(d.job_id)

    def ended(self, rec: HistoryRecord) -> None:
        """``rec`` is journaled: it is learned (by ``own`` now, by every core built from now on)."""
        self.learned.append(_lean(rec))
        self.own.finished(rec)

    def progressed(self, e: ev.JobProgressed, now: float) -> None:
        self.own.progress(e.job_id, e.done, e.total, e.step_p50_s, now - e.age_s, e.step_p90_s, e.step_mean_s)

    def record(self, d: ev.JobChanged, core: SchedulerCore, progress: P.JobProgress | None, now: float,
               models: Mapping[str, Mapping[int, str]] | None = None,
               speeds: Mapping[str, float] | None = None) -> HistoryRecord | None:
        """The record of the run ``d`` ends (module docstring), before ``d`` is journaled; None if it never ran.
        ``models`` and ``speeds``: what the nodes' hellos listed (``gpu_type``); without them, each node's
        registered model."""
        if not ends_a_run(d):
            return None
        job = core.job(d.job_id)
        row = self.journal.job(d.job_id)
        if job is None or row is None:
            return None
        start = self.started.get(d.job_id, row["started_at"])
        if start is None:
            return None
        spec = job.spec
        placement = placement_from_json(row["placement"])

        def registered(node_id: str) -> str:
            node = core.state.nodes.get(node_id)
            return node.model if node is not None else ""

        request = json.loads(row["request"])
        advice = json.loads(row["advice"]) if row.get("advice") else {}
        ran_spec = json.loads(row["spec"])  # the spec it ran with (an out-of-memory restart changes it after this)
        nums = command_numbers(request.get("command") or ())
        p = progress
        return HistoryRecord(
            job_id=d.job_id, exact=spec.fingerprint, family=spec.family, user=spec.user, gpus=spec.total_gpus,
            gpu_type=gpu_type(placement, models or {}, speeds or {}, registered), wall_s=max(0.0, now - start),
            exit=exit_of(d), submit_s=min(row["submitted_at"], now), end_s=now,
            iterations=p.iterations if p is not None else None,
            step_p50_s=p.step_p50_s if p is not None and p.step_p50_s > 0 else None,
            step_p90_s=p.step_p90_s if p is not None and p.step_p90_s > 0 else None,
            peak_mem=p.mem_reserved_peak if p is not None else None,
            busy=p.busy_fraction if p is not None else None,
            mem_cap=int(ran_spec.get("gpu_mem") or 0) or None, sm_share=_share(request.get("sm_share")),
            recommended=bool(advice.get("gpu_mem") or advice.get("sm_share")),
            features=P.record_map(p.features) if p is not None and p.features is not None else None,
            gpu_model=spec.gpu_model, numbers=nums if all(math.isfinite(x) for x in nums) else None)


def _lean(rec: HistoryRecord) -> HistoryRecord:
    """``rec`` as kept in memory: without its features (the journal keeps them; predictions do not read them)."""
    return rec if rec.features is None else dataclasses.replace(rec, features=None)


def _share(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and 0 < v < 1 else None
