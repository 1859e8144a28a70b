"""Backfill's share of the oracle's gain on statistically equal copies of a trace (issue 25).

``prediction.py`` compares three replays of one trace: FIFO (gang-binpack), backfill on the predictor, and
backfill on the true run times (the oracle). Under overload a weeks-long replay is chaotic: one different
decision early changes every later one. This benchmark measures how much: each *copy* of the trace has every
job's run time multiplied by ``exp(N(0, sigma))`` (sigma 1% by default; copy 0 is the trace itself), and all
three replays run on each copy, so the predictor learns the copy's run times and the oracle knows them. The
share is ``(FIFO - predicted) / (FIFO - oracle)`` per copy; the last rows give, per cluster, the median of the
copies' shares and the share of the copies' mean JCTs. The settings are ``prediction.py``'s ``default``
variant: the backfill preset with progress reports at the simulator's defaults; the oracle without them.

    python benchmarks/backfill_jitter.py                          # Philly at 64x8, copies 0-3: ~25 min on 2 cores
    python benchmarks/backfill_jitter.py --sizes 56x8,64x8 --copies 2 --no-write
    python benchmarks/backfill_jitter.py --trace pai --sizes 4x8 --copies 5
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C
import prediction as B

from cluster.sim.workload import oracle_estimate
from cluster.traces.nodes import parse_shape
from colocate.launcher import _die_with_parent

TRACES = {"philly": B.PHILLY, "pai": B.PAI}
KINDS = ("FIFO", "predicted", "oracle")


def jitter(wl, copy: int, sigma: float):
    """``wl`` with every run time (and an oracle's estimate) times ``exp(N(0, sigma))``, drawn per job in order
    from ``Random(f"jitter:{copy}")``; copy 0 is ``wl`` unchanged."""
    if copy == 0:
        return wl
    rng = random.Random(f"jitter:{copy}")
    jobs = []
    for j in wl.jobs:
        f = math.exp(rng.gauss(0.0, sigma))
        if j.duration is None:
            jobs.append(j)
            continue
        dur = j.duration * f
        spec = j.spec
        if spec.estimate_s is not None:  # the oracle's: the new true run time
            spec = dataclasses.replace(spec, estimate_s=oracle_estimate(dur))
        jobs.append(dataclasses.replace(j, duration=dur, spec=spec))
    return dataclasses.replace(wl, jobs=jobs)


def replay(trace: str, cluster: str, copy: int, sigma: float, kind: str) -> tuple[str, int, str, float, float]:
    """(cluster, copy, kind, mean JCT in s, wall s) of one replay, with ``prediction.py``'s settings for the
    kind; runs in a worker process."""
    t0 = time.perf_counter()
    prepare = partial(jitter, copy=copy, sigma=sigma)
    if kind == "FIFO":
        jct, _ = B.mean_jct(TRACES[trace], cluster, None, plugins=list(B.preset("gang-binpack").plugins),
                            prepare=prepare)
    elif kind == "oracle":  # the true run times: no progress report adds to what they know
        jct, _ = B.mean_jct(TRACES[trace], cluster, {"sim": {"progress_s": 0.0}}, "oracle", prepare=prepare)
    else:
        jct, _ = B.mean_jct(TRACES[trace], cluster, {}, prepare=prepare)
    return cluster, copy, kind, jct, time.perf_counter() - t0


def run_replays(fn, tasks: list[tuple], workers: int, con, t0: float) -> dict[tuple, float]:
    """``fn(*task)`` for every task, ``workers`` at once in worker processes; ``fn`` returns ``(*key, mean JCT in
    s, wall s)``. Key -> mean JCT, with a line on ``con`` as each replay ends (in task order). The workers die
    with this process (a kill -9 of it leaves no replay running)."""
    out: dict[tuple, float] = {}
    with ProcessPoolExecutor(workers, initializer=_die_with_parent(os.getpid())) as pool:
        futures = [pool.submit(fn, *t) for t in tasks]
        for i, fut in enumerate(futures, 1):
            *key, value, wall = fut.result()
            out[tuple(key)] = value
            con.print(f"[{i}/{len(tasks)}] {' '.join(map(str, key))}: mean JCT {value / 3600:.2f} h "
                      f"({wall:.0f} s; {time.perf_counter() - t0:.0f} s so far)")
    return out


def bad_sizes(sizes: list[str]) -> str | None:
    """Why ``sizes`` (cluster shapes) cannot be replayed, in one line; None when each parses."""
    if not sizes:
        return "no cluster shape given"
    for size in sizes:
        try:
            parse_shape(size)
        except ValueError as exc:
            return str(exc)
    return None


def wall_line(t0: float, workers: int) -> str:
    """The RESULTS line of a pool of replays begun at ``t0``: wall time, replays at once, load at the end."""
    return (f"- wall {time.perf_counter() - t0:.0f} s, {workers} replays at once; load average (1 min) at the end "
            f"{os.getloadavg()[0]:.2f}")


def record(args, default_section: str, title: str, info: dict, t0: float, prose: list[str], headers: list[str],
           rows: list[list[str]]) -> None:
    """Unless ``--no-write``: RESULTS.md section ``--section`` (default ``default_section``) of a pool of replays
    begun at ``t0``: ``title``, the command, the machine, the wall line, the ``prose`` lines and the table."""
    if args.no_write:
        return
    body = "\n".join([f"## {title}", "", f"`{C.invocation()}`", "", *C.machine_lines(info),
                      wall_line(t0, args.workers), "", *prose, "", C.markdown_table(headers, rows)])
    C.update_results(args.section or default_section, body)
    print(f"recorded in {C.RESULTS}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="philly", choices=sorted(TRACES), help="which trace (default philly)")
    ap.add_argument("--sizes", default="64x8", help="cluster shapes, comma-separated (default 64x8)")
    ap.add_argument("--copies", type=int, default=3, help="jittered copies besides the trace itself (default 3)")
    ap.add_argument("--sigma", type=float, default=0.01, help="log-normal sigma of the run-time factor (default 0.01)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="replays at once (default 2)")
    ap.add_argument("--section", type=C.section_name, help="the RESULTS.md section to write (default "
                    "backfill-jitter-TRACE)")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()
    if args.copies < 0 or not 0 <= args.sigma <= 1 or args.workers < 1:
        print("backfill_jitter: --copies and --sigma must be >= 0 (sigma <= 1), --workers >= 1", file=sys.stderr)
        return 2
    sizes = [s for s in args.sizes.split(",") if s]
    if (why := bad_sizes(sizes)) is not None:
        print(f"backfill_jitter: --sizes: {why}", file=sys.stderr)
        return 2
    if not TRACES[args.trace].is_file():
        print(f"backfill_jitter: {TRACES[args.trace]}: no such file", file=sys.stderr)
        return 2
    info = C.machine_info()
    con = C.console()
    t0 = time.perf_counter()
    tasks = [(args.trace, size, copy, args.sigma, kind) for size in sizes for copy in range(args.copies + 1)
             for kind in ("predicted", "oracle", "FIFO")]  # the slow ones first
    jct = run_replays(replay, tasks, args.workers, con, t0)
    headers = ["cluster", "copy", "FIFO mean JCT", "backfill (predicted)", "backfill (oracle)",
               "share of oracle's gain"]
    rows: list[list[str]] = []
    for size in sizes:
        shares, means = [], {k: [] for k in KINDS}
        for copy in range(args.copies + 1):
            f, p, o = (jct[(size, copy, k)] for k in KINDS)
            shares.append(B.share_of_gain(f, p, o))
            for k, v in zip(KINDS, (f, p, o)):
                means[k].append(v)
            rows.append([size, str(copy) if copy else "0 (the trace)", f"{f / 3600:.2f} h", f"{p / 3600:.2f} h",
                         f"{o / 3600:.2f} h", f"{shares[-1]:.1%}"])
        m = {k: statistics.fmean(v) for k, v in means.items()}
        rows.append([size, f"median of {len(shares)}", "", "", "", f"{statistics.median(shares):.1%}"])
        rows.append([size, f"mean JCTs of {len(shares)}", f"{m['FIFO'] / 3600:.2f} h", f"{m['predicted'] / 3600:.2f} h",
                     f"{m['oracle'] / 3600:.2f} h", f"{B.share_of_gain(m['FIFO'], m['predicted'], m['oracle']):.1%}"])
    title = f"{args.trace}: backfill on copies with run times x exp(N(0, {args.sigma:g}))"
    con.print(C.rich_table(title, headers, rows, left=("cluster", "copy")))
    about = [f"Each copy multiplies every job's run time by exp(N(0, {args.sigma:g})) (copy 0: the trace itself); FIFO =",
             "gang-binpack, predicted = the backfill preset on the predictor, oracle = backfill on the copy's true run",
             "times. Replays are deterministic: a copy gives the same figures every time."]
    record(args, f"backfill-jitter-{args.trace}", "Backfill's share of the oracle's gain on jittered copies of a trace "
           "(issue 25)", info, t0, about, headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
