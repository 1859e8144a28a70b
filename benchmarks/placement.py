"""Placement policies on the Alibaba traces, fed straight to ``SchedulerCore`` (no simulator).

(b) seed 004 (GA vs First-Fit / Round-Robin / Tetris): the openb pods that ran
    (``openb_pod_list_default.csv``, 7,255 with durations) arrive at their creation times and
    run for their recorded durations on a PAI-shaped cluster: a stratified sample of
    ``pai_machine_spec_with_header.csv`` (every machine group in proportion, file order), small
    enough to be loaded (the pods' concurrent demand peaks at 65 GPUs). Driven by the trace
    simulator (``cluster.sim``): a placed pod starts at once and exits after its duration (no
    co-location slowdown: every pod is guaranteed, shares are exclusive); FIFO queue, gang plugin.
    Reported: GPU allocation (allocated GPU milli over capacity) after each placement, its mean
    over placements and over time, and job completion times (end - submit) and waits.
(c) the FGD paper's method (ATC'23): pods of ``openb_pod_list_default.csv`` (all 8,152, times
    ignored) shuffled with a seed and submitted one at a time, each placed at once or dropped,
    no departures, until the submitted GPU requests reach 1.3x the cluster's GPU capacity
    (``openb_node_list_gpu_node.csv``: 1,213 nodes, 6,212 GPUs); one pass over the pods
    requests only 0.98x, so further passes, each reshuffled, follow (a repeated pod gets a new
    id). Reported: GPU allocation rate against the arrived workload, unallocated GPUs and the
    fragmentation (FGD's measure, with the trace's task types) at the end, over several seeds.

Every pod is submitted as guaranteed (the BE/LS qos of the trace plays no part in either paper).
``--policies`` takes preset names (``cluster.config.PRESETS``). FGD's task-type popularity is the
pod list's (its simulator's typical pods: the most common types covering 95%).

    python benchmarks/placement.py c                  # 5 policies x 10 seeds, ~10 min on 2 cores
    python benchmarks/placement.py b                  # 4 policies, ~2 min
    python benchmarks/placement.py c --seeds 3 --policies fgd,best-fit
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster import events as ev
from cluster.config import PRESETS, parse_config
from cluster.core import SchedulerCore
from cluster.plugins.fgd import TypicalWorkload, fragmentation, type_of, typical
from cluster.plugins.nodetable import NodeTable
from cluster.spec import NodeSpec
from cluster.traces import load_nodes, read_alibaba_pods

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path("/work/shared/traces")
PODS = TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
OPENB_NODES = TRACES / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv"
PAI_NODES = TRACES / "alibaba-pai-v2020" / "pai_machine_spec_with_header.csv"
IMG = ROOT / "docs" / "img"
OUT = ROOT / "out" / "placement"  # raw results (git-ignored)
COVERAGE = 1.0  # FGD task types kept: all (see cluster/plugins/fgd.py)


# ---------------------------------------------------------------- inputs


def load_pods(path: Path, durations: bool) -> list:
    """(JobSpec, duration or None) per pod, every pod guaranteed, in the trace's order."""
    res = read_alibaba_pods(str(path), allow_no_duration=not durations)
    return [(replace(j.spec, klass="guaranteed"), j.duration_s) for j in res.jobs]


def popularity(specs) -> dict[str, float]:
    """FGD's task types of a pod list, as the ``popularity`` parameter."""
    counts = Counter(type_of(s) for s in specs)
    return {f"{c}:{g}:{m}" + (f":{mod}" if mod else ""): float(n) for (c, g, m, mod), n in counts.items()}


def config(policy: str, specs, generations: int | None = None):
    """The preset's config; ``fgd`` gets the pod list's task types (``fgd@0.95``: keep the most
    popular types covering 95% of the pods, as the FGD simulator's typical pods)."""
    name, _, cover = policy.partition("@")
    raw = json.loads(json.dumps(PRESETS[name]))
    if "fgd" in raw["plugins"]:
        raw.setdefault("plugin", {})["fgd"] = {"popularity": popularity(specs), "coverage": float(cover or COVERAGE)}
    if "genetic" in raw["plugins"] and generations is not None:
        raw.setdefault("plugin", {}).setdefault("genetic", {})["generations"] = generations
    return parse_config(raw, name)


def pai_sample(machines: int) -> list[NodeSpec]:
    """A stratified sample of the PAI machine table: each (GPUs, model, CPU, memory) group gets
    its share of ``machines`` (largest remainder), its first machines in file order; groups in
    file order."""
    nodes = load_nodes(str(PAI_NODES)).nodes
    groups: dict[tuple, list[NodeSpec]] = {}
    for n in nodes:
        groups.setdefault((n.gpus, n.gpu_model, n.cpu_milli, n.mem_mib), []).append(n)
    total = len(nodes)
    exact = {k: machines * len(v) / total for k, v in groups.items()}
    take = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: -(exact[k] - take[k]))[:machines - sum(take.values())]:
        take[k] += 1
    return [n for k, v in groups.items() for n in v[:take[k]]]


def fits_some(spec, nodes) -> bool:
    """Whether one worker of ``spec`` fits some empty node (5 openb pods, 8 GPUs with 120 cores,
    fit no PAI machine: they would block a FIFO queue for ever)."""
    return any(n.gpus >= spec.gpus and n.cpu_milli >= spec.cpu_milli and n.mem_mib >= spec.mem_mib for n in nodes)


def capacity_milli(nodes) -> int:
    return sum(n.gpus for n in nodes) * 1000


def allocated_milli(core: SchedulerCore) -> int:
    return sum(g.milli for n in core.state.nodes.values() for g in n.gpus)


def frag_milli(core: SchedulerCore, wl: TypicalWorkload) -> float:
    table = NodeTable()
    table.sync(core.state)
    return float(fragmentation(table, wl).sum())


# ---------------------------------------------------------------- (c) FGD method


def arrivals(pods, seed: int, target_milli: float) -> list:
    """Shuffled passes over the pods until their GPU requests reach ``target_milli``."""
    rng = random.Random(seed)
    out, total, rnd = [], 0, 0
    while total < target_milli:
        order = list(range(len(pods)))
        rng.shuffle(order)
        for i in order:
            spec = pods[i]
            if rnd:
                spec = replace(spec, job_id=f"{spec.job_id}#{rnd}")
            out.append(spec)
            total += spec.total_milli if spec.gpus else 0
            if total >= target_milli:
                break
        rnd += 1
    return out


def run_c(job: tuple) -> dict:
    policy, seed, ratio = job
    pods = [s for s, _ in load_pods(PODS, durations=False)]
    nodes = load_nodes(str(OPENB_NODES)).nodes
    cap = capacity_milli(nodes)
    wl = TypicalWorkload(typical(Counter(type_of(s) for s in pods), COVERAGE))
    core = SchedulerCore(config(policy, pods), random.Random(seed))
    core.handle_batch([ev.NodeJoined(n, 1) for n in nodes], 0.0)
    arrived = alloc = 0
    failed = 0
    curve, frag_curve = [], []
    step = 1
    t0 = time.perf_counter()
    for i, spec in enumerate(arrivals(pods, seed, ratio * cap)):
        out = core.handle(ev.JobSubmitted(spec), float(i))
        demand = spec.total_milli if spec.gpus else 0
        arrived += demand
        if any(isinstance(d, ev.StartWorkers) for d in out):
            alloc += demand
        else:
            failed += 1
            core.handle(ev.JobCancelled(spec.job_id), float(i))
        while arrived >= step * cap / 100:
            curve.append((step, 100.0 * alloc / cap))
            if step % 10 == 0:
                frag_curve.append((step, frag_milli(core, wl) / 1000))
            step += 1
    seconds = time.perf_counter() - t0
    assert alloc == allocated_milli(core)
    core.state.check_invariants()
    frag = frag_milli(core, wl)
    free = cap - alloc
    return {"policy": policy, "seed": seed, "alloc_pct": 100.0 * alloc / cap, "unalloc_gpus": free / 1000,
            "frag_gpus": frag / 1000, "frag_pct_of_free": 100.0 * frag / free if free else 0.0,
            "failed": failed, "pods": i + 1, "curve": curve, "frag_curve": frag_curve, "seconds": seconds}


# ---------------------------------------------------------------- (b) seed 004


def run_b_pack(job: tuple) -> dict:
    """Fig. 3 of seed 004 without departures: every pod in creation-time order, placed at once or
    dropped, on a PAI sample; GPU allocation after each task scheduled."""
    policy, machines, generations, seed = job
    nodes = pai_sample(machines)
    pods = [s for s, _ in load_pods(PODS, durations=False) if fits_some(s, nodes)]
    cap = capacity_milli(nodes)
    core = SchedulerCore(config(policy, pods, generations), random.Random(seed))
    core.handle_batch([ev.NodeJoined(n, 1) for n in nodes], 0.0)
    alloc = placed = 0
    curve = []
    t0 = time.perf_counter()
    for spec in pods:
        out = core.handle(ev.JobSubmitted(spec), spec.submit_time)
        if any(isinstance(d, ev.StartWorkers) for d in out):
            placed += 1
            alloc += spec.total_milli if spec.gpus else 0
            curve.append((placed, 100.0 * alloc / cap))
        else:
            core.handle(ev.JobCancelled(spec.job_id), spec.submit_time)
    seconds = time.perf_counter() - t0
    assert alloc == allocated_milli(core)
    core.state.check_invariants()
    return {"policy": policy, "seed": seed, "machines": len(nodes), "gpus": cap // 1000, "pods": len(pods),
            "placed": placed,
            "alloc_pct": 100.0 * alloc / cap, "curve": curve[::max(1, len(curve) // 2000)] + curve[-1:],
            "seconds": seconds}


def run_b(job: tuple) -> dict:
    """One policy through the trace simulator (``cluster.sim``): exclusive guaranteed jobs (rate 1,
    no co-location model), workers start at once and end after their recorded duration."""
    from cluster.sim import ColocationModel, JobInput, LucidTable, Simulation, job_rows, summarize

    policy, machines, generations, seed = job
    nodes = pai_sample(machines)
    pods = [(s, d) for s, d in load_pods(PODS, durations=True) if fits_some(s, nodes)]
    cap = capacity_milli(nodes)
    core = SchedulerCore(config(policy, [s for s, _ in pods], generations), random.Random(seed))
    jobs = [JobInput(s, d, -1, 1.0, "guaranteed") for s, d in pods]
    curve = []  # (tasks scheduled so far, GPU allocation % after the batch that placed them)
    placed = [0]

    def observe(sim, now, events, out):
        n = sum(1 for d in out if isinstance(d, ev.StartWorkers))
        if n:
            placed[0] += n
            curve.append((placed[0], 100.0 * sim.alloc_milli / cap))

    t0 = time.perf_counter()
    sim = Simulation(core, jobs, nodes, ColocationModel(LucidTable.empty()), observer=observe).run()
    seconds = time.perf_counter() - t0
    core.state.check_invariants()
    rows = job_rows(sim)
    summ = summarize(sim, policy, rows)
    jct = sorted(r["jct_s"] for r in rows if r["jct_s"] is not None)
    wait = sorted(r["queue_delay_s"] for r in rows if r["queue_delay_s"] is not None)
    return {"policy": policy, "seed": seed, "machines": len(nodes), "gpus": cap // 1000, "pods": len(pods),
            "placed": curve[-1][0] if curve else 0,
            "finished": summ["succeeded"], "mean_alloc_placements": statistics.fmean(u for _, u in curve),
            "mean_alloc_time": 100.0 * summ["gpu_allocation_rate"],
            "curve": curve[::max(1, len(curve) // 2000)],
            "jct_mean": statistics.fmean(jct), "jct_median": statistics.median(jct),
            "jct_p95": jct[int(0.95 * (len(jct) - 1))], "wait_mean": statistics.fmean(wait),
            "wait_p95": wait[int(0.95 * (len(wait) - 1))], "seconds": seconds}


# ---------------------------------------------------------------- report


def spread(values: list[float], digits: int = 2) -> str:
    m = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{m:,.{digits}f} ± {sd:,.{digits}f}"


def report_c(results: list[dict], policies: list[str]) -> str:
    lines = ["| policy | GPU allocation % | unallocated GPUs | fragmentation (GPUs) | frag. % of free | pods dropped | s/run |",
             "|---|---|---|---|---|---|---|"]
    for pol in policies:
        rs = [r for r in results if r["policy"] == pol]
        lines.append(f"| {pol} | {spread([r['alloc_pct'] for r in rs])} | {spread([r['unalloc_gpus'] for r in rs])} | "
                     f"{spread([r['frag_gpus'] for r in rs])} | {spread([r['frag_pct_of_free'] for r in rs])} | "
                     f"{spread([r['failed'] for r in rs])} | {statistics.fmean(r['seconds'] for r in rs):.1f} |")
    return "\n".join(lines)


def by_policy(results: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in results:
        out.setdefault(r["policy"], []).append(r)
    return out


def report_b(pack: list[dict], sim: list[dict]) -> str:
    seeds = len({r["seed"] for r in pack})
    lines = [f"Packing, no departures ({pack[0]['machines']} PAI machines, {pack[0]['gpus']} GPUs, {pack[0]['pods']} pods in "
             f"creation order; mean ± sd over {seeds} core seeds, only the GA draws from them):", "",
             "| policy | GPU allocation at the end % | tasks scheduled | allocation after 2,000 / 4,000 tasks % | s/run |",
             "|---|---|---|---|---|"]
    for pol, rs in by_policy(pack).items():
        near = [[next((u for j, u in r["curve"] if j >= k), float("nan")) for r in rs] for k in (2000, 4000)]
        lines.append(f"| {pol} | {spread([r['alloc_pct'] for r in rs])} | {spread([r['placed'] for r in rs], 0)} | "
                     f"{statistics.fmean(near[0]):.1f} / {statistics.fmean(near[1]):.1f} | "
                     f"{statistics.fmean(r['seconds'] for r in rs):.1f} |")
    lines += ["", f"With departures, trace simulator ({sim[0]['machines']} PAI machines, {sim[0]['gpus']} GPUs, "
              f"{sim[0]['pods']} pods at their creation times; mean ± sd over {seeds} seeds):", "",
              "| policy | mean allocation % (over time) | mean allocation % (after each placement) | JCT mean (s) | "
              "JCT median / p95 (s) | queue delay mean / p95 (s) | s/run |", "|---|---|---|---|---|---|---|"]
    for pol, rs in by_policy(sim).items():
        m = lambda key: statistics.fmean(r[key] for r in rs)  # noqa: B023 (used in this iteration)
        lines.append(f"| {pol} | {spread([r['mean_alloc_time'] for r in rs])} | {spread([r['mean_alloc_placements'] for r in rs])} | "
                     f"{spread([r['jct_mean'] for r in rs], 0)} | {m('jct_median'):.0f} / {m('jct_p95'):.0f} | "
                     f"{m('wait_mean'):.0f} / {m('wait_p95'):.0f} | {m('seconds'):.1f} |")
    return "\n".join(lines)


def plot_c(results: list[dict], policies: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for pol in policies:
        rs = [r for r in results if r["policy"] == pol]
        n = min(len(r["curve"]) for r in rs)
        x = [p for p, _ in rs[0]["curve"][:n]]
        ys = np.array([[a for _, a in r["curve"][:n]] for r in rs])
        line, = ax.plot(x, ys.mean(axis=0), label=pol)
        ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)
        ax2.plot(x, ys.mean(axis=0), color=line.get_color(), label=pol)
        ax2.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)
    ax.plot([0, 100], [0, 100], ":", color="grey", lw=0.8)
    ax.set(xlabel="arrived workload (% of cluster GPU capacity)", ylabel="GPU allocation rate (%)",
           title="(c) openb default on openb GPU nodes, no departures")
    ax2.set(xlim=(80, 130), ylim=(80, 100), xlabel="arrived workload (%)", ylabel="GPU allocation rate (%)",
            title=f"zoom; line: mean of {len(rs)} seeds, band: min..max")
    ax.legend(loc="lower right")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_b(pack: list[dict], sim: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [3, 3, 2]})
    pack = [rs[0] for rs in by_policy(pack).values()]  # the first seed's run of each policy
    sim = [rs[0] for rs in by_policy(sim).values()]
    for r in pack:
        ax.plot([k for k, _ in r["curve"]], [u for _, u in r["curve"]], label=f"{r['policy']} ({r['alloc_pct']:.1f}%)")
    ax.set(xlabel="tasks scheduled", ylabel="GPU allocation after scheduling (%)",
           title=f"no departures: {pack[0]['machines']} PAI machines ({pack[0]['gpus']} GPUs)")
    ax.legend(loc="lower right", fontsize=8)
    for r in sim:
        xs, ys = [k for k, _ in r["curve"]], [u for _, u in r["curve"]]
        w = max(1, len(ys) // 100)
        smooth = [sum(ys[max(0, i - w):i + 1]) / len(ys[max(0, i - w):i + 1]) for i in range(len(ys))]
        ax2.plot(xs, smooth, lw=0.9, label=f"{r['policy']} (time avg {r['mean_alloc_time']:.1f}%)")
    ax2.set(xlabel="tasks scheduled", ylabel="GPU allocation after scheduling (%), running mean",
            title=f"with departures: {sim[0]['machines']} PAI machines ({sim[0]['gpus']} GPUs)")
    ax2.legend(loc="upper left", fontsize=8)
    names = [r["policy"] for r in sim]
    x = range(len(names))
    ax3.bar([i - 0.2 for i in x], [r["jct_mean"] / 3600 for r in sim], width=0.4, label="mean")
    ax3.bar([i + 0.2 for i in x], [r["jct_p95"] / 3600 for r in sim], width=0.4, label="p95")
    ax3.set_xticks(list(x), names, rotation=20)
    ax3.set_yscale("log")
    ax3.set(ylabel="job completion time (h, log scale)", title="JCT (end - submit), with departures")
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("c", help="the FGD paper's method")
    c.add_argument("--policies", default="fgd,best-fit,first-fit,tetris,round-robin")
    c.add_argument("--seeds", type=int, default=10, help="seeds 42.. (the FGD artifact's)")
    c.add_argument("--ratio", type=float, default=1.3)
    b = sub.add_parser("b", help="seed 004's comparison")
    b.add_argument("--policies", default="genetic,genetic-after,first-fit,round-robin,tetris")
    b.add_argument("--machines", type=int, default=20, help="PAI machines in the sample, with departures")
    b.add_argument("--pack-machines", type=int, default=948, help="PAI machines in the sample, no departures")
    b.add_argument("--generations", type=int, default=None, help="GA generations (default: the plugin's)")
    b.add_argument("--seeds", type=int, default=5, help="core seeds 0.. (only the GA draws from them)")
    for p in (b, c):
        p.add_argument("--replot", action="store_true", help="redo the table and plot from the last raw results")
        p.add_argument("--procs", type=int, default=2)
        p.add_argument("--tag", default="", help="suffix of the output files")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    OUT.mkdir(parents=True, exist_ok=True)
    IMG.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    raw = OUT / f"placement_{args.what}{args.tag}.json"
    if args.replot:
        results = json.loads(raw.read_text())
        jobs = []
    if args.what == "c":
        if not args.replot:
            jobs = [(pol, seed, args.ratio) for pol in policies for seed in range(42, 42 + args.seeds)]
            with Pool(args.procs) as pool:
                results = pool.map(run_c, jobs, chunksize=1)
        policies = list(dict.fromkeys(r["policy"] for r in results))
        table = report_c(results, policies)
        plot_c(results, policies, IMG / f"placement_c{args.tag}.png")
    else:
        if not args.replot:
            seeds = range(args.seeds)
            jobs = [(pol, args.machines, args.generations, seed) for pol in policies for seed in seeds]
            with Pool(args.procs) as pool:
                sim = pool.map_async(run_b, jobs, chunksize=1)
                pack = pool.map(run_b_pack, [(pol, args.pack_machines, args.generations, seed)
                                             for pol in policies for seed in seeds], chunksize=1)
                sim = sim.get()
            results = {"pack": pack, "sim": sim}
        pack, sim = results["pack"], results["sim"]
        table = report_b(pack, sim)
        plot_b(pack, sim, IMG / f"placement_b{args.tag}.png")
    print(table)
    if not args.replot:
        OUT.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(results))
    print(f"\n{len(jobs)} runs in {time.perf_counter() - t0:.0f} s; raw: {raw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
