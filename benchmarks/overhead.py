"""Runtime overhead, resolved to 1%: paired on/off windows inside one job, hooks timed from inside, start-up.

Comparing separate plain and ``colocate run`` processes could not resolve a few percent on a shared
machine (two runs of the old benchmark, same commit: +11.8% and +1.5% for the CNN). This one measures
each part of the runtime's cost where the machine's drift cancels:

1. **Hooks, paired windows** (per example, one process under ``colocate run --device sim --sm-share 1``,
   no cap): the unmodified example runs its ordinary loop; every ``--window`` iterations the runtime's
   per-iteration work (the boundary and forward hooks, the backward and optimizer wrappers:
   ``torch_hooks.hooks.install_hooks`` / ``remove_hooks``, the internal switch) is switched on or off.
   Adjacent off/on windows form a pair (order alternating, off-on then on-off, so linear drift
   cancels); each pair gives median(on iteration time) / median(off) - 1; the figure is the median
   over pairs with a sign-test 95% confidence interval (``_common.median_ci``). Iterations are timed
   at ``Optimizer.zero_grad`` (the benchmark's own wrapper, present in both windows); each window's
   first iteration (it pays the switch) is dropped.
2. **Hooks, timed from inside**: the last ``--timed-windows`` windows run the same hooks installed with
   a ``HookTimer`` (``install_hooks(rt, timer=...)``), which adds the nanoseconds spent in each hook's
   own code (boundary included; the wrapped torch functions excluded). Per window: hook time / window
   time; median and CI over windows; also ns per call of each hook (two clock reads included).
3. **Allocator**: the simulated GPU's caching-allocator model serves every tensor allocation and
   cannot be switched off in a process. A microbenchmark times allocation + free of tensors of mixed
   sizes (256 live) in alternating plain / ``colocate run`` processes: the paired difference in ns per
   allocation, times the example's allocations per iteration (counted by the allocator), over its
   iteration time.
4. **Start-up**: ``python -c 'import torch'`` pinned like the job vs the same under ``colocate run``,
   alternating, many repeats: time from spawn until ``import torch`` (runtime install included)
   returned in the job (CLOCK_MONOTONIC is one clock for all processes), and the whole command;
   ``python -c pass`` gives the launcher alone.

The total per example is hooks (1) + allocator (3), its interval the sum of the two intervals' ends.
Goals (issue 7): at most 1% per iteration at share 1 with no cap; at most 0.3 s added to start-up.
A verdict is "yes" when the interval's upper end meets the goal, "no" when its lower end misses it.

    python benchmarks/overhead.py                     # defaults: ~5 min on 2 cores
    python benchmarks/overhead.py --pairs 20 --startup-pairs 6 --examples cnn --no-write   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
from rich.table import Table

SECTION = "overhead"
MARK = "@@RESULT@@"
GOAL_ITER = 0.01
GOAL_START_S = 0.3

# Runs under `colocate run`: the unmodified example's main() with the hooks switched per window.
# Timestamps (wall and the training thread's CPU time) are taken at Optimizer.zero_grad, before
# and after the switch, so an iteration's time never includes switching.
CHILD = r'''
import importlib.util, json, sys, time
import torch
import torch_hooks
from torch_hooks import hooks

rt = torch_hooks.runtime()
if rt is None:
    sys.exit("the colocate runtime is not installed: run this under `colocate run`")
path, window, pairs, timed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
plan = ["on", "off"] * 4  # warm-up, dropped
for p in range(pairs):
    plan += ["off", "on"] if p % 2 == 0 else ["on", "off"]
plan += ["timed"] * timed
timer = hooks.HookTimer()
ext = getattr(rt.device, "_ext", None)
wall, cpu = time.perf_counter_ns, time.thread_time_ns
ends, starts, hook_ns = [], [], []  # per zero_grad call: (wall, cpu) before / after the switch
allocs = {}
mode = ["on"]


def switch(to):
    if to != mode[0]:
        hooks.remove_hooks()
        if to != "off":
            hooks.install_hooks(rt, timer=timer if to == "timed" else None)
        mode[0] = to


orig_zero_grad = torch.optim.Optimizer.zero_grad


def zero_grad(self, *args, **kwargs):
    ends.append((wall(), cpu()))
    hook_ns.append(tuple(timer.ns.values()))
    n = len(ends) - 1  # the iteration starting now
    if n % window == 0:
        w = n // window
        if w in (8, 8 + 2 * pairs) and ext is not None:
            allocs[w] = ext.stats()["num_allocs"]
        if w < len(plan):
            switch(plan[w])
    hook_ns.append(tuple(timer.ns.values()))
    starts.append((wall(), cpu()))
    return orig_zero_grad(self, *args, **kwargs)


torch.optim.Optimizer.zero_grad = zero_grad
spec = importlib.util.spec_from_file_location("bench_example", path)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
iters = len(plan) * window + 1
example.main(["--threads", "1", "--host-ms", "0", "--iters", str(iters), "--log-every", "0"])
keys = list(timer.ns)
its = [{"wall": ends[k + 1][0] - starts[k][0], "cpu": ends[k + 1][1] - starts[k][1],
        "hooks": {key: b - a for key, a, b in zip(keys, hook_ns[2 * k + 1], hook_ns[2 * k + 2])}}
       for k in range(len(plan) * window)]
paired_iters = 2 * pairs * window
print("@@RESULT@@" + json.dumps({
    "plan": plan, "window": window, "iterations": its,
    "allocs_per_it": (allocs[8 + 2 * pairs] - allocs[8]) / paired_iters if len(allocs) == 2 else None,
    "timer_ns": timer.ns, "timer_calls": timer.calls, "clock_ns": hooks.HookTimer.clock_cost_ns()}))
'''

# A loop with no optimizer (parameters updated by hand, like pytorch/examples' word_language_model):
# boundaries come from the backward wrapper + the next forward; its hooks timed from inside.
HAND = r'''
import json, statistics, sys, time
import torch, torch.nn as nn
import torch_hooks
from torch_hooks import hooks

rt = torch_hooks.runtime()
hooks.remove_hooks()
timer = hooks.HookTimer()
hooks.install_hooks(rt, timer=timer)
torch.manual_seed(0)
emb, rnn, head = nn.Embedding(400, 64), nn.LSTM(64, 64, 2), nn.Linear(64, 400)
params = list(emb.parameters()) + list(rnn.parameters()) + list(head.parameters())
data = torch.randint(0, 400, (36, 20))
cpu, rows = time.thread_time_ns, []
for i in range(int(sys.argv[1])):
    t0, h0 = cpu(), dict(timer.ns)
    for p in params:
        p.grad = None
    out, _ = rnn(emb(data[:-1]))
    loss = nn.functional.cross_entropy(head(out).view(-1, 400), data[1:].reshape(-1))
    loss.backward()
    for p in params:
        p.data.add_(p.grad, alpha=-0.1)
    rows.append((cpu() - t0, {k: timer.ns[k] - h0[k] for k in h0}))
rows = rows[10:]
print("@@RESULT@@" + json.dumps({
    "it_ms": statistics.median(r[0] for r in rows) / 1e6,
    "per_it_ns": {k: statistics.median(r[1][k] for r in rows) for k in timer.ns},
    "calls": timer.calls, "iterations": len(rows) + 10, "boundaries": dict(rt.book.boundaries)}))
'''

# Allocation + free of mixed-size tensors, 256 live; plain or under `colocate run`.
MICRO = r'''
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
chunk, chunks = int(sys.argv[1]), int(sys.argv[2])
sizes = [16, 256, 4096, 65536, 262144]  # float32 elements: 64 B .. 1 MiB
live = [torch.empty(sizes[i % 5]) for i in range(256)]
clock = time.thread_time_ns  # CPU time: time slices lost to other processes do not count
per = []
for c in range(chunks + 1):  # the first chunk warms up
    t0 = clock()
    for i in range(chunk):
        live[i & 255] = torch.empty(sizes[i % 5])
    per.append((clock() - t0) / chunk)
print("@@RESULT@@" + json.dumps({"ns_per_alloc": statistics.median(per[1:])}))
'''

STARTUP = {
    "import torch": "import time, torch; print('@@T@@', time.monotonic(), flush=True)",
    "python -c pass": "import time; print('@@T@@', time.monotonic(), flush=True)",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", default=",".join(C.EXAMPLES),
                   help=f"comma-separated examples (default {','.join(C.EXAMPLES)})")
    p.add_argument("--window", type=int, default=2,
                   help="iterations per on/off window; the first of each is dropped (default 2)")
    p.add_argument("--pairs", type=int, default=600, help="off/on window pairs per example (default 600)")
    p.add_argument("--timed-windows", type=int, default=100,
                   help="windows with the hooks timed from inside, after the pairs (default 100)")
    p.add_argument("--alloc-pairs", type=int, default=10,
                   help="plain / colocate process pairs of the allocator microbenchmark (default 10)")
    p.add_argument("--alloc-chunk", type=int, default=20000, help="allocations per timed chunk (default 20000)")
    p.add_argument("--startup-pairs", type=int, default=12,
                   help="plain / colocate process pairs per start-up measure (default 12)")
    p.add_argument("--core", type=int, default=None,
                   help="CPU core of the simulated GPU, and of the plain processes (default: the runtime's rule for GPU 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per process (default 600)")
    p.add_argument("--results", default=str(C.RESULTS), help="markdown file to update (default benchmarks/RESULTS.md)")
    p.add_argument("--no-write", action="store_true", help="print the tables only; leave RESULTS.md alone")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed (interval's lower end over it)")
    args = p.parse_args(argv)
    args.examples = [e.strip() for e in args.examples.split(",") if e.strip()]
    if args.window < 2 or args.pairs < 1 or args.timed_windows < 1 or args.alloc_pairs < 1 or args.startup_pairs < 1:
        p.error("need --window >= 2 and --pairs, --timed-windows, --alloc-pairs, --startup-pairs >= 1")
    for e in args.examples:
        C.example_path(e)
    return args


def env_for(core: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLOCATE_SIM_CORE=str(core))
    return env


def colocate(cmd: list[str]) -> list[str]:
    return C.colocate_cmd() + ["run", "--device", "sim", "--sm-share", "1", "--"] + cmd


def plain(cmd: list[str], core: int) -> list[str]:
    return ["taskset", "-c", str(core)] + cmd


def result_of(proc, cmd) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise C.RunError(f"exit {proc.returncode}, no result: {C.display(cmd)}\n{tail}")
    return json.loads(lines[-1][len(MARK):])


def run(cmd: list[str], core: int, timeout: float):
    try:
        return subprocess.run(cmd, cwd=C.ROOT, env=env_for(core), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise C.RunError(f"timed out after {timeout:.0f} s: {C.display(cmd)}") from None


# ---------------------------------------------------------------- measurements

def hooks_child(example: str, args, core: int) -> dict:
    cmd = colocate([sys.executable, "-c", CHILD, str(C.example_path(example)), str(args.window), str(args.pairs),
                    str(args.timed_windows)])
    return result_of(run(cmd, core, args.timeout), cmd)


def analyse_hooks(res: dict) -> dict:
    """Paired on/off figures (CPU and wall) and the timed windows' hook share, with CIs."""
    plan, w, its = res["plan"], res["window"], res["iterations"]

    def window_median(i: int, key: str) -> float:  # the window's iterations but its first
        return statistics.median(it[key] for it in its[i * w + 1:(i + 1) * w])

    out = {}
    for key in ("cpu", "wall"):
        rel = []
        for a in range(8, len(plan) - 1, 2):
            if {plan[a], plan[a + 1]} == {"on", "off"}:
                on, off = (a, a + 1) if plan[a] == "on" else (a + 1, a)
                rel.append(window_median(on, key) / window_median(off, key) - 1)
        off_ms = statistics.median(window_median(i, key) for i in range(8, len(plan)) if plan[i] == "off") / 1e6
        out[key] = {"rel": rel, "med": statistics.median(rel), "ci": C.median_ci(rel), "off_ms": off_ms}
    # timed windows: the first window's first iterations pay the install (fresh hook state): skipped
    timed = [it for i in range(len(plan)) if plan[i] == "timed" for it in its[i * w + 1:(i + 1) * w]][2:]
    inside = [sum(it["hooks"].values()) / it["cpu"] for it in timed]
    calls = res["timer_calls"]
    n_timed = sum(1 for p in plan if p == "timed") * w
    per_it = {k: statistics.median(it["hooks"][k] for it in timed) for k in calls}
    return {
        **out, "pairs": len(out["cpu"]["rel"]), "it_ms": out["cpu"]["off_ms"],
        "inside": inside, "inside_med": statistics.median(inside), "inside_ci": C.median_ci(inside),
        "inside_us": statistics.median(sum(it["hooks"].values()) for it in timed) / 1e3,
        "allocs_per_it": res["allocs_per_it"],
        # per call: the median per-iteration time of each hook over its calls per iteration
        # (medians, so time slices lost to other processes inside a hook do not count)
        "per_call_ns": {k: per_it[k] / (calls[k] / n_timed) for k in calls if calls[k]},
        "calls_per_it": {k: calls[k] / n_timed for k in calls},
        "clock_ns": res["clock_ns"],
    }


def hand_child(args, core: int) -> dict:
    cmd = colocate([sys.executable, "-c", HAND, "300"])
    res = result_of(run(cmd, core, args.timeout), cmd)
    n = res["iterations"]
    res["per_call_ns"] = {k: res["per_it_ns"][k] / (res["calls"][k] / n) for k in res["calls"] if res["calls"][k]}
    return res


def alloc_micro(args, core: int, console) -> dict:
    code = [sys.executable, "-c", MICRO, str(args.alloc_chunk), "8"]
    sides = {"plain": plain(code, core), "colocate": colocate(code)}
    got = {"plain": [], "colocate": []}
    for r in range(args.alloc_pairs):
        for side in (("plain", "colocate") if r % 2 == 0 else ("colocate", "plain")):
            got[side].append(result_of(run(sides[side], core, args.timeout), sides[side])["ns_per_alloc"])
        console.print(f"  allocator pair {r + 1}/{args.alloc_pairs}: plain {got['plain'][-1]:.0f} ns, "
                      f"colocate {got['colocate'][-1]:.0f} ns per allocation + free", highlight=False)
    diff = [c - p for p, c in zip(got["plain"], got["colocate"])]
    return {"plain": statistics.median(got["plain"]), "colocate": statistics.median(got["colocate"]),
            "diff": diff, "diff_med": statistics.median(diff), "diff_ci": C.median_ci(diff),
            "cmd_plain": sides["plain"], "cmd_colocate": sides["colocate"]}


def startup(args, core: int, console) -> dict:
    out = {}
    for name, code in STARTUP.items():
        cmd = [sys.executable, "-c", code]
        sides = {"plain": plain(cmd, core), "colocate": colocate(cmd)}
        got = {s: {"start": [], "total": []} for s in sides}
        for r in range(args.startup_pairs):
            for side in (("plain", "colocate") if r % 2 == 0 else ("colocate", "plain")):
                t0 = time.monotonic()
                proc = run(sides[side], core, args.timeout)
                t1 = time.monotonic()
                marks = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("@@T@@")]
                if proc.returncode != 0 or not marks:
                    raise C.RunError(f"exit {proc.returncode}: {C.display(sides[side])}\n{proc.stderr[-2000:]}")
                got[side]["start"].append(float(marks[-1]) - t0)
                got[side]["total"].append(t1 - t0)
        res = {"cmd_plain": sides["plain"], "cmd_colocate": sides["colocate"]}
        for what in ("start", "total"):
            diff = [c - p for p, c in zip(got["plain"][what], got["colocate"][what])]
            res[what] = {"plain": statistics.median(got["plain"][what]),
                         "colocate": statistics.median(got["colocate"][what]),
                         "diff_med": statistics.median(diff), "diff_ci": C.median_ci(diff)}
        console.print(f"  start-up {name!r}: plain {res['start']['plain']:.3f} s, colocate "
                      f"{res['start']['colocate']:.3f} s to the mark ({args.startup_pairs} pairs)", highlight=False)
        out[name] = res
    return out


# ---------------------------------------------------------------- report

def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def interval(lo: float, hi: float, fmt=pct) -> str:
    return f"{fmt(lo)} .. {fmt(hi)}"


def verdict(lo: float, hi: float, goal: float) -> str:
    return "yes" if hi <= goal else ("no" if lo > goal else "undecided")


def main(argv=None) -> int:
    args = parse_args(argv)
    console = C.console()
    core = C.sim_core(0) if args.core is None else args.core
    info = C.machine_info()
    load_before = os.getloadavg()
    console.print(f"[bold]colocate runtime overhead[/] - sim GPU 0 on core {core}; windows of {args.window} "
                  f"iterations, {args.pairs} off/on pairs + {args.timed_windows} timed windows per example",
                  highlight=False)

    # warm-up: builds the allocator extension if its source changed
    warm = colocate([sys.executable, "-c", "import torch"])
    proc = run(warm, core, args.timeout)
    if proc.returncode != 0:
        console.print(f"[red]warm-up failed[/]: {C.display(warm)}\n{proc.stderr[-2000:]}")
        return 2

    try:
        hooks = {}
        for e in args.examples:
            t0 = time.monotonic()
            hooks[e] = h = analyse_hooks(hooks_child(e, args, core))
            console.print(f"  {e:<11} {h['it_ms']:.2f} ms/it (CPU); hooks on-off {pct(h['cpu']['med'])} "
                          f"[{interval(*h['cpu']['ci'][:2])}] CPU, {pct(h['wall']['med'])} wall, over {h['pairs']} "
                          f"pairs; inside hooks {h['inside_us']:.1f} us/it; {h['allocs_per_it']:.0f} allocations/it "
                          f"({time.monotonic() - t0:.0f} s)", highlight=False)
        hand = hand_child(args, core)
        console.print(f"  hand-update loop (no optimizer): {hand['it_ms']:.2f} ms/it, boundaries {hand['boundaries']}",
                      highlight=False)
        alloc = alloc_micro(args, core, console)
        start = startup(args, core, console)
    except C.RunError as exc:
        console.print(f"[red]run failed[/]: {exc}")
        return 2
    load_after = os.getloadavg()

    # per-example table: CPU time of the training thread is the primary measure
    a_med, (a_lo, a_hi) = alloc["diff_med"], alloc["diff_ci"][:2]
    headers = ["example", "ms/it", "pairs", "hooks on-off, CPU", "95% CI", "wall", "95% CI",
               "inside hooks", "95% CI", "allocs/it", "allocator", "95% CI", "total (CPU)", "95% CI", "<= 1%"]
    rows, missed = [], False
    for e in args.examples:
        h = hooks[e]
        per = (h["allocs_per_it"] or 0.0) / (h["it_ms"] * 1e6)
        lo, hi = h["cpu"]["ci"][0] + per * a_lo, h["cpu"]["ci"][1] + per * a_hi
        v = verdict(lo, hi, GOAL_ITER)
        missed |= v == "no"
        rows.append([e, f"{h['it_ms']:.2f}", str(h["pairs"]), pct(h["cpu"]["med"]), interval(*h["cpu"]["ci"][:2]),
                     pct(h["wall"]["med"]), interval(*h["wall"]["ci"][:2]),
                     f"{pct(h['inside_med'])} ({h['inside_us']:.0f} us)", interval(*h["inside_ci"][:2]),
                     f"{h['allocs_per_it']:.0f}", pct(per * a_med), interval(per * a_lo, per * a_hi),
                     pct(h["cpu"]["med"] + per * a_med), interval(lo, hi), v])
    call_headers = ["example", "forward pre-hook", "optimizer step hook (boundary)", "backward wrapper",
                    "pre-hook calls/it", "clock pair"]
    call_rows = []
    for e in args.examples:
        h = hooks[e]
        pc, cp = h["per_call_ns"], h["calls_per_it"]
        call_rows.append([e, f"{pc.get('forward', 0) / 1e3:.1f} us", f"{pc.get('optimizer', 0) / 1e3:.1f} us",
                          "removed once an optimizer is known" if pc.get("backward", 0) == 0 else
                          f"{pc['backward']:.0f} ns",
                          f"{cp.get('forward', 0):.2f}", f"{h['clock_ns']:.0f} ns"])
    pc = hand["per_call_ns"]
    call_rows.append(["hand-update loop (no optimizer)", f"{pc.get('forward', 0) / 1e3:.1f} us (incl. the boundary)",
                      "-", f"{pc.get('backward', 0):.0f} ns", f"{hand['calls']['forward'] / hand['iterations']:.2f}",
                      "-"])
    s_headers = ["command", "measure", "plain s", "colocate s", "added s (median)", "95% CI", "<= 0.3 s"]
    s_rows = []
    for name, res in start.items():
        for what, label in (("start", "spawn -> import done"), ("total", "whole command")):
            r = res[what]
            lo, hi = r["diff_ci"][:2]
            v = verdict(lo, hi, GOAL_START_S) if (name, what) == ("import torch", "start") else "-"
            missed |= v == "no"
            s_rows.append([name, label, f"{r['plain']:.3f}", f"{r['colocate']:.3f}", f"{r['diff_med']:+.3f}",
                           f"{lo:+.3f} .. {hi:+.3f}", v])

    for title, hdr, body in (
            ("per-iteration overhead, sim, share 1, no cap (sign-test 95% CIs)", headers, rows),
            ("hook cost per call (timed windows: median per iteration / calls per iteration; two clock reads included)",
             call_headers, call_rows),
            (f"start-up, {args.startup_pairs} alternating pairs", s_headers, s_rows)):
        table = Table(title=title)
        for hname in hdr:
            table.add_column(hname, justify="left" if hname in ("example", "command", "measure") else "right")
        for row in body:
            table.add_row(*row)
        console.print(table)
    alloc_line = (f"Allocator microbenchmark (CPU time): plain {alloc['plain']:.0f} ns, colocate {alloc['colocate']:.0f} "
                  f"ns per allocation + free; added {a_med:+.0f} ns (95% CI {a_lo:+.0f} .. {a_hi:+.0f}).")
    console.print(alloc_line, highlight=False)

    if not args.no_write:
        e0 = args.examples[0]
        body = "\n".join([
            "## Runtime overhead (sim, share 1, no cap)",
            "",
            *C.machine_lines(info),
            f"- command: `{C.invocation()}`; load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}",
            f"- hooks: one `colocate run --device sim --sm-share 1` process per example runs the unmodified "
            f"`examples/train_X.py --threads 1 --host-ms 0`; every {args.window} iterations the runtime's hooks are "
            f"switched on or off (`torch_hooks.hooks.install_hooks` / `remove_hooks`, the switch's own time "
            f"excluded); {args.pairs} adjacent off/on window pairs, order alternating (off-on, on-off): each gives "
            "on / off - 1 of the windows' median iteration time (a window's first iteration dropped). CPU = the "
            "training thread's CPU time (`time.thread_time_ns`: time slices lost to other processes do not count; "
            "the primary measure on a shared machine), wall = `perf_counter_ns`.",
            f"- inside hooks: {args.timed_windows} more windows with the hooks installed with a `HookTimer`: ns spent in "
            "the hooks' own code (boundary included) / the iteration's CPU time, per iteration.",
            f"- allocator: the sim allocator cannot be switched off in a process; {args.alloc_pairs} alternating pairs "
            "of processes (pinned plain python / `colocate run`) time allocation + free of mixed sizes (64 B..1 MiB, "
            "256 live) in CPU time; the added ns per allocation x the example's allocations per iteration / its "
            "CPU ms per iteration.",
            f"- start-up: `python -c \"import time, torch; print(time.monotonic())\"` pinned to core {core} vs the same "
            f"under `colocate run --device sim`, {args.startup_pairs} alternating pairs; spawn -> the job's mark after "
            "`import torch` (runtime installed), and the whole command; `python -c pass` = the launcher alone.",
            f"- intervals: sign-test confidence intervals for the median (distribution-free; coverage "
            f"{100 * hooks[e0]['cpu']['ci'][2]:.1f}% for {hooks[e0]['pairs']} pairs); total = hooks (CPU) + "
            "allocator, interval = the sum of the ends. Verdict yes: the interval's upper end meets the goal; no: "
            "its lower end misses it; else undecided.",
            "",
            C.markdown_table(headers, rows),
            "",
            "Hook cost per call (timed windows):",
            "",
            C.markdown_table(call_headers, call_rows),
            "",
            alloc_line,
            "",
            C.markdown_table(s_headers, s_rows),
            "",
            f"Goals (issue 7): <= 1% per iteration at share 1 with no cap; <= {GOAL_START_S:g} s added to start-up.",
        ])
        path = C.update_results(SECTION, body, Path(args.results))
        console.print(f"wrote section '{SECTION}' of {path}")
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
