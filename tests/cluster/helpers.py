"""Shared helpers for the scheduler-core tests: build a core, drive it, read its decisions."""

from __future__ import annotations

import random

from cluster import events as ev
from cluster.config import parse_config, preset
from cluster.core import SchedulerCore
from cluster.spec import JobSpec, NodeSpec


def config(plugins, **params):
    """A PolicyConfig from plugin names and ``name={param: value}`` tables; ``scheduler=`` too."""
    raw = {"plugins": list(plugins)}
    sched = params.pop("scheduler", None)
    if params:
        raw["plugin"] = params
    if sched:
        raw["scheduler"] = sched
    return parse_config(raw, "test")


def make_core(policy="gang-binpack", nodes=(), seed=0) -> SchedulerCore:
    """A core with ``policy`` (preset name or PolicyConfig) and ``nodes``: NodeSpecs, or
    ``(node_id, gpus)`` / ``(node_id, gpus, gpu_mem)`` tuples, all joined at epoch 1, t=0."""
    cfg = preset(policy) if isinstance(policy, str) else policy
    core = SchedulerCore(cfg, random.Random(seed))
    specs = [n if isinstance(n, NodeSpec) else NodeSpec(n[0], n[1], gpu_mem=n[2] if len(n) > 2 else 0)
             for n in nodes]
    if specs:
        core.handle_batch([ev.NodeJoined(s, 1) for s in specs], 0.0)
    return core


def job(job_id, gpus=1, workers=1, t=0.0, **kw) -> JobSpec:
    return JobSpec(job_id, submit_time=t, workers=workers, gpus=gpus, **kw)


def submit(core, *specs, now=0.0) -> list:
    return core.handle_batch([ev.JobSubmitted(s) for s in specs], now)


def starts(decisions) -> dict:
    """job id -> Placement for every StartWorkers in ``decisions``."""
    return {d.placement.job_id: d.placement for d in decisions if isinstance(d, ev.StartWorkers)}


def stops(decisions) -> list:
    return [d for d in decisions if isinstance(d, ev.StopWorkers)]


def changes(decisions, job_id=None) -> list[str]:
    return [d.state for d in decisions if isinstance(d, ev.JobChanged) and (job_id is None or d.job_id == job_id)]


def start_all(core, decisions, now=1.0) -> list:
    """Report every rank of every StartWorkers in ``decisions`` started."""
    evs = [ev.RankStarted(p.job_id, p.placement_id, s.rank) for p in starts(decisions).values() for s in p.slots]
    return core.handle_batch(evs, now) if evs else []


def run(core, *specs, now=0.0) -> dict:
    """Submit ``specs`` and start whatever gets placed; job id -> Placement."""
    out = submit(core, *specs, now=now)
    start_all(core, out, now)
    return starts(out)


def finish(core, job_id, now, code=0) -> list:
    """Every rank of the job's current placement exits with ``code``."""
    j = core.job(job_id)
    p = j.placement
    return core.handle_batch([ev.RankExited(job_id, p.placement_id, s.rank, code) for s in p.slots], now)


def confirm_stops(core, decisions, now, code=143) -> list:
    """The nodes stop what ``decisions`` asked to stop: every such rank exits."""
    evs = []
    for d in stops(decisions):
        j = core.job(d.job_id)
        placement = core.stopping[d.placement_id].placement if d.placement_id in core.stopping else None
        if placement is None:
            continue
        evs += [ev.RankExited(d.job_id, d.placement_id, s.rank, code) for s in placement.slots if s.node_id in d.nodes]
        assert j is not None
    return core.handle_batch(evs, now) if evs else []


def report(core, node_id, utils=(), mem_used=0, workers=(), epoch=None, now=0.0) -> list:
    """A NodeReport of ``node_id``: per-GPU utilizations, one ``mem_used`` (int or per-GPU list)."""
    node = core.state.nodes[node_id]
    mems = mem_used if isinstance(mem_used, (list, tuple)) else [mem_used] * len(utils)
    gpus = tuple(ev.GpuReport(i, u, m) for i, (u, m) in enumerate(zip(utils, mems)))
    return core.handle(ev.NodeReport(node_id, node.epoch if epoch is None else epoch, gpus, tuple(workers)), now)


def nodes_of(placement) -> list[str]:
    return [s.node_id for s in placement.slots]
