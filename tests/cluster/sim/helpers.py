"""Helpers of the simulator tests: synthetic workloads, a small Lucid-format table, runs that
record every batch, and the replay of a recorded run into a fresh core."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from cluster.config import parse_config, preset
from cluster.core import SchedulerCore
from cluster.sim import ColocationModel, JobInput, LucidTable, SimConfig, Workload, run_policy
from cluster.spec import JobSpec, NodeSpec
from cluster.traces import TraceResult, parse_shape
from colocate.base.vocab import TERMINAL

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
PHILLY = TRACES / "philly-pollux" / "philly.csv"
LUCID = TRACES / "measured" / "lucid_colocate_info.csv"
GIB = 1 << 30

# A Lucid-format file with three models; speeds and utilizations chosen so the fitted solo busy
# fractions are exactly A=0.2, B=0.5, C=0.6 (every pair is unsaturated and consistent).
LUCID_HEADER = ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,batchsize2,amp2,speed2," \
               "gpu_util,gmem_util,gmem"
SOLO = {"A": 0.2, "B": 0.5, "C": 0.6}
PAIRS = [("A", 0.9, "B", 0.8), ("A", 1.0, "C", 0.7), ("B", 0.6, "C", 0.5), ("A", 0.95, "A", 0.95),
         ("B", 0.9, "A", 1.2)]  # the last speed is above 1: capped at 1 when read


def lucid_csv(path: Path, pairs=PAIRS) -> Path:
    lines = [LUCID_HEADER]
    for n, (a, sa, b, sb) in enumerate(pairs):
        util = min(1.0, sa, 1.0) * SOLO[a] + min(sb, 1.0) * SOLO[b]
        lines.append(f"{n},{a},D{a},1,32,0,{sa},{b},D{b},1,32,0,{sb},{util * 100:.6f},10,1000")
    path.write_text("\n".join(lines) + "\n")
    return path


def config(plugins, **params):
    """A PolicyConfig from plugin names and ``name={param: value}`` tables."""
    raw = {"plugins": list(plugins)}
    if params:
        raw["plugin"] = params
    return parse_config(raw, "test")


def node_specs(shape: str = "4x4", gpu_mem: int = 0, cpu_milli: int = 0, mem_mib: int = 0) -> list[NodeSpec]:
    return [NodeSpec(n.node_id, n.gpus, gpu_mem=gpu_mem, cpu_milli=cpu_milli, mem_mib=mem_mib)
            for n in parse_shape(shape)]


def job(job_id: str, t: float, duration: float | None, gpus: int = 1, workers: int = 1, busy: float = 0.5,
        cfg: int = -1, **kw) -> JobInput:
    spec = JobSpec(job_id, submit_time=t, workers=workers, gpus=gpus, **kw)
    return JobInput(spec, duration, cfg, busy, spec.klass)


def synth_jobs(n: int = 120, seed: int = 1, *, node_gpus: int = 4, opportunistic: float = 0.25,
               fractional: float = 0.1, host: bool = False, gpu_mem: bool = False, unknown: float = 0.0,
               users: int = 3) -> list[JobInput]:
    """Mixed jobs: gangs of whole GPUs (up to 2 x node_gpus), fractional shares, opportunistic
    jobs, optional CPU/host-memory and GPU-memory requests, ties in submit time."""
    rng = random.Random(seed)
    shapes = [(1, 1), (1, 1), (1, 1), (1, 2), (2, 1), (1, node_gpus), (2, node_gpus), (2, 2)]
    jobs, t = [], 0.0
    for i in range(n):
        if rng.random() < 0.7:
            t += rng.choice((0.0, 5.0, 30.0, 120.0))
        w, g = rng.choice(shapes)
        kw: dict = {"user": f"u{rng.randrange(users)}", "name": f"m{rng.randrange(4)}"}
        if rng.random() < opportunistic:
            kw["klass"] = "opportunistic"
            w, g = 1, rng.choice((1, 1, 2))
        elif rng.random() < fractional:
            w, g = 1, 1
            kw["gpu_milli"] = rng.choice((250, 500, 750))
        if host:
            kw.update(cpu_milli=rng.choice((1000, 4000)), mem_mib=rng.choice((4096, 16384)))
        if gpu_mem:
            kw["gpu_mem"] = rng.choice((2, 6, 10)) * GIB
        dur = None if rng.random() < unknown else float(rng.randrange(20, 3000))
        jobs.append(job(f"j{i:03d}", t, dur, gpus=g, workers=w, busy=rng.choice((0.1, 0.3, 0.6, 0.9)), **kw))
    return jobs


def workload(jobs: list[JobInput], nodes: list[NodeSpec], seed: int = 0) -> Workload:
    return Workload(jobs, nodes, TraceResult("synthetic", "csv", rows=len(jobs)), LucidTable.empty(), seed)


def run(policy, jobs, nodes, *, seed: int = 0, model: ColocationModel | None = None, config: SimConfig | None = None,
        observer=None):
    """(simulation, job rows, summary) of ``policy`` (preset name or PolicyConfig), recorded."""
    cfg = preset(policy) if isinstance(policy, str) else policy
    config = config or SimConfig(record=True)
    model = model or ColocationModel(LucidTable.empty())
    return run_policy(workload(jobs, nodes, seed), cfg.name, cfg, model, config, observer=observer)


def replay(log, policy, seed: int = 0) -> list[tuple]:
    """Feed the recorded (time, events) steps into a fresh core as the live server does (one
    ``handle`` per lone event, ``handle_batch`` per step of several) and return its decisions."""
    cfg = preset(policy) if isinstance(policy, str) else policy
    core = SchedulerCore(cfg, random.Random(seed))
    out = []
    for t, events, _ in log:
        out.append(tuple(core.handle(events[0], t) if len(events) == 1 else core.handle_batch(events, t)))
    return out


def terminal_counts(log) -> Counter:
    """job id -> number of terminal JobChanged decisions in a recorded run."""
    from cluster.events import JobChanged

    return Counter(d.job_id for _, _, out in log for d in out if isinstance(d, JobChanged) and d.state in TERMINAL)


def stable(summary: dict) -> dict:
    """A summary without the wall-clock fields."""
    return {k: v for k, v in summary.items() if k not in ("sim_wall_s", "load_wall_s", "jobs_per_s")}
