"""Recommendations at the scheduler's edge: ``colocate recommend`` and the submits that leave a resource to theirs.

``advise`` makes a job's fingerprints (the user of the key, its script's hash, its command), reads the recent history
of its exact fingerprint and of its family from the journal (index ranges of ``HISTORY`` rows each), the GPU types
the cluster has (free GPUs per model, the speeds nodes declared) and asks ``cluster.predict.recommend``; its run
time is the views' model's prediction. ``view`` is what ``RecommendReply`` carries.

``resolve`` applies what a submit left to its recommendation (``JobRequest.auto``, or the site's default
``scheduler.auto`` for a resource the submit does not state):
  * memory: a guaranteed job is placed and capped at its recommended cap (``JobSpec.gpu_mem``) with the whole GPU
    as its fallback (``JobSpec.mem_fallback``: out of memory under the cap, it is restarted there, uncounted); an
    opportunistic job is fitted by it and starts there on its node (``StartPlacement.start_mem``), free to grow;
  * share: a guaranteed job runs held to its recommended share (``JobRequest.sm_share``); an opportunistic job
    starts there (``StartPlacement.start_share``);
  * a resource with no recommendation (no history): the job runs as requested and is ``learning``.
What was decided is journaled with the job (``jobs.advice``, JSON: ``Resolved.advice``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cluster.predict.fingerprint import command_fingerprints, command_numbers
from cluster.predict.history import JobKey
from cluster.predict.predictor import Prediction, RunTimePredictor
from cluster.predict.recommend import Advice, Figure, Offer, Params, recommend
from cluster.spec import model_allows
from colocate import protocol as P
from colocate.base.units import format_size
from colocate.base.vocab import JobClass

if TYPE_CHECKING:
    from cluster.core import SchedulerCore
    from cluster.server.journal import Journal

HISTORY = 50  # records of one key a recommendation reads


@dataclass(frozen=True)
class Advised:
    exact: str
    family: str
    identity: str  # what stood for the script: content, module, code, path, program
    numbers: tuple[float, ...] | None
    advice: Advice
    run_time: Prediction | None


@dataclass
class Resolved:
    """What a submit's ``auto`` resources became."""

    gpu_mem: int  # the spec's
    mem_fallback: int | None
    request_gpu_mem: int  # what the job is started with (its cap, or its ceiling when opportunistic)
    sm_share: float | None  # the job's share cap
    advice: dict = field(default_factory=dict)  # journaled (jobs.advice)


def offers(core: SchedulerCore, speeds: dict[str, float], per_worker: int = 1, constraint: str = "") -> list[Offer]:
    """Each GPU model of the up nodes that ``constraint`` allows (a job's ``gpu_model``; "" any): the free GPUs
    that workers of ``per_worker`` GPUs could use now (on each node, its free GPUs rounded down to whole workers:
    a worker's GPUs are on one node) and the model's declared speed (0: not known). A node of several models has
    no model in the policy core (``NodeSpec.gpu_model`` ""): it offers no type."""
    g = max(1, per_worker)
    free: dict[str, int] = {}
    for n in core.state.nodes.values():
        if n.up and n.model and model_allows(constraint, n.model):
            free[n.model] = free.get(n.model, 0) + n.free // g * g
    return [Offer(m, free[m], speeds.get(m, 0.0)) for m in sorted(free)]


def whole_gpu(core: SchedulerCore) -> int:
    """The largest GPU memory of the up nodes (bytes; 0: none stated): no cap above it is recommended. Not the
    smallest: a cap is also the job's memory request, so the job is placed on a GPU that holds it, and a cap cut
    to a small node's GPU would run every job out of memory there."""
    return max((n.spec.gpu_mem for n in core.state.nodes.values() if n.up and n.spec.gpu_mem), default=0)


@dataclass(frozen=True)
class Sources:
    """What a recommendation reads: the core (its GPU types, free GPUs, policy parameters), the journal (history),
    the views' run-time model and the speeds nodes declared per GPU model."""

    core: SchedulerCore
    journal: Journal
    model: RunTimePredictor
    speeds: dict[str, float]


def advise(src: Sources, user: str, command, script_hash: str, workers: int, gpus: int, gpu_model: str,
           now: float) -> Advised:
    core, journal, model, speeds = src.core, src.journal, src.model, src.speeds
    exact, family, identity = command_fingerprints(user, command, script_hash)
    nums = command_numbers(command)
    numbers = nums if all(math.isfinite(x) for x in nums) else None
    ex = journal.history_of("exact", exact, HISTORY)
    fam = journal.history_of("family", family, HISTORY)
    sched = core.config.scheduler
    params = Params(margin=sched.get("recommend_margin", 1.2), slowdown=sched.get("recommend_slowdown", 1.1))
    advice = recommend(ex, fam, numbers, offers(core, speeds, gpus, gpu_model), workers * gpus, whole_gpu(core),
                       params)
    run_time = model.predict(JobKey(exact, family, user, workers * gpus, gpu_model), now)
    return Advised(exact, family, identity, numbers, advice, run_time)


def _figure(f: Figure | None) -> P.FigureView | None:
    if f is None:
        return None
    return P.FigureView(value=max(0.0, f.value), level=f.level, history=f.history, label=f.label[:P.MAX_ID_CHARS])


def view(a: Advised) -> P.RecommendationView:
    run_time = None
    why = dict(a.advice.why_not)
    if a.run_time is not None:
        run_time = P.PredictionView(p50_s=max(0.0, a.run_time.p50), p90_s=max(0.0, a.run_time.p90),
                                    level=a.run_time.level, history=max(0, a.run_time.n))
    else:
        why["run_time"] = "no ended run to predict it from"
    adv = a.advice
    return P.RecommendationView(exact=a.exact, family=a.family, identity=a.identity, gpu_mem=_figure(adv.gpu_mem),
                                sm_share=_figure(adv.sm_share), gpus=_figure(adv.gpus), gpu_type=_figure(adv.gpu_type),
                                run_time=run_time, why_not=tuple((k, v[:P.MAX_TEXT_CHARS]) for k, v in why.items()))


def auto_of(req: P.JobRequest, site: tuple[str, ...]) -> set[str]:
    """The resources a submit leaves to its recommendation: those it names, and the site's it does not state."""
    auto = set(req.auto)
    if "gpu_mem" in site and not req.gpu_mem:
        auto.add("gpu_mem")
    if "sm_share" in site and req.sm_share is None:
        auto.add("sm_share")
    return auto


def resolve(req: P.JobRequest, auto: set[str], a: Advised) -> Resolved:
    """What ``auto`` resources of ``req`` become (module docstring)."""
    guaranteed = req.priority == JobClass.GUARANTEED
    out = Resolved(gpu_mem=req.gpu_mem, mem_fallback=None, request_gpu_mem=req.gpu_mem, sm_share=req.sm_share)
    said, learning = [], []
    mem, share = a.advice.gpu_mem, a.advice.sm_share
    if "gpu_mem" in auto and mem is not None:
        cap = int(mem.value)
        out.gpu_mem = cap
        out.advice["gpu_mem"] = cap
        if guaranteed:
            out.mem_fallback, out.request_gpu_mem = 0, cap
        else:
            out.advice["start_mem"] = cap
        said.append(f"gpu-mem {format_size(cap)} ({mem.level}, {mem.history} run(s))")
    elif "gpu_mem" in auto:
        learning.append(f"gpu-mem: {a.advice.why_not.get('gpu_mem', 'no history')}")
    if "sm_share" in auto and share is not None:
        out.advice["sm_share"] = share.value
        if guaranteed:
            out.sm_share = share.value
        else:
            out.advice["start_share"] = share.value
        said.append(f"sm-share {share.value:.2f} ({share.level}, {share.history} run(s))")
    elif "sm_share" in auto:
        learning.append(f"sm-share: {a.advice.why_not.get('sm_share', 'no history')}")
    if learning:
        out.advice["learning"] = True
    out.advice["text"] = "; ".join(said + [f"learning (runs as requested): {w}" for w in learning])[:P.MAX_TEXT_CHARS]
    return out
