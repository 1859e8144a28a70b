"""A guaranteed job's memory burst next to an opportunistic job (adaptive node, one sim GPU).

The guaranteed job (train_cnn, ``--gpu-mem 2GiB``) keeps an extra ``--burst-mib`` of
device memory alive from iteration ``--burst-at`` on; the opportunistic job
(train_transformer) starts with all the memory the guaranteed job leaves
(``opp_start_mem_fraction`` 1.0, so the burst must take memory back). Measured
from the node's record: when the guaranteed job's first report with the burst
reached the node, when the node sent the opportunistic job a smaller cap, and
when the opportunistic job acknowledged it (at its first boundary under it, or
at once when it waits paused: a paused job releases its cache when its cap
drops); plus the guaranteed job's ``host_bytes_peak`` (must stay 0).

    python benchmarks/memory_burst.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import invocation, machine_info, machine_lines, markdown_table, update_results

from colocate.demo.node import DemoJob, run_scenario

MiB = 1 << 20


def one_run(workdir: str, burst_at: int, burst_mib: int, duration: float) -> dict:
    cfg = os.path.join(workdir, "node.json")
    with open(cfg, "w") as f:
        json.dump({"policy": "adaptive", "opp_start_mem_fraction": 1.0}, f)
    g = DemoJob("guaranteed-cnn", "guaranteed", "train_cnn.py",
                ("--host-ms", "14", "--mem-burst-at", str(burst_at), "--mem-burst-mib", str(burst_mib)), "2GiB")
    o = DemoJob("opportunistic-lm", "opportunistic", "train_transformer.py", ("--host-ms", "0"))
    run = run_scenario("burst", "adaptive", [g, o], duration, workdir, sim_gpu_mem="4GiB",
                       node_args=("--config", cfg))
    rows = [json.loads(line) for line in open(run.record)]
    g_reports = [r for r in rows if r["kind"] == "report" and r["job_id"] == g.job_id]
    base = max((r["mem_reserved"] for r in g_reports[:burst_at // 2]), default=0)
    burst = next((r for r in g_reports if r["mem_reserved"] >= base + burst_mib * MiB // 2), None)
    out = {"burst_seen": burst is not None, "g_host_bytes_peak": run.stats.get(g.job_id, {}).get("host_bytes_peak"),
           "o_host_bytes_peak": run.stats.get(o.job_id, {}).get("host_bytes_peak"), "exit_codes": run.exit_codes}
    if burst is None:
        return out
    o_limits = [r for r in rows if r["kind"] == "limits" and r["job_id"] == o.job_id]
    before = [r for r in o_limits if r["node_t"] < burst["node_t"]]  # the reply to the burst has the same node_t
    cap_before = before[-1]["limits"]["mem_cap"] if before else None
    shrink = next((r for r in o_limits if r["node_t"] >= burst["node_t"] and cap_before is not None
                   and r["limits"]["mem_cap"] < cap_before), None)
    out.update(cap_before=cap_before, g_reserved_before=base, g_reserved_after=burst["mem_reserved"])
    if shrink is not None:
        # in force: the job's acknowledgement (at its first boundary under the cap, or at once while paused)
        seq = shrink["limits"]["seq"]
        # (node receive times: the job's own clock is not comparable with the node's)
        applied = [r["node_t"] for r in rows if r["kind"] in ("applied", "report") and r["job_id"] == o.job_id
                   and r["limits_seq"] >= seq]
        out.update(cap_after=shrink["limits"]["mem_cap"], shrink_s=shrink["node_t"] - burst["node_t"],
                   in_force_s=(min(applied) - burst["node_t"]) if applied else None,
                   o_share_at_shrink=shrink["limits"]["sm_share"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burst-at", type=int, default=200, help="G iteration of the burst (default: after the baseline)")
    ap.add_argument("--burst-mib", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    table = []
    for i in range(args.repeats):
        print(f"[{i + 1}/{args.repeats}] burst run", flush=True)
        r = one_run(tempfile.mkdtemp(prefix="colocate-burst-"), args.burst_at, args.burst_mib, args.duration)
        fmt = lambda v, scale=1.0, unit="": "-" if v is None else f"{v * scale:.0f}{unit}"
        table.append([str(i + 1), fmt(r.get("g_reserved_before"), 1 / MiB, " MiB"),
                      fmt(r.get("g_reserved_after"), 1 / MiB, " MiB"), fmt(r.get("cap_before"), 1 / MiB, " MiB"),
                      fmt(r.get("cap_after"), 1 / MiB, " MiB"), fmt(r.get("shrink_s"), 1000, " ms"),
                      fmt(r.get("in_force_s"), 1000, " ms"), str(r.get("o_share_at_shrink", "-")),
                      str(r.get("g_host_bytes_peak")),
                      str(r.get("o_host_bytes_peak"))])
    headers = ["run", "G reserved before", "G reserved at burst", "O cap before", "O cap after",
               "burst report -> O cap sent", "burst report -> O cap in force", "O share then", "G host bytes peak",
               "O host bytes peak"]
    md = markdown_table(headers, table)
    print(md)
    if not args.no_write:
        info = machine_info()
        update_results("memory_burst", "\n".join([
            "## Guaranteed memory burst (adaptive node, sim GPU of 4 GiB)", "", *machine_lines(info),
            f"- command: `{invocation()}`",
            f"- G = train_cnn (--gpu-mem 2GiB, +{args.burst_mib} MiB from iteration {args.burst_at}), "
            "O = train_transformer starting with all memory G leaves (opp_start_mem_fraction 1.0); "
            "times on the node's clock from the G report that carried the burst", "", md]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
