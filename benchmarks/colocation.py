"""Four co-location modes over several example pairs, repeated, plus control latency.

For every pair in ``--pairs`` and every repeat, runs the demo's scenarios
(the guaranteed job solo first and last, the opportunistic job solo, then exclusive,
pack, static, adaptive) with real node and
job processes on one simulated GPU, and reports per mode the median over
repeats, with the range over repeats, of: guaranteed throughput vs solo, device
utilization (and its gain over the guaranteed job's solo utilization),
opportunistic throughput vs solo and the share of idle device time the
opportunistic job used (overall, and while it ran), and where the opportunistic
job's time went (its phases: start-up, baseline, paused, running, as parts of the
measured window).

Control latency: for every limit change the adaptive node sent, the time from
sending it (node clock) to the end of the job's first mini-batch that ran under
it (job clock; both are CLOCK_MONOTONIC on one machine), p50 and p99.

    python benchmarks/colocation.py [--pairs cnn+transformer,recsys+cnn] [--repeats 5] [--duration 12]
        [--modes adaptive] [--yield-variants gate,priority+gate]

``--yield-variants`` adds adaptive runs whose opportunistic job yields only in
the named ways (``COLOCATE_YIELD_VIA``), labelled ``adaptive[WAY]``: an ablation
of the device priority and the operator gate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import invocation, machine_info, machine_lines, markdown_table, update_results

from colocate.base.vocab import Phase
from colocate.demo import node as demo

KEYS = ("guaranteed_throughput_ratio", "device_utilization", "utilization_gain",
        "opportunistic_throughput_ratio", "idle_share_used", "idle_share_used_running")


def control_latencies(record: str) -> list[float]:
    """Seconds from each SetLimits to the node's receipt of the job's first batch under it (node clock)."""
    rows = [json.loads(line) for line in open(record)]
    reports: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["kind"] == "report":
            reports.setdefault(r["job_id"], []).append((r["limits_seq"], r["node_t"]))
    out = []
    for r in rows:
        if r["kind"] != "limits":
            continue
        seq, sent = r["limits"]["seq"], r["node_t"]
        first = next((t for s, t in reports.get(r["job_id"], []) if s >= seq and t >= sent), None)
        if first is not None:
            out.append(first - sent)
    return out


def spread(rows: list[dict], key: str) -> str:
    """The median of ``key`` over repeats, with its range: ``0.991 (0.975-1.004)``."""
    vals = [r[key] for r in rows]
    return f"{statistics.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})"


def targets(results: dict[tuple[str, str], list[dict]]) -> list[str]:
    """One line per pair run in adaptive mode: its medians against the targets (G >= 0.98 of solo, idle share
    used >= 0.80)."""
    out = []
    for (pair, mode), rows in results.items():
        if mode != "adaptive":
            continue
        g = statistics.median(r["guaranteed_throughput_ratio"] for r in rows)
        idle = statistics.median(r["idle_share_used"] for r in rows)
        ok = g >= 0.98 and idle >= 0.80
        out.append(f"target {pair} adaptive (G >= 0.98 of solo, idle share used >= 0.80): G {g:.3f}, idle {idle:.3f}: "
                   f"{'met' if ok else 'NOT met'}")
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default="cnn+transformer,recsys+cnn,transformer+recsys")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--modes", default=",".join(demo.MODES), help="comma-separated subset of the demo's modes")
    ap.add_argument("--yield-variants", default="", metavar="LIST",
                    help="comma-separated COLOCATE_YIELD_VIA values for extra adaptive runs, '+' joining ways "
                         "(e.g. gate,priority+gate,none)")
    ap.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    ap.add_argument("--note", action="append", default=[], help="a line added to RESULTS.md (e.g. the machine was "
                    "shared); repeatable")
    args = ap.parse_args()
    pairs = [demo.PAIRS[p] for p in args.pairs.split(",")]
    modes = tuple(m for m in args.modes.split(",") if m)
    variants = tuple((f"adaptive[{v}]", "adaptive", {"COLOCATE_YIELD_VIA": v.replace("+", ",")})
                     for v in args.yield_variants.split(",") if v)
    per_repeat = 3 + len(modes) + len(variants)
    results: dict[tuple[str, str], list[dict]] = {}
    latencies: list[float] = []
    t_start = time.monotonic()
    total = len(pairs) * args.repeats
    n = 0
    for pair in pairs:
        for rep in range(args.repeats):
            n += 1
            workdir = tempfile.mkdtemp(prefix="colocate-bench-")
            print(f"[{n}/{total}] {pair.name} repeat {rep + 1}: {per_repeat} runs of {args.duration:g} s "
                  f"({time.monotonic() - t_start:.0f} s elapsed)", flush=True)
            runs = demo.run_pair(pair, args.duration, modes, progress=lambda name: print(f"    {name}", flush=True),
                                 workdir=workdir, variants=variants)
            rows, _ = demo.analyse(pair, runs)
            for row in rows:
                results.setdefault((pair.name, row["mode"]), []).append(row)
            if "adaptive" in runs:
                latencies += control_latencies(runs["adaptive"].record)

    headers = ["pair", "mode", "G vs solo", "idle share used", "... while running", "device util", "util / G solo",
               "O vs solo", *(f"O {p}" for p in Phase), "G host bytes peak"]
    table = []
    for (pair, mode), rows in results.items():
        table.append([pair, mode, spread(rows, "guaranteed_throughput_ratio"), spread(rows, "idle_share_used"),
                      spread(rows, "idle_share_used_running"), spread(rows, "device_utilization"),
                      f"{statistics.median(r['utilization_gain'] for r in rows):.2f}x",
                      spread(rows, "opportunistic_throughput_ratio"),
                      *(f"{statistics.median(r['opportunistic_phases'][p] for r in rows):.2f}" for p in Phase),
                      str(max(r["guaranteed_host_bytes_peak"] for r in rows))])
    lat_line = (f"control latency (limit sent -> first mini-batch ended under it, adaptive runs): "
                f"n={len(latencies)}, p50 {pct(latencies, 0.5) * 1000:.1f} ms, p99 {pct(latencies, 0.99) * 1000:.1f} ms")
    md = markdown_table(headers, table)
    checks = targets(results)
    print(md)
    print(lat_line)
    print("\n".join(checks))
    if not args.no_write:
        info = machine_info()
        body = "\n".join([
            "## Co-location modes (one sim GPU, real node + job processes)",
            "",
            *machine_lines(info),
            f"- command: `{invocation()}` (pairs {args.pairs}, {args.repeats} repeat(s), {args.duration:g} s per run)",
            *(["- adaptive[WAY]: the opportunistic job yields only via WAY (`COLOCATE_YIELD_VIA`); plain adaptive "
               "uses the default (priority)"] if variants else []),
            "- medians over repeats (range in brackets); figures over the guaranteed job's window (first report + "
            "1 s warm-up to its last report); G = guaranteed, O = opportunistic; ratios vs each job's solo runs in "
            "the same repeat (G: mean of its first and last run); O start-up/baseline/paused/running: parts of the "
            "window the opportunistic job spent starting (before its first device work), held for the guaranteed "
            "job's solo baseline, paused (SLO break, memory, waiting) and running; '... while running': its busy "
            "time over the idle time of its running part",
            *([f"- {note}" for note in args.note]),
            "",
            md,
            "",
            f"- {lat_line}",
            *(f"- {c}" for c in checks),
        ])
        update_results("colocation", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
