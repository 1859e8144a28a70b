"""``colocate demo``: simulated GPU, co-located example jobs, the node policies side by side."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

TARGETS = """\
targets (adaptive): guaranteed >= 0.95 of solo, utilization >= 1.3x the guaranteed job's solo
utilization, opportunistic job uses >= half of the idle device time, and pack slows the guaranteed
job more than adaptive does."""


def register(sub) -> None:
    from colocate.demo.node import MODES, PAIRS

    p = sub.add_parser(
        "demo", help="co-locate two example jobs on a simulated GPU under four policies and report",
        description="Start a node with one simulated GPU and run the same guaranteed/opportunistic pair of "
        "example jobs under exclusive, pack, static and adaptive co-location, plus solo references. "
        "Prints a table and writes summary.json and PNG plots.",
        epilog=TARGETS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="colocate-demo", metavar="DIR", help="output directory (default %(default)s)")
    p.add_argument("--duration", type=float, default=12.0, metavar="S",
                   help="seconds each job trains per run (default %(default)s; 7 runs with all modes)")
    p.add_argument("--pair", default="cnn+transformer", choices=sorted(PAIRS), help="example pair (default %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.set_defaults(func=main)


def main(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from colocate.demo import node as demo
    from colocate.files import write_json_atomic

    console = Console(stderr=True)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in demo.MODES]
    if bad or not modes:
        print(f"colocate demo: error: unknown mode(s) {', '.join(bad) or '(none)'}; use {','.join(demo.MODES)}",
              file=sys.stderr)
        return 2
    if not (1.0 <= args.duration <= 3600):
        print("colocate demo: error: --duration must be between 1 and 3600 seconds", file=sys.stderr)
        return 2
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        print(f"colocate demo: error: cannot create {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    pair = demo.PAIRS[args.pair]
    workdir = tempfile.mkdtemp(prefix="colocate-demo-", dir=None)
    steps = 3 + len(modes)
    start = time.monotonic()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("starting", total=steps)
        done = {"n": 0}

        def step(name):
            progress.update(task, completed=done["n"], description=f"running {name} ({args.duration:g} s)")
            done["n"] += 1

        runs = demo.run_pair(pair, args.duration, modes, progress=step, workdir=workdir)
        progress.update(task, completed=steps, description="analysing")
    failed = {n: r.exit_codes for n, r in runs.items() if any(c != 0 for c in r.exit_codes.values())}
    rows, lines = demo.analyse(pair, runs)
    summary = {"pair": pair.name, "duration_s": args.duration, "modes": rows, "failed_runs": failed,
               "logs": workdir, "elapsed_s": time.monotonic() - start}
    write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    plots = demo.plot(lines, pair, args.out)
    print_table(rows, pair)
    print(f"wrote {os.path.join(args.out, 'summary.json')}, {', '.join(plots)} (logs in {workdir})")
    if failed:
        print(f"colocate demo: some jobs failed: {failed}", file=sys.stderr)
        return 1
    return 0


def print_table(rows: list[dict], pair) -> None:
    from colocate.cli._tables import print_table as show

    headers = ("mode", "guaranteed\nvs solo", "device\nutilization", "util vs\nG solo", "opportunistic\nvs solo",
               "idle share\nused", "G host\nbytes peak")
    body = [(r["mode"], f"{r['guaranteed_throughput_ratio']:.3f}", f"{r['device_utilization']:.3f}",
             f"{r['utilization_gain']:.2f}x", f"{r['opportunistic_throughput_ratio']:.3f}",
             f"{r['idle_share_used']:.3f}", str(r["guaranteed_host_bytes_peak"])) for r in rows]
    show(headers, body, right=headers[1:],
         title=f"colocate demo: {pair.guaranteed.job_id} (guaranteed) + {pair.opportunistic.job_id} "
               f"(opportunistic) on one simulated GPU")
    if rows:
        runs = ", ".join(f"{x:.1f}" for x in rows[0]["guaranteed_solo_runs_it_s"])
        print(f"guaranteed solo utilization {rows[0]['guaranteed_solo_utilization']:.3f}, "
              f"solo throughput {rows[0]['guaranteed_solo_throughput_it_s']:.1f} it/s (G: mean of {runs}), "
              f"{rows[0]['opportunistic_solo_throughput_it_s']:.1f} it/s (O)")
