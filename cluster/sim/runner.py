"""Running a workload through several policies and writing the results (what ``colocate
simulate`` calls).

``simulate(options, progress=None) -> list[dict]`` resolves the policies (presets or TOML files),
loads the co-location data, the trace and the cluster once, runs each policy on a fresh
``SchedulerCore`` seeded with ``random.Random(seed)``, and writes to ``options.out``:
``summary.json`` (a list, one object per policy), ``jobs-POLICY.csv`` per policy, ``cdf.png``,
``timeline.png`` and the series it plots, ``timeline.csv``. Bad options and unreadable files raise one-line ``ValueError``s before any
run, and before ``options.out`` is created (it is made only once the trace, the cluster and the topology are read);
an empty ``out`` is a bad option (None writes nothing). Bad trace rows and bad node-list rows are counted
(``skipped_rows``, ``skipped_node_rows``), never raised.

A policy that places no opportunistic work (no plugin serves that class) runs every job as
guaranteed, i.e. exclusively; reports keep each job's trace class.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster.config import PolicyConfig
from cluster.config_file import resolve
from cluster.core import SchedulerCore
from cluster.sim.colocation import ColocationModel, LucidTable, default_lucid_path
from cluster.sim.engine import SimConfig, Simulation, collector_paused
from cluster.sim.metrics import job_rows, summarize, write_jobs_csv
from cluster.sim.network import check_labels
from cluster.sim.workload import Workload, load_workload
from cluster.traces.topology import load_topology
from colocate.base.vocab import JobClass


@dataclass
class SimOptions:
    trace: str
    policies: list[str]
    out: str | None = None  # None: write nothing ("" is refused: an empty path)
    format: str | None = None
    nodes: str | None = None
    cluster: str | None = None
    config: str | None = None  # one more policy from a TOML file
    seed: int = 0
    limit: int | None = None
    node_gpus: int | None = None  # GPUs per worker of a split trace job; None: the largest node's GPUs
    opportunistic_fraction: float | None = None
    estimates: str = "predicted"
    user_factor: float = 2.0
    user_noise: float = 0.8
    queues: str = "default"
    allow_no_duration: bool = False
    sharing: str = "adaptive"
    colocation_data: str | None = None  # Lucid CSV; None: default lookup; "none": no data
    sim: SimConfig = field(default_factory=SimConfig)
    plots: bool = True
    topology: str | None = None  # SxN shape or CSV file: the nodes' switches and racks (cluster.traces.topology)


def resolve_policies(names: list[str], config: str | None = None) -> list[tuple[str, PolicyConfig]]:
    """(display name, config) per policy, in order; ValueError for unknown or repeated ones."""
    out: list[tuple[str, PolicyConfig]] = []
    for n in [x.strip() for x in names if x.strip()] + ([config] if config else []):
        cfg = resolve(n)
        name = cfg.name if not n.endswith(".toml") else Path(n).stem
        if name in {x for x, _ in out}:
            raise ValueError(f"policy {name!r} given twice")
        out.append((name, cfg))
    if not out:
        raise ValueError("no policy given (--policy NAME[,NAME...] or --config FILE)")
    return out


def load_table(path: str | None) -> LucidTable:
    if path is not None and path.lower() == "none":
        return LucidTable.empty()
    p = Path(path) if path else default_lucid_path()
    if p is None:
        return LucidTable.empty()
    return LucidTable.load(p)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "policy"


def run_policy(workload: Workload, name: str, cfg: PolicyConfig, model: ColocationModel,
               sim_config: SimConfig | None = None, progress=None, observer=None,
               _cache: dict | None = None) -> tuple[Simulation, list[dict], dict]:
    """One policy over ``workload``: (finished simulation, job rows, summary)."""
    core = SchedulerCore(cfg, random.Random(workload.seed))
    if core.fw.places(JobClass.OPPORTUNISTIC):
        jobs = workload.jobs
    else:
        cache = _cache if _cache is not None else {}
        if JobClass.GUARANTEED not in cache:
            cache[JobClass.GUARANTEED] = workload.as_guaranteed()
        jobs = cache[JobClass.GUARANTEED]
    cb = (lambda done, total: progress(name, done, total)) if progress else None
    with collector_paused():
        sim = Simulation(core, jobs, workload.nodes, model, sim_config, cb, observer).run()
        rows = job_rows(sim)
        summary = summarize(sim, name, rows, dict(workload.trace.skipped), workload.load_wall_s,
                            skipped_nodes=workload.node_skipped)
    return sim, rows, summary


def simulate(opts: SimOptions, progress=None) -> list[dict]:
    """Run every policy of ``opts``; write the outputs when ``opts.out`` is set. ``progress``:
    ``progress(policy, finished_jobs, total_jobs)``. The collector is paused throughout (``collector_paused``)."""
    with collector_paused():
        return _simulate(opts, progress)


def _simulate(opts: SimOptions, progress=None) -> list[dict]:
    policies = resolve_policies(opts.policies, opts.config)
    table = load_table(opts.colocation_data)
    model = ColocationModel(table, opts.sharing)
    if opts.out is not None and not str(opts.out):
        raise ValueError("--out: an empty path (name a directory for the results)")
    out = Path(opts.out) if opts.out is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    wl = load_workload(opts.trace, format=opts.format, nodes=opts.nodes, cluster=opts.cluster, seed=opts.seed,
                       limit=opts.limit, node_gpus=opts.node_gpus, opportunistic_fraction=opts.opportunistic_fraction,
                       estimates=opts.estimates, user_factor=opts.user_factor, user_noise=opts.user_noise,
                       queues=opts.queues, allow_no_duration=opts.allow_no_duration, table=table)
    if not wl.jobs:
        raise ValueError(f"{opts.trace}: no usable jobs ({sum(wl.trace.skipped.values())} bad rows)")
    if opts.topology:
        wl.nodes = load_topology(opts.topology, wl.nodes)
    check_labels(opts.sim.spread, wl.nodes)
    if out is not None:  # made only once every input has been read: a run refused on its input leaves nothing
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {out}: cannot create it: {exc.strerror}") from None
    setup = {"trace": str(opts.trace), "format": wl.trace.format, "cluster": wl.node_source, "gpus": wl.gpus,
             "seed": opts.seed, "estimates": opts.estimates, "sharing": opts.sharing, "queues": opts.queues,
             "opportunistic_fraction": opts.opportunistic_fraction, "limit": opts.limit,
             "colocation_data": table.path or None, "trace_rows": wl.trace.rows, "topology": opts.topology,
             "spread": str(opts.sim.spread)}
    summaries, cdf_in, timeline_in = [], [], []
    cache: dict = {}
    for name, cfg in policies:
        sim, rows, summary = run_policy(wl, name, cfg, model, opts.sim, progress, _cache=cache)
        summary["setup"] = setup
        summaries.append(summary)
        if out is not None:
            write_jobs_csv(rows, out / f"jobs-{safe_name(name)}.csv")
        cdf_in.append((name, rows))
        timeline_in.append((name, sim.samples))
    if out is not None:
        (out / "summary.json").write_text(json.dumps(finite(summaries), indent=2) + "\n")
        write_timeline(timeline_in, out / "timeline.csv")
        if opts.plots:
            from cluster.sim.plots import plot_cdfs, plot_timeline
            title = f"{Path(opts.trace).name} on {wl.node_source} ({wl.gpus} GPUs), seed {opts.seed}"
            plot_cdfs(cdf_in, out / "cdf.png", title)
            plot_timeline(timeline_in, wl.gpus, out / "timeline.png", title)
    return summaries


def write_timeline(results: list[tuple[str, list[tuple]]], path: Path) -> None:
    """The plotted time series: one row per sample and policy."""
    with open(path, "w") as f:
        f.write("policy,t_s,pending_jobs,allocated_gpus,busy_gpus,running_jobs\n")
        for name, samples in results:
            for t, pending, alloc, busy, running in samples:
                f.write(f"{name},{t:.1f},{pending},{alloc:.3f},{max(busy, 0.0):.3f},{running}\n")


def finite(o):
    """``o`` with non-finite floats as None (strict JSON)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o
