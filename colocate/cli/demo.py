"""``colocate demo [node|cluster]``: simulated GPUs running co-located example jobs, and a report.

``node``: one simulated GPU, a guaranteed and an opportunistic example job under each node policy side by
side; ``cluster``: a scheduler and two nodes of simulated GPUs with a stream of example jobs (a DDP gang,
guaranteed and opportunistic jobs), a live view while it runs. Both by default.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

from colocate.base.vocab import JobClass, JobState

TARGETS = """\
node part, targets (adaptive): guaranteed >= 0.98 of solo, the opportunistic job uses >= 0.80 of the
idle device time, and pack slows the guaranteed job more than adaptive does; the table shows where
the opportunistic job's time went (start-up, baseline, paused, running).
cluster part: per-job queue wait and completion time, GPU allocation and utilization over time
(cluster-gpus.png), and the share of each opportunistic job's run spent beside a guaranteed job.
Exit code: 0; 1 when a job failed or a guaranteed one did not finish in time (an opportunistic job still running
at the cluster part's time limit is reported as starved of idle time, not failed); 2 on bad options."""


def register(sub) -> None:
    from colocate.demo.node import MODES, PAIRS

    p = sub.add_parser(
        "demo", help="simulated GPUs running co-located example jobs: one node's policies, then a cluster",
        description="node: start a node with one simulated GPU and run the same guaranteed/opportunistic pair of "
        "example jobs under each node policy, plus solo references. cluster: a scheduler and two nodes of "
        "simulated GPUs run a stream of example jobs. Prints tables; writes summary.json and PNG plots.",
        epilog=TARGETS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("part", nargs="?", choices=("node", "cluster"), default=None,
                   help="run only this part (default: both)")
    p.add_argument("--out", default="colocate-demo", metavar="DIR", help="output directory (default %(default)s)")
    p.add_argument("--duration", type=float, default=12.0, metavar="S",
                   help="node part: seconds each job trains per run (default %(default)s; 7 runs with all modes)")
    p.add_argument("--pair", default="cnn+transformer", choices=sorted(PAIRS), help="node part: example pair")
    p.add_argument("--modes", default=",".join(MODES), help="node part: comma-separated subset of " + ",".join(MODES))
    p.add_argument("--cluster-duration", type=float, default=20.0, metavar="S",
                   help="cluster part: the base training time of the stream's jobs (default %(default)s)")
    p.set_defaults(func=main)


def _unwind_on_sigterm() -> None:
    """SIGTERM (``timeout``, a batch system's kill) unwinds the demo as Ctrl-C does, through the ``finally``
    blocks that stop the daemons and jobs it started, and exits 143 (128 + SIGTERM)."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(args) -> int:
    from colocate.base.files import write_json_atomic
    from colocate.demo import node as demo

    _unwind_on_sigterm()

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in demo.MODES]
    if bad or not modes:
        print(f"colocate demo: error: unknown mode(s) {', '.join(bad) or '(none)'}; use {','.join(demo.MODES)}",
              file=sys.stderr)
        return 2
    for name, value in (("--duration", args.duration), ("--cluster-duration", args.cluster_duration)):
        if not (1.0 <= value <= 3600):
            print(f"colocate demo: error: {name} must be between 1 and 3600 seconds", file=sys.stderr)
            return 2
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        print(f"colocate demo: error: cannot create {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    summary, files, rc = {}, [], 0
    if args.part in (None, "node"):
        summary["node"], node_files, failed = _node_part(args, modes)
        files += node_files
        rc = max(rc, 1 if failed else 0)
    if args.part in (None, "cluster"):
        summary["cluster"], cluster_files, failed = _cluster_part(args)
        files += cluster_files
        rc = max(rc, 1 if failed else 0)
    write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    print(f"wrote {', '.join([os.path.join(args.out, 'summary.json')] + files)}")
    return rc


def _node_part(args, modes):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from colocate.demo import node as demo

    console = Console(stderr=True)
    pair = demo.PAIRS[args.pair]
    workdir = tempfile.mkdtemp(prefix="colocate-demo-node-")
    steps = 3 + len(modes)
    start = time.monotonic()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("node part: starting", total=steps)
        done = {"n": 0}

        def step(name):
            progress.update(task, completed=done["n"], description=f"node part: {name} ({args.duration:g} s)")
            done["n"] += 1

        runs = demo.run_pair(pair, args.duration, modes, progress=step, workdir=workdir)
        progress.update(task, completed=steps, description="node part: analysing")
    failed = {n: r.exit_codes for n, r in runs.items() if any(c != 0 for c in r.exit_codes.values())}
    rows, lines = demo.analyse(pair, runs)
    summary = {"pair": pair.name, "duration_s": args.duration, "modes": rows, "failed_runs": failed,
               "logs": workdir, "elapsed_s": time.monotonic() - start}
    plots = demo.plot(lines, pair, args.out)
    print_table(rows, pair)
    if failed:
        print(f"colocate demo: some node-part jobs failed: {failed}", file=sys.stderr)
    return summary, plots, bool(failed)


def _cluster_part(args):
    import types

    from rich.live import Live

    from colocate.cli import _tables as T
    from colocate.demo import cluster as C

    workdir = tempfile.mkdtemp(prefix="colocate-demo-cluster-")
    console = T.console(stderr=True)
    with Live(console=console, refresh_per_second=4, transient=not console.is_terminal) as live:
        def show(sample, run):
            snap = (types.SimpleNamespace(nodes=sample.nodes), list(sample.jobs))
            live.update(T.render_cluster(f"cluster part, t={sample.t:.0f}s", snap, None, time.time(), C.SAMPLE_S))

        try:
            run = C.run_cluster(workdir, args.cluster_duration, progress=show)
        except RuntimeError as exc:
            print(f"colocate demo: cluster part: {exc} (logs in {workdir})", file=sys.stderr)
            return {"error": str(exc), "logs": workdir}, [], True
    rows, series = C.analyse(run)
    plot = C.plot(series, args.out)
    _print_cluster(rows)
    starved, failed = starved_and_failed(rows, run.timed_out)
    if starved:
        print(f"colocate demo: cluster part: opportunistic job(s) {', '.join(starved)} had not finished at the time "
              f"limit: they run only on idle device time, and this machine had little to spare (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores); not counted as failures (logs in {workdir})",
              file=sys.stderr)
    if failed:
        print(f"colocate demo: cluster part: not succeeded: {', '.join(failed)} (logs in {workdir})", file=sys.stderr)
    n = max(1, len(series["t"]))
    summary = {"jobs": rows, "elapsed_s": run.elapsed_s, "logs": workdir, "timed_out": run.timed_out,
               "starved_opportunistic": starved,
               "mean_gpus_allocated": sum(series["allocated"]) / n, "mean_gpus_shared": sum(series["shared"]) / n,
               "mean_gpu_utilization": sum(series["utilization"]) / n}
    return summary, [plot], bool(failed)


def starved_and_failed(rows: list[dict], timed_out: bool) -> tuple[list[str], list[str]]:
    """The cluster part's jobs that had not succeeded, split: opportunistic ones still waiting or running at the
    time limit (starved: they get only idle device time, so a busy machine delays them by design) and the rest
    (a guaranteed job that did not finish in time, or any job that failed or was cancelled)."""
    starved = [r["name"] for r in rows if timed_out and r["class"] == JobClass.OPPORTUNISTIC
               and r["state"] in (JobState.PENDING, JobState.PLACING, JobState.RUNNING)]
    failed = [r["name"] for r in rows if r["state"] != JobState.SUCCEEDED and r["name"] not in starved]
    return starved, failed


def _print_cluster(rows: list[dict]) -> None:
    from colocate.base.units import format_duration
    from colocate.cli._tables import print_table as show

    def secs(x):
        return "-" if x is None else format_duration(x)

    body = [(r["job"], r["name"], r["class"], r["state"], str(r["workers"]), secs(r["queue_wait_s"]),
             secs(r["completion_s"]), str(r["attempts"]), ",".join(r["nodes"]) or "-",
             "-" if r["beside_guaranteed"] is None else f"{r['beside_guaranteed']:.0%}") for r in rows]
    show(("job", "name", "class", "state", "workers", "queue\nwait", "completion\ntime", "attempts", "nodes",
          "ran beside a\nguaranteed job"), body, right=("workers", "queue\nwait", "completion\ntime", "attempts"),
         title="colocate demo: cluster of 2 nodes x 2 simulated GPUs, stream of example jobs")


def print_table(rows: list[dict], pair) -> None:
    from colocate.cli._tables import print_table as show
    from colocate.demo.node import phase_cells

    headers = ("mode", "guaranteed\nvs solo", "device\nutilization", "util vs\nG solo", "opportunistic\nvs solo",
               "idle share\nused", "... while\nrunning", "O\nstart-up", "O\nbaseline", "O\npaused", "O\nrunning",
               "G host\nbytes peak")
    body = [(r["mode"], f"{r['guaranteed_throughput_ratio']:.3f}", f"{r['device_utilization']:.3f}",
             f"{r['utilization_gain']:.2f}x", f"{r['opportunistic_throughput_ratio']:.3f}",
             f"{r['idle_share_used']:.3f}", f"{r['idle_share_used_running']:.3f}", *phase_cells(r),
             str(r["guaranteed_host_bytes_peak"])) for r in rows]
    show(headers, body, right=headers[1:],
         title=f"colocate demo: {pair.guaranteed.job_id} (guaranteed) + {pair.opportunistic.job_id} "
               f"(opportunistic) on one simulated GPU")
    print("O start-up/baseline/paused/running: parts of the measured window the opportunistic job (O) spent\n"
          "starting (before its first device work), held while the guaranteed job's solo baseline was profiled,\n"
          "paused (SLO break, memory, waiting) and running; '... while running': its busy time over the idle\n"
          "time of its running part")
    if rows:
        runs = ", ".join(f"{x:.1f}" for x in rows[0]["guaranteed_solo_runs_it_s"])
        print(f"guaranteed solo utilization {rows[0]['guaranteed_solo_utilization']:.3f}, "
              f"solo throughput {rows[0]['guaranteed_solo_throughput_it_s']:.1f} it/s (G: mean of {runs}), "
              f"{rows[0]['opportunistic_solo_throughput_it_s']:.1f} it/s (O)")
