"""Runtime overhead: per-iteration time under `colocate run` (sim, share 1, no cap) vs plain python.

Both sides get the same placement so that only the runtime differs:

    plain:    taskset -c CORE env OMP_NUM_THREADS=1 python examples/train_X.py --threads 1 --host-ms 0 ...
    colocate: colocate run --device sim --sm-share 1 -- python examples/train_X.py --threads 1 --host-ms 0 ...

(CORE is the simulated GPU 0's core, the one the runtime pins the job to.)

Steady-state time per iteration is read from the script's own progress lines
(``--log-every W`` prints the rate of each window of W iterations, measured
inside the training loop): the first window (warm-up) is dropped and the rest
averaged. Start-up (interpreter, ``import torch``, runtime install, model build)
is therefore never counted. The loop-only time of the script's last line
(``done: N iterations in T s``; its clock starts after the model and data are
built) is reported too.

Runs alternate plain/colocate per example (the order flips every repeat:
AB BA AB ...) to spread machine noise; each side's median over the repeats is
compared: overhead = median_colocate / median_plain - 1, PASS when <= 5%.

    python benchmarks/overhead.py                       # defaults: 5 repeats x 160 iterations, ~3.5 min
    python benchmarks/overhead.py --repeats 9 --examples cnn,transformer
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

SECTION = "overhead"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per side and example (default 5)")
    p.add_argument("--iters", type=int, default=160, help="training iterations per run (default 160)")
    p.add_argument("--window", type=int, default=20,
                   help="iterations per timing window (the script's --log-every); the first is warm-up (default 20)")
    p.add_argument("--core", type=int, default=None,
                   help="CPU core for both sides (default: the sim GPU 0's core; sets COLOCATE_SIM_CORE for colocate)")
    p.add_argument("--min-cpu-ratio", type=float, default=0.9,
                   help="a run whose CPU time / wall time (start-up included) is below this shared its core with "
                        "another process: it is discarded and re-run (default 0.9)")
    p.add_argument("--max-retries", type=int, default=2,
                   help="re-runs allowed per contended run; after that the cleanest attempt is kept (default 2)")
    p.add_argument("--examples", default=",".join(C.EXAMPLES),
                   help=f"comma-separated examples (default {','.join(C.EXAMPLES)})")
    p.add_argument("--threshold", type=float, default=5.0, help="PASS when overhead <= this many %% (default 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (default 600)")
    p.add_argument("--results", default=str(C.RESULTS), help="markdown file to update (default benchmarks/RESULTS.md)")
    p.add_argument("--no-write", action="store_true", help="print the table only; leave RESULTS.md alone")
    p.add_argument("--strict", action="store_true", help="exit 1 when an example FAILs")
    args = p.parse_args(argv)
    args.examples = [e.strip() for e in args.examples.split(",") if e.strip()]
    if args.repeats < 1 or args.iters < 2 * args.window or args.window < 1:
        p.error("need --repeats >= 1, --window >= 1 and --iters >= 2 x --window")
    for e in args.examples:
        C.example_path(e)
    return args


def script_args(example: str, iters: int, window: int) -> list[str]:
    return [sys.executable, str(C.example_path(example).relative_to(C.ROOT)), "--threads", "1", "--host-ms", "0",
            "--iters", str(iters), "--log-every", str(window)]


def commands(example: str, iters: int, window: int, core: int) -> dict[str, list[str]]:
    script = script_args(example, iters, window)
    return {
        "plain": ["taskset", "-c", str(core), "env", "OMP_NUM_THREADS=1"] + script,
        "colocate": C.colocate_cmd() + ["run", "--device", "sim", "--sm-share", "1", "--"] + script,
    }


display = C.display
RunError = C.RunError


def run_once(cmd: list[str], timeout: float, core: int) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["COLOCATE_SIM_CORE"] = str(core)
    try:
        proc, wall, cpu = C.run_measured(cmd, cwd=C.ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"timed out after {timeout:.0f} s: {display(cmd)}") from None
    done = C.DONE_RE.search(proc.stdout)
    if proc.returncode != 0 or done is None:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RunError(f"exit {proc.returncode}, no 'done:' line: {display(cmd)}\n{tail}")
    iters, rate = int(done.group(1)), float(done.group(3))
    windows = [float(m.group(2)) for m in C.ITER_RE.finditer(proc.stdout)]
    # ms/it of each progress window; the first one is warm-up
    steady = [1000.0 / r for r in windows[1:] if r > 0]
    if not steady:
        raise RunError(f"too few progress lines to time the steady state: {display(cmd)}")
    return {"steady_ms": C.median(steady), "loop_ms": 1000.0 / rate, "iters": iters, "wall_s": wall,
            "cpu_ratio": cpu / wall if wall > 0 else 0.0, "stderr": proc.stderr.strip()}


def run_clean(cmd: list[str], args, core: int) -> tuple[dict, int]:
    """Run until the job had its core to itself (cpu/wall >= --min-cpu-ratio), at most 1 + --max-retries
    times; returns the cleanest attempt and the number of attempts discarded."""
    best, attempts = None, 0
    for attempts in range(1, 2 + args.max_retries):
        res = run_once(cmd, args.timeout, core)
        if best is None or res["cpu_ratio"] > best["cpu_ratio"]:
            best = res
        if res["cpu_ratio"] >= args.min_cpu_ratio:
            break
    best["contended"] = best["cpu_ratio"] < args.min_cpu_ratio
    return best, attempts - 1


def fmt_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    core = C.sim_core(0) if args.core is None else args.core
    info = C.machine_info()
    order_sides = ("plain", "colocate")
    cmds = {e: commands(e, args.iters, args.window, core) for e in args.examples}
    results = {e: {s: [] for s in order_sides} for e in args.examples}
    warnings: list[str] = []
    discarded = {e: 0 for e in args.examples}
    contended = {e: 0 for e in args.examples}
    load_before = os.getloadavg()

    console.print(f"[bold]colocate runtime overhead[/] - sim GPU 0 on core {core}, {args.iters} iterations/run, "
                  f"{args.repeats} repeats, window {args.window} (first dropped)")
    for e in args.examples:
        for s in order_sides:
            console.print(f"  {s:>8}: {display(cmds[e][s])}", highlight=False)

    # one untimed colocate run: builds the sim allocator extension if its source changed
    total = 1 + len(args.examples) * len(order_sides) * args.repeats
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, refresh_per_second=2) as progress:
        task = progress.add_task("warm-up", total=total)
        warm = C.colocate_cmd() + ["run", "--device", "sim", "--"] + script_args(args.examples[0], 2 * args.window, args.window)
        try:
            run_once(warm, args.timeout, core)
        except RunError as exc:
            console.print(f"[red]warm-up run failed[/]: {exc}")
            return 2
        progress.advance(task)
        for r in range(args.repeats):
            for e in args.examples:
                sides = order_sides if r % 2 == 0 else order_sides[::-1]
                for s in sides:
                    progress.update(task, description=f"repeat {r + 1}/{args.repeats} {e:<11} {s:<8}")
                    try:
                        res, dropped = run_clean(cmds[e][s], args, core)
                    except RunError as exc:
                        progress.stop()
                        console.print(f"[red]run failed[/]: {exc}")
                        return 2
                    if res["stderr"]:
                        warnings.append(f"{e}/{s}: {res['stderr'].splitlines()[-1]}")
                    results[e][s].append(res)
                    discarded[e] += dropped
                    contended[e] += res["contended"]
                    note = (f", {dropped} contended attempt(s) discarded" if dropped else "") + \
                        (", still contended" if res["contended"] else "")
                    progress.console.print(
                        f"  repeat {r + 1} {e:<11} {s:<8} steady {res['steady_ms']:7.2f} ms/it   "
                        f"loop {res['loop_ms']:7.2f} ms/it   ({res['iters']} it, {res['wall_s']:.1f} s with start-up, "
                        f"cpu/wall {res['cpu_ratio']:.2f}{note})", highlight=False)
                    progress.advance(task)

    load_after = os.getloadavg()
    headers = ["example", "plain ms/it", "colocate ms/it", "overhead", "per-repeat range",
               "loop-only overhead", "re-runs / kept contended", f"<= {args.threshold:g}%"]
    rows, all_pass = [], True
    for e in args.examples:
        p = [x["steady_ms"] for x in results[e]["plain"]]
        c = [x["steady_ms"] for x in results[e]["colocate"]]
        pl = [x["loop_ms"] for x in results[e]["plain"]]
        cl = [x["loop_ms"] for x in results[e]["colocate"]]
        mp, mc = C.median(p), C.median(c)
        over = mc / mp - 1
        loop_over = C.median(cl) / C.median(pl) - 1
        paired = [ci / pi - 1 for pi, ci in zip(p, c)]
        ok = 100 * over <= args.threshold
        all_pass &= ok
        rows.append([e, f"{mp:.2f}", f"{mc:.2f}", fmt_pct(over), f"{fmt_pct(min(paired))}..{fmt_pct(max(paired))}",
                     fmt_pct(loop_over), f"{discarded[e]} / {contended[e]}", "PASS" if ok else "FAIL"])

    table = Table(title=f"colocate overhead, sim, share 1, no cap (median of {args.repeats})")
    for h in headers:
        table.add_column(h, justify="left" if h == "example" else "right")
    for row in rows:
        style = "green" if row[-1] == "PASS" else "red"
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/]")
    console.print(table)
    for w in dict.fromkeys(warnings):
        console.print(f"[yellow]stderr[/] {w}", highlight=False)

    if not args.no_write:
        example = args.examples[0]
        body = "\n".join([
            "## Runtime overhead (sim, share 1, no cap)",
            "",
            *C.machine_lines(info),
            f"- command: `{C.invocation()}`",
            f"- runs per example and side: {args.repeats}, alternating plain/colocate (order flipped every repeat); "
            f"{args.iters} iterations per run, host phase off",
            f"- plain:    `{display(cmds[example]['plain'])}`",
            f"- colocate: `{display(cmds[example]['colocate'])}`",
            f"- ms/it: steady state = median over the script's in-loop progress windows ({args.window} iterations "
            "each, first window (warm-up) dropped; start-up never counted), then median over the runs. "
            "Overhead = median colocate / median plain - 1; per-repeat range = min..max of the paired "
            "ratios (colocate run / plain run of the same repeat) - 1; loop-only overhead uses the whole loop "
            "(`done: N iterations in T s`, warm-up included) instead of the steady state.",
            f"- contention guard: a run with CPU time / wall time < {args.min_cpu_ratio:g} shared its core with "
            f"another process and was re-run (at most {args.max_retries} times, then the cleanest attempt kept); "
            f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}",
            "",
            C.markdown_table(headers, rows),
            "",
            f"Verdict: {'all examples within' if all_pass else 'NOT all examples within'} "
            f"{args.threshold:g}% (issue 2 requirement).",
        ])
        path = C.update_results(SECTION, body, Path(args.results))
        console.print(f"wrote section '{SECTION}' of {path}")
    return 1 if (args.strict and not all_pass) else 0


if __name__ == "__main__":
    raise SystemExit(main())
