"""``colocate simulate``: replay a cluster trace through the scheduler's own policies.

A thin command: it parses the options, calls ``cluster.sim.simulate`` (the discrete-event engine
driving the real ``SchedulerCore`` and plugins; see docs/simulator.md), shows a progress bar
(jobs finished / total, per policy) and prints the summary as a table. Results go to ``--out``:
``summary.json``, ``jobs-POLICY.csv``, ``cdf.png``, ``timeline.png`` (+ ``timeline.csv``). Bad options or files exit 2
with one line; a bad trace row is counted in ``skipped_rows``, a bad node-list row in ``skipped_node_rows``, never a
traceback. The table's done, failed (placed, then failed), dropped (never started) and unfinished columns add up to
the jobs; the reasons of the dropped and the failed jobs follow it, one line each per policy.
"""

from __future__ import annotations

import argparse
import gc
import sys

from colocate.base.vocab import JobState
from colocate.cli._common import POSITIVE_INT as COUNT
from colocate.cli._common import argtype, fail

EPILOG = """\
examples:
  colocate simulate --trace ../shared/traces/philly-pollux/philly.csv --cluster 128x8 \\
      --policy fifo,multi-queue,backfill --out results/philly
  colocate simulate --trace philly.csv --cluster 64x8 --policy multi-queue,antman \\
      --opportunistic-fraction 0.2 --out results/antman
  colocate simulate --trace openb_pod_list_default.csv --nodes openb_node_list_gpu_node.csv \\
      --policy gang-binpack --out results/alibaba

policies: a preset name (fifo, gang-binpack, multi-queue, backfill, antman, quota, ...) or a
TOML policy file; a policy that places no opportunistic jobs runs every job as guaranteed.
Philly has no classes or run-time estimates (a job's user is its virtual cluster): --opportunistic-fraction
labels a seeded share of jobs opportunistic; --estimates says what backfill knows of run times.
"""


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"must be a number in [0, 1], got {text}")
    return v


def _number(lo: float, what: str, hi: float = float("inf")):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"must be {what}, got {text!r}") from None
        if not lo <= v <= hi or v == float("inf"):  # also NaN
            raise ValueError(f"must be {what}, got {text}")
        return v

    return parse


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None


FRACTION = argtype(_fraction, "fraction")
SECONDS = argtype(_number(0.0, "a number of seconds >= 0"), "seconds")
FACTOR = argtype(_number(1e-6, "a number in [1e-6, 1e6]", 1e6), "factor")
SIGMA = argtype(_number(0.0, "a number in [0, 10]", 10.0), "sigma")
SEED = argtype(_seed, "seed")


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="replay a cluster trace through the scheduler's policies (trace-driven simulator)",
        description="Replay a job trace through the scheduler's own policy code on simulated time and report "
        "job completion times, queueing delays, GPU allocation and (modelled) utilization per policy.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", required=True, metavar="PATH", help="the job trace (CSV)")
    p.add_argument("--format", choices=("philly", "alibaba2023", "pai2020", "csv"), default=None,
                   help="trace format (default: guessed from the header)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--nodes", metavar="PATH", help="node list file (Alibaba 2023, PAI 2020 or generic CSV)")
    where.add_argument("--cluster", metavar="SHAPE", help="cluster shape: NxG[:MODEL[:GPU_MEM]] groups joined by +, "
                       "e.g. 64x8 or 32x8:V100:32GiB+16x2:T4 (a MODEL is 1-64 letters, digits or ._-)")
    p.add_argument("--policy", default="", metavar="NAME[,NAME...]",
                   help="policies to compare: preset names or TOML files, comma-separated")
    p.add_argument("--config", metavar="FILE", help="one more policy from a TOML file (named by the file)")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write summary.json, jobs-*.csv and plots")
    p.add_argument("--seed", type=SEED, default=0, metavar="N",
                   help="seed of every random choice (policies, class labels, estimates, model mapping); default 0")
    p.add_argument("--limit", type=COUNT, default=None, metavar="N", help="only the first N jobs by submit time")
    p.add_argument("--node-gpus", type=COUNT, default=None, metavar="G",
                   help="GPUs per worker when splitting a trace job into a gang (Philly, csv); default: the GPUs "
                   "of the cluster's largest node")
    p.add_argument("--opportunistic-fraction", type=FRACTION, default=None, metavar="F",
                   help="label a seeded share F of the jobs opportunistic (Philly has no classes; AntMan study)")
    p.add_argument("--estimates", choices=("oracle", "user", "predicted"), default="predicted",
                   help="run-time estimates for backfill: oracle = the true duration; user = the trace's estimate, "
                   "else the true duration times a seeded lognormal over-estimate (median --user-factor, "
                   "sigma --user-noise); predicted = none, the predictor plugin learns from history (default)")
    p.add_argument("--user-factor", type=FACTOR, default=2.0, metavar="X",
                   help="median user over-estimate factor for --estimates user (default 2)")
    p.add_argument("--user-noise", type=SIGMA, default=0.8, metavar="SIGMA",
                   help="sigma of the lognormal user estimate noise (default 0.8)")
    p.add_argument("--queues", choices=("default", "trace"), default="default",
                   help="default: every job in queue 'default' (the presets know no other); trace: keep the "
                   "trace's queue column (Philly: the virtual cluster)")
    p.add_argument("--allow-no-duration", action="store_true",
                   help="keep jobs without a duration (Alibaba pods never scheduled); they never finish")
    p.add_argument("--sharing", choices=("adaptive", "pack"), default="adaptive",
                   help="how nodes share a GPU between co-located jobs: adaptive = colocate's node policy "
                   "(guaranteed job keeps ~0.99, opportunistic fills ~0.74 of its idle time; measured), "
                   "pack = unmanaged, Lucid's measured pair speeds (default adaptive)")
    p.add_argument("--colocation-data", metavar="PATH",
                   help="Lucid lucid_colocate_info.csv (default: $COLOCATE_LUCID_CSV, else "
                   "shared/traces/measured/lucid_colocate_info.csv in or above the working directory or the "
                   "installed package: a warning says when none is found); 'none': no data, every job counts as "
                   "fully busy")
    p.add_argument("--start-delay", type=SECONDS, default=0.0, metavar="S",
                   help="seconds from a start decision to the workers running (default 0); a delay past the "
                   "policy's start_timeout_s (300 s by default) fails every start: the job is retried, then "
                   "fails")
    p.add_argument("--stop-delay", type=SECONDS, default=0.0, metavar="S",
                   help="seconds from a stop decision to the workers' exit (default 0)")
    p.add_argument("--restart-overhead", type=SECONDS, default=0.0, metavar="S",
                   help="solo seconds of work a stopped job redoes when it starts again (default 0: resumes "
                   "exactly from a checkpoint)")
    p.add_argument("--tick", type=SECONDS, default=None, metavar="S",
                   help="tick period when a policy is time-driven, e.g. promotion (default 30; 0: never)")
    p.add_argument("--reports", choices=("auto", "always", "never"), default="auto",
                   help="node utilization reports: auto = when a policy places opportunistic work (default)")
    p.add_argument("--progress-every", type=SECONDS, default=600.0, metavar="S",
                   help="a running job reports its iterations S seconds after it starts, then each time its run "
                        "time doubles; read by the predictor (backfill's remaining time). Default 600; 0: never")
    p.add_argument("--known-total", type=FRACTION, default=0.5, metavar="F",
                   help="share of jobs whose total iteration count is known (a --iterations hint, or a "
                        "DataLoader's length x epochs); traces do not say, so jobs are picked by a hash of their "
                        "id; only they report progress (default 0.5)")
    p.add_argument("--topology", default=None, metavar="SxN|FILE.csv",
                   help="switches and racks of the nodes: SxN = S switches of N consecutive nodes (SxN/R: R switches "
                        "per rack), or a CSV node_id,switch[,rack]; read by the topology plugin and --spread")
    p.add_argument("--spread", default="none", metavar="MODEL",
                   help="how much slower a gang runs spread out: none (default), published (docs/simulator.md) or "
                        "node=F,switch=F[,rack=F] (step-time factors from 1 to 100)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args) -> int:
    # The command ends with the run: the collector stays off throughout (``simulate`` pauses it anyway) and what
    # the run made is frozen when the command returns, so no collection traverses it again. A replay leaves
    # millions of records in reference cycles (the core's plugins refer back to it); collecting them before the
    # process exits cost about 0.4 s of the whole Philly replay's 7 s, for memory the exit hands back anyway.
    # The previous setting is restored (tests call this in-process).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(args)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def _main(args) -> int:
    from cluster.sim import SimConfig, SimOptions, simulate
    from cluster.sim.network import parse_spread

    try:
        opts = SimOptions(
            trace=args.trace, policies=args.policy.split(","), out=args.out, format=args.format, nodes=args.nodes,
            cluster=args.cluster, config=args.config, seed=args.seed, limit=args.limit, node_gpus=args.node_gpus,
            opportunistic_fraction=args.opportunistic_fraction, estimates=args.estimates,
            user_factor=args.user_factor, user_noise=args.user_noise, queues=args.queues,
            allow_no_duration=args.allow_no_duration, sharing=args.sharing, colocation_data=args.colocation_data,
            sim=SimConfig(start_delay_s=args.start_delay, stop_delay_s=args.stop_delay,
                          restart_overhead_s=args.restart_overhead, tick_s=args.tick, reports=args.reports,
                          spread=parse_spread(args.spread), progress_s=args.progress_every,
                          known_total=args.known_total),
            plots=not args.no_plots, topology=args.topology)
        if args.quiet or not sys.stderr.isatty():
            summaries = simulate(opts)
        else:
            summaries = _with_progress(simulate, opts)
    except ValueError as exc:
        return fail("simulate", f"error: {exc}", 2)
    except OSError as exc:
        return fail("simulate", f"cannot write the results: {exc.strerror or exc}: {exc.filename or args.out}", 1)
    _print_summary(summaries, args.out, plots=not args.no_plots)
    _warn_without_colocation_data(args.colocation_data)  # beside the results it qualifies (bad input: its one line)
    return 0


def _warn_without_colocation_data(given: str | None) -> None:
    """One line on stderr when the default lookup finds no co-location data (a wheel installed outside the
    repository, a run from another folder): the replay then counts every job as fully busy, and results differ
    from a run that found it."""
    from cluster.sim.colocation import LUCID_ENV, LUCID_NAME, default_lucid_path

    if given is None and default_lucid_path() is None:
        print(f"colocate simulate: warning: no co-location data found (${LUCID_ENV} is not set, and no "
              f"shared/traces/measured/{LUCID_NAME} is in or above this folder or the package): every job counts "
              "as fully busy, co-located pairs at no measured speed; give --colocation-data PATH (or 'none' to say "
              "so)", file=sys.stderr, flush=True)


def _with_progress(simulate, opts):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tasks: dict = {}
    with Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs"),
                  TimeElapsedColumn(), transient=False) as bar:
        def progress(policy, done, total):
            t = tasks.get(policy)
            if t is None:
                t = tasks[policy] = bar.add_task(policy, total=total)
            bar.update(t, completed=done)

        return simulate(opts, progress)


BIG = 1e6  # a table cell's number from this on is shown in 3 significant digits (2.78e+304): columns stay narrow


def _num(x: float, decimals: int) -> str:
    """``x`` with ``decimals`` decimals, or 3 significant digits from ``BIG`` on (also inf, nan)."""
    return f"{x:.{decimals}f}" if abs(x) < BIG else f"{x:.3g}"


def _h(seconds) -> str:
    if seconds is None:
        return "-"
    h = seconds / 3600
    return _num(h, 2 if h < 100 else 0)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _print_summary(summaries: list[dict], out: str, plots: bool = True) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from colocate.cli._tables import literal  # a policy is named after its file: shown as it is, never as markup

    console = Console() if sys.stdout.isatty() else Console(width=120)
    t = Table(title="simulated policies (times in hours)", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True)
    # done, failed (placed, then failed), dropped (never started) and unfinished add up to the jobs
    unfinished = any(s["unfinished"] for s in summaries)
    cols = ("policy", "jobs", "done", JobState.FAILED.value, "dropped") + (("unfinished",) if unfinished else ()) + (
        "JCT", "p99", "queue", "p99", "span d", "alloc", "util", "sim s")
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for s in summaries:
        t.add_row(literal(s["policy"]), str(s["jobs"]), str(s[JobState.SUCCEEDED]), str(sum(s["failed_reasons"].values())),
                  str(s["dropped"]), *((str(s["unfinished"]),) if unfinished else ()), _h(s["mean_jct_s"]),
                  _h(s["p99_jct_s"]), _h(s["mean_queue_s"]), _h(s["p99_queue_s"]),
                  _num(s["makespan_s"] / 86400, 1), _pct(s["gpu_allocation_rate"]),
                  _pct(s["gpu_utilization"]), _num(s["sim_wall_s"], 1))
    console.print(t)
    classes = [s for s in summaries if "by_class" in s]
    if classes:
        c = Table(title="by job class (trace label)", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True)
        for col in ("policy", "class", "jobs", "JCT", "p99", "queue", "slowdown", "preempted"):
            c.add_column(col, justify="left" if col in ("policy", "class") else "right", no_wrap=True)
        for s in classes:
            for k, v in s["by_class"].items():
                c.add_row(literal(s["policy"]), literal(k), str(v["jobs"]), _h(v["mean_jct_s"]), _h(v["p99_jct_s"]),
                          _h(v["mean_queue_s"]), "-" if v["mean_slowdown"] is None else f"{v['mean_slowdown']:.2f}",
                          str(v["preemptions"]))
        console.print(c)
    for s in summaries:
        p = s.get("predictor")
        if p and p.get("predictions"):
            levels = ", ".join(f"{k} {v}" for k, v in p["by_level"].items())
            console.print(f"{s['policy']}: predictor on {p['predictions']} jobs (at submit): median abs error "
                          f"{p['median_abs_pct_error']:.0%}, within 2x {p['within_2x']:.0%}, under-predicted "
                          f"{p['under_predicted']:.0%}, above p90 {p['above_p90']:.0%}; by key level: {levels}; "
                          f"no prediction {p['uncovered']}", markup=False)
    for s in summaries:
        for reasons, what in ((s["dropped_reasons"], "dropped, never started"),
                              (s["failed_reasons"], "failed after being placed")):
            if reasons:
                why = "; ".join(f"{n} x {reason}" for reason, n in list(reasons.items())[:3])
                more = len(reasons) - 3
                console.print(f"{s['policy']}: {sum(reasons.values())} of {s['jobs']} jobs {what}: {why}"
                              + (f" (and {more} other reasons, in jobs-*.csv)" if more > 0 else ""), markup=False)
    for key, what in (("skipped_rows", "trace"), ("skipped_node_rows", "node list")):
        skipped = summaries[0][key] if summaries else {}
        if skipped:
            console.print(f"skipped {what} rows: " + ", ".join(f"{k} {v}" for k, v in skipped.items()),
                          markup=False)
    written = "summary.json, jobs-*.csv, " + ("cdf.png, timeline.png, " if plots else "") + "timeline.csv"
    console.print(f"results in {out}/: {written}", markup=False)
