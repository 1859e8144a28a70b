"""SM-share accuracy: a solo job's device busy fraction under `colocate run --sm-share S` (sim).

For each example with its host phase off (so that, unthrottled, it keeps the
simulated GPU busy all the time) and each share S:

    colocate run --device sim --sm-share S --stats-file F -- python examples/train_X.py --host-ms 0 --duration D

``busy_fraction`` is read from the stats file (device busy time over wall time,
from runtime install to exit, so the short start-up before the first mini-batch
is included) and compared with S: PASS when |busy_fraction - S| <= 0.05 in every
repeat (issue 2). Share 1.0 is the unthrottled reference: its throughput is the
denominator of the "rel. it/s" column, which should come out close to S.

    python benchmarks/share_accuracy.py                         # defaults: 4 s runs, 2 repeats, ~3 min
    python benchmarks/share_accuracy.py --shares 0.1,0.5 --duration 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

SECTION = "share_accuracy"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=4.0, help="seconds of training per run (default 4)")
    p.add_argument("--shares", default="0.25,0.5,0.75,1.0", help="comma-separated SM shares (default 0.25,0.5,0.75,1.0)")
    p.add_argument("--repeats", type=int, default=2, help="runs per example and share (default 2)")
    p.add_argument("--examples", default=",".join(C.EXAMPLES),
                   help=f"comma-separated examples (default {','.join(C.EXAMPLES)})")
    p.add_argument("--core", type=int, default=None,
                   help="CPU core of the simulated GPU (sets COLOCATE_SIM_CORE; default: the runtime's rule for GPU 0)")
    p.add_argument("--max-foreign", type=float, default=0.1,
                   help="a run whose wall time not spent busy or throttled exceeds this fraction shared its core "
                        "with another process: it is discarded and re-run (default 0.1)")
    p.add_argument("--max-retries", type=int, default=2,
                   help="re-runs allowed per contended run; after that the cleanest attempt is kept (default 2)")
    p.add_argument("--tolerance", type=float, default=0.05, help="PASS when |busy_fraction - share| <= this (default 0.05)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (default 600)")
    p.add_argument("--results", default=str(C.RESULTS), help="markdown file to update (default benchmarks/RESULTS.md)")
    p.add_argument("--no-write", action="store_true", help="print the table only; leave RESULTS.md alone")
    p.add_argument("--strict", action="store_true", help="exit 1 when a share FAILs")
    args = p.parse_args(argv)
    try:
        args.shares = [float(s) for s in args.shares.split(",") if s.strip()]
    except ValueError:
        p.error(f"--shares must be comma-separated numbers, got {args.shares!r}")
    if not args.shares or any(not 0.0 < s <= 1.0 for s in args.shares):
        p.error("--shares must be in (0, 1] (share 0 pauses the job and would never finish)")
    if args.duration <= 0 or args.repeats < 1:
        p.error("need --duration > 0 and --repeats >= 1")
    args.examples = [e.strip() for e in args.examples.split(",") if e.strip()]
    for e in args.examples:
        C.example_path(e)
    return args


def command(example: str, share: float, duration: float, stats_file: str) -> list[str]:
    script = f"examples/train_{example}.py" if example == "X" else str(C.example_path(example).relative_to(C.ROOT))
    return C.colocate_cmd() + [
        "run", "--device", "sim", "--sm-share", f"{share:g}", "--stats-file", stats_file, "--",
        sys.executable, script,
        "--host-ms", "0", "--duration", f"{duration:g}", "--log-every", "0",
    ]


display = C.display
RunError = C.RunError


def run_once(example: str, share: float, duration: float, timeout: float, tmpdir: str, core: int | None) -> dict:
    stats_file = os.path.join(tmpdir, f"{example}-{share:g}-{time.monotonic_ns()}.json")
    cmd = command(example, share, duration, stats_file)
    env = dict(os.environ)
    if core is not None:
        env["COLOCATE_SIM_CORE"] = str(core)
    try:
        proc, wall, _cpu = C.run_measured(cmd, cwd=C.ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"timed out after {timeout:.0f} s: {display(cmd)}") from None
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    if proc.returncode != 0:
        raise RunError(f"exit {proc.returncode}: {display(cmd)}\n{tail}")
    try:
        with open(stats_file) as f:
            stats = json.load(f)
    except (OSError, ValueError) as exc:
        raise RunError(f"no readable stats file ({exc}): {display(cmd)}\n{tail}") from None
    done = C.DONE_RE.search(proc.stdout)
    swall = float(stats["wall_s"])
    idle = float(stats.get("throttle_idle_s", 0.0)) + float(stats.get("paused_s", 0.0))
    # a solo job is either busy on its core or idled by the throttle; the rest is time it waited for the core
    foreign = max(0.0, swall - float(stats["device_busy_s"]) - idle) / swall if swall > 0 else 0.0
    return {
        "busy_fraction": float(stats["busy_fraction"]),
        "iterations": int(stats["iterations"]),
        "stats_wall_s": swall,
        "throttle_idle_s": float(stats.get("throttle_idle_s", float("nan"))),
        "foreign": foreign,
        "rate": float(done.group(3)) if done else float("nan"),
        "wall_s": wall,
    }


def run_clean(example: str, share: float, args, tmpdir: str) -> tuple[dict, int]:
    """Re-run while the job waited for its core (another process on it); keep the cleanest attempt."""
    best, attempts = None, 0
    for attempts in range(1, 2 + args.max_retries):  # noqa: B007 (the count is returned)
        res = run_once(example, share, args.duration, args.timeout, tmpdir, args.core)
        if best is None or res["foreign"] < best["foreign"]:
            best = res
        if res["foreign"] <= args.max_foreign:
            break
    best["contended"] = best["foreign"] > args.max_foreign
    return best, attempts - 1


def main(argv=None) -> int:
    args = parse_args(argv)
    console = C.console()
    info = C.machine_info()
    results = {(e, s): [] for e in args.examples for s in args.shares}
    discarded = {k: 0 for k in results}
    load_before = os.getloadavg()
    console.print(f"[bold]SM-share accuracy[/] - sim, solo job, host phase off, {args.duration:g} s per run, "
                  f"{args.repeats} repeat(s), tolerance +/-{args.tolerance:g}")
    console.print(f"  e.g. {display(command(args.examples[0], args.shares[0], args.duration, 'STATS.json'))}",
                  highlight=False)

    total = len(args.examples) * len(args.shares) * args.repeats
    with tempfile.TemporaryDirectory(prefix="colocate-share-bench-") as tmpdir, \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=console, refresh_per_second=2) as progress:
        task = progress.add_task("", total=total)
        for r in range(args.repeats):
            for e in args.examples:
                for s in args.shares:
                    progress.update(task, description=f"repeat {r + 1}/{args.repeats} {e:<11} share {s:g}")
                    try:
                        res, dropped = run_clean(e, s, args, tmpdir)
                    except RunError as exc:
                        progress.stop()
                        console.print(f"[red]run failed[/]: {exc}")
                        return 2
                    results[(e, s)].append(res)
                    discarded[(e, s)] += dropped
                    note = (f", {dropped} contended attempt(s) discarded" if dropped else "") + \
                        (", still contended" if res["contended"] else "")
                    progress.console.print(
                        f"  repeat {r + 1} {e:<11} share {s:<5g} busy_fraction {res['busy_fraction']:.3f}  "
                        f"|err| {abs(res['busy_fraction'] - s):.3f}  {res['iterations']} it, {res['rate']:.1f} it/s, "
                        f"throttle idle {res['throttle_idle_s']:.2f} s of {res['stats_wall_s']:.2f} s, "
                        f"waiting for core {100 * res['foreign']:.0f}%{note}",
                        highlight=False)
                    progress.advance(task)

    load_after = os.getloadavg()
    headers = ["example", "share", "busy_fraction", "abs err", "worst abs err",
               "rel. it/s", "iterations", "re-runs / contended", f"within +/-{args.tolerance:g}"]
    rows, all_pass = [], True
    for e in args.examples:
        ref = results.get((e, 1.0))
        ref_rate = statistics.median([x["rate"] for x in ref]) if ref else None
        for s in args.shares:
            runs = results[(e, s)]
            busy = statistics.median([x["busy_fraction"] for x in runs])
            errs = [abs(x["busy_fraction"] - s) for x in runs]
            ok = max(errs) <= args.tolerance + 1e-12
            all_pass &= ok
            rate = statistics.median([x["rate"] for x in runs])
            rel = f"{rate / ref_rate:.3f}" if ref_rate else "-"
            label = f"{s:g}" + (" (ref)" if s == 1.0 else "")
            rows.append([e, label, f"{busy:.3f}", f"{statistics.median(errs):.3f}", f"{max(errs):.3f}", rel,
                         f"{int(statistics.median([x['iterations'] for x in runs]))}",
                         f"{discarded[(e, s)]} / {sum(x['contended'] for x in runs)}", "PASS" if ok else "FAIL"])

    table = Table(title=f"busy_fraction vs --sm-share (sim, {args.duration:g} s runs, {args.repeats} repeat(s))")
    for h in headers:
        table.add_column(h, justify="left" if h == "example" else "right")
    for row in rows:
        style = "green" if row[-1] == "PASS" else "red"
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/]")
    console.print(table)

    if not args.no_write:
        body = "\n".join([
            "## SM-share accuracy (sim, solo job, host phase off)",
            "",
            *C.machine_lines(info),
            f"- command: `{C.invocation()}`",
            f"- each run: `{display(command('X', 0.5, args.duration, 'STATS.json')).replace('--sm-share 0.5', '--sm-share S')}` "
            f"with X in {', '.join(args.examples)} and S in {', '.join(f'{s:g}' for s in args.shares)}; "
            f"{args.repeats} repeat(s) each",
            "- busy_fraction: from the stats file (device busy time / wall time, runtime install to exit, "
            "start-up included). busy_fraction and abs err = |busy_fraction - share| are medians over the repeats, worst abs err the largest; PASS when every repeat is within the tolerance. rel. it/s: the run's "
            "iterations per second over the share-1.0 run's (ideally close to the share).",
            f"- contention guard: a run that spent more than {100 * args.max_foreign:g}% of its wall time neither "
            "busy nor throttled was waiting for a core another process held; it was re-run "
            f"(at most {args.max_retries} times, then the cleanest attempt kept); "
            f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}",
            "",
            C.markdown_table(headers, rows),
            "",
            f"Verdict: {'every share within' if all_pass else 'NOT every share within'} "
            f"+/-{args.tolerance:g} (issue 2 requirement).",
        ])
        path = C.update_results(SECTION, body, Path(args.results))
        console.print(f"wrote section '{SECTION}' of {path}")
    return 1 if (args.strict and not all_pass) else 0


if __name__ == "__main__":
    raise SystemExit(main())
