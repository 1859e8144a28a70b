"""The global scheduler's policy core without sockets, at two scales.

Default: 1,000 nodes x 8 GPUs, a 10,000-job queue, one process (~1 min on 2 idle cores).
``--large``: 12,500 nodes x 8 GPUs, a 1,000,000-job queue, each configuration in a fresh process
(its peak RSS is that configuration's own; ~6 min of CPU in all).

(a) placement rate: the mixed queue (1-32 GPUs, multi-worker gangs, some opportunistic) is
    submitted to an empty cluster at once; the core places what fits, every placed job then
    starts and finishes (all its ranks exit 0, one batch per round), and the next cycle places
    more, until every job ran. Reported: submits per second (queued without a cycle), placements
    per second of the first cycle alone, and of the whole drain (every event handled, submits,
    starts and exits included).
(b) a blocked pass: the cluster full of running 8-GPU jobs (GPUs reported busy), the mixed queue
    pending; one scheduling pass (``core.schedule``), median and worst of 20 (wall and process CPU), per
    preset. Only the pass is timed: the decisions of a pass are freed after its clock stops, and the
    setup's (a million JobChanged at --large) before the first pass starts.
(c) (default scale only) decision latency per event: an event-driven run (Poisson arrivals at
    ~90% load, starts 1 s after placement, exits after the job's run time, one node report per
    second), each ``handle`` call timed; p50 and p99.

Every run reports the longest pause of the cyclic garbage collector (``gc.callbacks``, setup
included) and the process's peak RSS (``ru_maxrss``). The benchmark does what a daemon should
(``tune_collector``, ``batch``): young collections as usual, no automatic full collection, and after
each batch it hands the core everything alive is frozen (``gc.freeze``): never scanned again.
``--default-gc`` keeps the interpreter's settings, to compare.

Goals: default (a) >= 10,000 placements/s, (b) <= 10 ms; large: first cycle >= 20,000
placements/s, the drain >= 15,000/s, no collector pause over 50 ms, peak RSS <= 1.5 GB. Times
are wall-clock ``time.perf_counter`` (CPU seconds beside them) on a shared machine: read medians.

    python benchmarks/scheduler_core.py                 # ~1 min
    python benchmarks/scheduler_core.py --large         # ~6 min (CPU), fresh process per row
    python benchmarks/scheduler_core.py --no-write      # print only
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C
from rich.table import Table

from cluster import events as ev
from cluster.config import preset
from cluster.core import SchedulerCore
from cluster.spec import JobSpec, NodeSpec
from colocate.base.vocab import TERMINAL

NODES, GPUS = 1000, 8
# (workers, gpus per worker, weight): 1-32 GPUs, gangs of several workers
SHAPES = [(1, 1, 40), (1, 2, 12), (2, 1, 6), (1, 4, 8), (2, 2, 4), (1, 8, 8), (2, 4, 3), (2, 8, 5),
          (4, 4, 2), (4, 8, 2)]


def make_jobs(n: int, rng: random.Random, opportunistic: float = 0.1, t0: float = 0.0) -> list[JobSpec]:
    shapes = [(w, g) for w, g, k in SHAPES for _ in range(k)]
    out = []
    for i in range(n):
        w, g = rng.choice(shapes)
        opp = rng.random() < opportunistic
        if opp:
            w, g = 1, rng.choice((1, 1, 2))
        out.append(JobSpec(f"j{i}", submit_time=t0 + i * 1e-3, workers=w, gpus=g,
                           klass="opportunistic" if opp else "guaranteed",
                           user=f"u{rng.randrange(50)}", name=f"m{rng.randrange(20)}",
                           estimate_s=float(rng.choice((60, 300, 1800, 7200)))))
    return out


def new_core(policy: str) -> SchedulerCore:
    core = SchedulerCore(preset(policy), random.Random(0))
    core.handle_batch([ev.NodeJoined(NodeSpec(f"n{i:05d}", GPUS), 1) for i in range(NODES)], 0.0)
    return core


class GcWatch:
    """Every collection's pause (``gc.callbacks``): the longest in wall and in CPU time (on a loaded machine
    the wall time of a pause includes waiting for a core), how many, their total."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []  # (wall s, cpu s)
        self._t0 = (0.0, 0.0)
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = clock()
        else:
            self.pauses.append(since(self._t0))

    def summary(self) -> dict:
        return {"gc_n": len(self.pauses), "gc_max_ms": max((w for w, _ in self.pauses), default=0.0) * 1e3,
                "gc_max_cpu_ms": max((c for _, c in self.pauses), default=0.0) * 1e3,
                "gc_total_s": sum(w for w, _ in self.pauses)}


def tune_collector() -> None:
    """The edge's collector settings: young collections as usual (700 new objects, every 10th one
    also the middle generation: a pause bounded by the objects made since), no automatic full
    collection (it would scan every record the core keeps: a million jobs, over a second)."""
    gc.set_threshold(700, 10, 1_000_000)


TUNED = True  # --default-gc: the interpreter's collector settings, no freezing (for comparison)


@contextmanager
def batch():
    """What the edge does after each batch it hands the core (a bulk submit, a cycle, a round of starts
    and exits): every object still alive is frozen (``gc.freeze``): no collection scans them again."""
    try:
        yield
    finally:
        if TUNED:
            gc.freeze()


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(t: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - t[0], time.process_time() - t[1]


def bench_placement(policy: str, n_jobs: int) -> dict:
    core = new_core(policy)
    with batch():
        jobs = make_jobs(n_jobs, random.Random(1), opportunistic=0.1 if core.fw.places("opportunistic") else 0.0)
        subs = [ev.JobSubmitted(s) for s in jobs]
        del jobs
    t = clock()
    with batch():
        core.handle_batch(subs, 1.0, schedule=False)
        del subs
    t_submit, _ = since(t)
    t = clock()
    with batch():
        first = core.schedule(1.0)
    t_first, c_first = since(t)
    pending = [d.placement for d in first if isinstance(d, ev.StartWorkers)]
    del first
    first_placed = len(pending)
    placed, total_t, total_c, rounds, now = first_placed, t_submit + t_first, c_first, 1, 1.0
    while pending and rounds < 10_000:
        now += 1.0
        starts = [ev.RankStarted(p.job_id, p.placement_id, s.rank) for p in pending for s in p.slots]
        exits = [ev.RankExited(p.job_id, p.placement_id, s.rank, 0) for p in pending for s in p.slots]
        del pending
        t = clock()
        with batch():
            core.handle_batch(starts, now)
            del starts
        with batch():  # the exits, then the cycle they free room for: two batches for the edge's collector
            out = core.handle_batch(exits, now + 0.5, schedule=False)
            del exits
        with batch():
            out += core.schedule(now + 0.5)
        dt, dc = since(t)
        total_t += dt
        total_c += dc
        pending = [d.placement for d in out if isinstance(d, ev.StartWorkers)]
        del out
        placed += len(pending)
        rounds += 1
    if n_jobs <= 100_000:
        core.state.check_invariants()
    return {"policy": policy, "submit_s": t_submit, "first_placed": first_placed, "first_s": t_first,
            "first_cpu_s": c_first, "placed": placed, "total_s": total_t, "total_cpu_s": total_c, "rounds": rounds,
            "attempts": core.counters()["attempts"]}


def busy_report(core: SchedulerCore, util: float) -> list:
    gpus = tuple(ev.GpuReport(i, util, 0) for i in range(GPUS))
    return [ev.NodeReport(n, 1, gpus, ()) for n in core.state.nodes]


def bench_blocked(policy: str, n_jobs: int, passes: int = 20) -> dict:
    core = new_core(policy)
    fill = [JobSpec(f"fill{i}", gpus=8, estimate_s=3600.0, user=f"fill{i}") for i in range(NODES)]
    out = core.handle_batch([ev.JobSubmitted(s) for s in fill], 0.0)
    starts = [ev.RankStarted(d.placement.job_id, d.placement.placement_id, 0) for d in out
              if isinstance(d, ev.StartWorkers)]
    core.handle_batch(starts + busy_report(core, 0.95), 1.0)
    with batch():
        jobs = make_jobs(n_jobs, random.Random(2), opportunistic=0.1 if policy == "antman" else 0.0, t0=2.0)
        out = core.handle_batch([ev.JobSubmitted(s) for s in jobs], 2.0)
        assert not any(isinstance(d, ev.StartWorkers) for d in out), "the cluster was expected full"
        del out, jobs  # freed here, not inside the first timed pass
    times, cpu = [], []
    for k in range(passes):
        t0 = clock()
        out = core.schedule(3.0 + k)
        dt, dc = since(t0)
        times.append(dt)
        cpu.append(dc)
        assert not any(isinstance(d, ev.StartWorkers) for d in out)
        del out  # outside the timed region
    c = core.counters()
    return {"policy": policy, "pending": c["pending"], "median_ms": statistics.median(times) * 1e3,
            "max_ms": max(times) * 1e3, "cpu_median_ms": statistics.median(cpu) * 1e3,
            "cpu_max_ms": max(cpu) * 1e3, "queues": len(core.queues())}


def bench_latency(policy: str, n_jobs: int, seed: int = 3) -> dict:
    rng = random.Random(seed)
    core = new_core(policy)
    jobs = make_jobs(n_jobs, rng, opportunistic=0.1 if core.fw.places("opportunistic") else 0.0)
    mean_gpus = sum(s.total_gpus for s in jobs) / len(jobs)
    mean_run = 600.0
    rate = 0.9 * NODES * GPUS / (mean_gpus * mean_run)  # arrivals per second at ~90% load
    heap: list = []
    t = 0.0
    seq = 0
    for s in jobs:
        t += rng.expovariate(rate)
        heap.append((t, seq, ev.JobSubmitted(s)))
        seq += 1
    heapq.heapify(heap)
    runtime = {s.job_id: rng.expovariate(1 / mean_run) + 1 for s in jobs}
    next_report = 1.0
    lat: list[int] = []
    node_ids = list(core.state.nodes)
    done = 0
    placements: dict = {}
    perf = time.perf_counter_ns
    while heap and done < n_jobs:
        now, _, e = heapq.heappop(heap)
        while next_report <= now:  # one node report per simulated second, round robin
            nid = node_ids[int(next_report) % NODES]
            gr = tuple(ev.GpuReport(i, rng.random(), 0) for i in range(GPUS))
            t0 = perf()
            core.handle(ev.NodeReport(nid, 1, gr, ()), next_report)
            lat.append(perf() - t0)
            next_report += 1.0
        t0 = perf()
        out = core.handle(e, now)
        lat.append(perf() - t0)
        for d in out:
            if isinstance(d, ev.StartWorkers):
                p = d.placement
                placements[p.placement_id] = p
                for s in p.slots:
                    seq += 1
                    heapq.heappush(heap, (now + 1.0, seq, ev.RankStarted(p.job_id, p.placement_id, s.rank)))
                    seq += 1
                    heapq.heappush(heap, (now + 1.0 + runtime[p.job_id], seq,
                                          ev.RankExited(p.job_id, p.placement_id, s.rank, 0)))
            elif isinstance(d, ev.JobChanged) and d.state in TERMINAL:
                done += 1
            elif isinstance(d, ev.StopWorkers):  # the nodes stop those workers half a second later
                p = placements.get(d.placement_id)
                for s in (p.slots if p else ()):
                    if s.node_id in d.nodes:
                        seq += 1
                        heapq.heappush(heap, (now + 0.5, seq, ev.RankExited(p.job_id, p.placement_id, s.rank, 143)))
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] / 1e3
    return {"policy": policy, "events": len(lat), "p50_us": q(0.50), "p99_us": q(0.99), "max_us": lat[-1] / 1e3,
            "jobs_done": done, "preemptions": core.counters()["preemptions"]}


BENCHES = {"a": bench_placement, "b": bench_blocked, "c": bench_latency}


def child(kind: str, policy: str, n_jobs: int) -> dict:
    """One configuration in this process: its result with the collector's pauses and the peak RSS."""
    if TUNED:
        tune_collector()
    watch = GcWatch()
    r = BENCHES[kind](policy, n_jobs)
    r.update(watch.summary())
    r["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return r


def run_fresh(kind: str, policy: str, n_jobs: int) -> dict:
    """``child`` in a fresh interpreter."""
    cmd = [sys.executable, __file__, "--child", kind, policy, "--nodes", str(NODES), "--jobs", str(n_jobs)] + (
        [] if TUNED else ["--default-gc"])
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed:\n{res.stderr.strip()}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def gc_cells(r: dict) -> list[str]:
    return [f"{r['gc_max_ms']:.1f} ({r['gc_max_cpu_ms']:.1f})", f"{r['gc_n']}", f"{r['maxrss_mb']:,.0f}"]


def main() -> None:
    global NODES, TUNED
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", action="store_true", help="12,500 nodes, 1,000,000 jobs, a fresh process per row")
    ap.add_argument("--nodes", type=int, default=None, help="nodes of 8 GPUs (default 1,000; --large 12,500)")
    ap.add_argument("--jobs", type=int, default=None, help="queued jobs (default 10,000; --large 1,000,000)")
    ap.add_argument("--latency-jobs", type=int, default=5_000)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    ap.add_argument("--default-gc", action="store_true", help="the interpreter's collector settings, no gc.freeze "
                    "(to compare; implies --no-write)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "POLICY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    TUNED = not args.default_gc
    args.no_write |= args.default_gc
    NODES = args.nodes or (12_500 if args.large else 1_000)
    n_jobs = args.jobs or (1_000_000 if args.large else 10_000)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], n_jobs)))
        return
    con = C.console()
    large = args.large
    goal_first, goal_all = (20_000, 15_000) if large else (10_000, 10_000)
    if large:
        place = [run_fresh("a", p, n_jobs) for p in ("gang-binpack", "antman")]
        blocked = [run_fresh("b", p, n_jobs) for p in ("fifo", "antman")]
        latency = []
    else:
        watch = GcWatch()
        place = [bench_placement(p, n_jobs) for p in ("gang-binpack", "antman")]
        blocked = [bench_blocked(p, n_jobs) for p in ("fifo", "multi-queue", "backfill", "antman", "quota")]
        latency = [bench_latency(p, args.latency_jobs) for p in ("gang-binpack", "antman")]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    t_a = Table(title=f"(a) placing {n_jobs:,} mixed jobs on {NODES:,} x {GPUS} GPUs "
                      f"(goal: first cycle >= {goal_first:,}/s, all >= {goal_all:,}/s)")
    rows_a = []
    for r in place:
        first_rate, all_rate = r["first_placed"] / r["first_s"], r["placed"] / r["total_s"]
        rows_a.append([r["policy"], f"{n_jobs / r['submit_s']:,.0f}", f"{r['first_placed']}", f"{r['first_s'] * 1e3:.0f}",
                       f"{r['first_cpu_s'] * 1e3:.0f}", f"{first_rate:,.0f}",
                       f"{r['first_placed'] / r['first_cpu_s']:,.0f}", f"{r['placed']}", f"{r['rounds']}",
                       f"{r['total_s']:.2f}", f"{r['total_cpu_s']:.2f}", f"{all_rate:,.0f}",
                       f"{r['placed'] / r['total_cpu_s']:,.0f}"]
                      + (gc_cells(r) if large else [])
                      + ["PASS" if first_rate >= goal_first and all_rate >= goal_all else "MISS"])
    hdr_a = ["policy", "submits/s (no cycle)", "first cycle placed", "first cycle ms", "first cycle cpu ms",
             "first cycle placements/s", "per cpu s", "placed in all", "rounds", "all events s", "all events cpu s",
             "placements/s overall", "per cpu s"] + (["longest gc pause ms (cpu ms)", "collections", "peak RSS MB"] if large else []) \
        + ["goal"]
    t_b = Table(title=f"(b) one pass, full cluster, {n_jobs:,} blocked jobs (goal <= 10 ms)")
    hdr_b = ["policy", "pending", "queues", "median ms", "max ms", "cpu median ms", "cpu max ms"] + (
        ["longest gc pause ms (cpu ms)", "collections", "peak RSS MB"] if large else []) + ["<= 10 ms"]
    rows_b = [[r["policy"], f"{r['pending']}", f"{r['queues']}", f"{r['median_ms']:.3f}", f"{r['max_ms']:.3f}",
               f"{r['cpu_median_ms']:.3f}", f"{r['cpu_max_ms']:.3f}"]
              + (gc_cells(r) if large else []) + ["PASS" if r["median_ms"] <= 10 else "MISS"] for r in blocked]
    t_c = Table(title="(c) decision latency per event (handle call)")
    hdr_c = ["policy", "events", "p50 us", "p99 us", "max us", "jobs finished", "preemptions"]
    rows_c = [[r["policy"], f"{r['events']}", f"{r['p50_us']:.1f}", f"{r['p99_us']:.1f}", f"{r['max_us']:.0f}",
               f"{r['jobs_done']}", f"{r['preemptions']}"] for r in latency]
    tables = [(t_a, hdr_a, rows_a), (t_b, hdr_b, rows_b)] + ([(t_c, hdr_c, rows_c)] if latency else [])
    for t, hdr, rows in tables:
        for h in hdr:
            t.add_column(h)
        for row in rows:
            t.add_row(*row)
        con.print(t)
    if not large:
        s = watch.summary()
        con.print(f"longest collector pause {s['gc_max_ms']:.1f} ms ({s['gc_n']} collections), peak RSS {rss:,.0f} MB")
    if args.no_write:
        return
    info = C.machine_info()
    lines = [
        f"## Scheduler policy core ({NODES:,} nodes x {GPUS} GPUs, {n_jobs:,} jobs, no sockets)",
        "",
        *C.machine_lines(info),
        f"- load average after the run (1, 5, 15 min): {load_avg()}; the machine is shared with other sessions",
        f"- command: `{C.invocation()}`",
        "- (a) the whole queue is submitted at once to an empty cluster (timed apart: `handle_batch(..., "
        "schedule=False)`), then one cycle (`core.schedule`) places what fits; each round every placed job starts "
        "and exits 0 (batched events) and the next cycle places more; 'overall' counts every call, submits included. "
        f"Shapes (workers x GPUs): {', '.join(f'{w}x{g}' for w, g, _ in SHAPES)}; 10% opportunistic (1-2 GPUs) "
        "under antman. cpu: process CPU seconds of the same calls.",
        f"- (b) {NODES:,} running 8-GPU jobs fill the cluster, every GPU reported at 0.95 utilization; one "
        "`core.schedule` pass over the blocked queue, 20 passes; only the pass is timed (wall and process CPU), the "
        "decisions of the pass before are freed outside it.",
        "- collector: young collections as usual, no automatic full collection (`gc.set_threshold(700, 10, "
        "1_000_000)`), and after each batch (the bulk submit, a cycle, a round of starts or exits) what is alive is "
        "frozen (`gc.freeze`), as a daemon does after a restore or a bulk submit",
    ]
    if large:
        lines.append("- each row ran in a fresh process: its longest collector pause (`gc.callbacks`, setup included) and "
                     "peak RSS (`ru_maxrss`) are its own")
    else:
        lines += [f"- (c) Poisson arrivals at ~90% load of {args.latency_jobs} jobs, one node report per simulated "
                  "second; each `handle` call timed (perf_counter_ns)",
                  f"- whole run: longest collector pause {s['gc_max_ms']:.1f} ms, peak RSS {rss:,.0f} MB"]
    for _, hdr, rows in tables:
        lines += ["", C.markdown_table(hdr, rows)]
    name = "scheduler_core_large" if large else "scheduler_core"
    C.update_results(name, "\n".join(lines))
    con.print(f"wrote section {name} of {C.RESULTS}")


def load_avg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
