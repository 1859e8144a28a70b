"""Network-aware gang placement on the Philly trace: the ``topology`` plugin against topology-blind
bin-packing (``gang-binpack``), both under the same spread model (``cluster.sim.network``), on 128 nodes
of 8 GPUs arranged as 16 switches of 8 nodes (``--topology 16x8``).

Reported per policy, over every job of more than one GPU ("multi-GPU") and over those placed on more than
one node ("multi-node"): the mean nodes
and switches a job's (last) placement spans, the share of multi-GPU jobs on one switch, and the mean JCT
and queueing delay of all jobs and of multi-GPU jobs. The spread model is ``PUBLISHED`` unless
``--spread`` says otherwise (``none`` shows the placement alone, with no slowdown).

    python benchmarks/topology.py                      # ~1-2 min per policy on 2 idle cores
    python benchmarks/topology.py --limit 20000 --no-write
    python benchmarks/topology.py --cluster 64x8 --topology 8x8 --section topology-64x8   # a loaded cluster
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C

from cluster.config import parse_config
from cluster.sim import ColocationModel, LucidTable, SimConfig, load_workload, run_policy
from cluster.sim.network import parse_spread
from cluster.traces.topology import load_topology

TRACE = C.ROOT.parent / "shared" / "traces" / "philly-pollux" / "philly.csv"


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def policies(waits: list[float]) -> list[tuple[str, dict]]:
    out = [("gang-binpack (topology-blind)", {"plugins": ["fifo", "gang", "binpack"]})]
    for w in waits:
        out.append((f"topology wait_s={w:g}", {"plugins": ["fifo", "gang", "topology"],
                                                "plugin": {"topology": {"wait_s": w}}}))
    return out


def figures(sim) -> dict:
    multi = [j for j in sim.jobs if j.spec.total_gpus > 1 and j.end is not None]
    spread = [j for j in multi if j.span[0] > 1]
    done = [j for j in sim.jobs if j.end is not None]

    def mean(xs):
        return statistics.fmean(xs) if xs else float("nan")

    return {
        "multi": len(multi), "multi_node": len(spread),
        "nodes": mean([j.span[0] for j in multi]), "switches": mean([j.span[1] for j in multi]),
        "nodes_mn": mean([j.span[0] for j in spread]), "switches_mn": mean([j.span[1] for j in spread]),
        "one_switch": mean([1.0 if j.span[1] == 1 else 0.0 for j in multi]),
        "jct_h": mean([j.end - j.submit for j in done]) / 3600,
        "jct_multi_h": mean([j.end - j.submit for j in multi]) / 3600,
        "queue_multi_h": mean([j.wait for j in multi]) / 3600,
        "done": len(done),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--cluster", default="128x8")
    ap.add_argument("--topology", default="16x8")
    ap.add_argument("--spread", default="published", help="published | none | node=F,switch=F[,rack=F]")
    ap.add_argument("--waits", default="0,600", help="topology plugin wait_s values, comma-separated")
    ap.add_argument("--limit", type=int, default=None, help="first N jobs only")
    ap.add_argument("--section", default="topology", type=C.section_name, help="the RESULTS.md section to write (default topology)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if not Path(args.trace).exists():
        raise SystemExit(f"no trace at {args.trace}")
    try:
        spread = parse_spread(args.spread)
        waits = [float(w) for w in args.waits.split(",") if w.strip()]
    except ValueError as e:
        raise SystemExit(f"benchmarks/topology.py: {e}") from None
    wl = load_workload(args.trace, cluster=args.cluster, table=LucidTable.empty(), limit=args.limit)
    wl = dataclasses.replace(wl, nodes=load_topology(args.topology, wl.nodes))
    model = ColocationModel(LucidTable.empty())
    cfg = SimConfig(spread=spread)
    rows = []
    for label, raw in policies(waits):
        t0, c0 = time.perf_counter(), time.process_time()
        sim, _, _ = run_policy(wl, label, parse_config(raw, label), model, cfg)
        f = figures(sim)
        wall, cpu, la = time.perf_counter() - t0, time.process_time() - c0, load_avg()
        rows.append([label, f"{f['multi']:,}", f"{f['nodes']:.3f}", f"{f['switches']:.3f}", f"{f['one_switch']:.1%}",
                     f"{f['multi_node']:,}", f"{f['nodes_mn']:.2f}", f"{f['switches_mn']:.2f}",
                     f"{f['jct_h']:.3f}", f"{f['jct_multi_h']:.2f}", f"{f['queue_multi_h']:.3f}",
                     f"{cpu:.0f} s", f"{wall:.0f} s (load {la})"])
        print(" | ".join(rows[-1]), flush=True)
    body = "\n".join([
        f"## Network-aware placement (Philly, {args.cluster} as {args.topology} switches x nodes)",
        "",
        *C.machine_lines(C.machine_info()),
        f"- command: `{C.invocation()}`; the machine is shared: the load average is beside each run's wall time",
        f"- trace: {len(wl.jobs):,} jobs{f' (first {args.limit:,})' if args.limit else ''}; spread model: {spread} "
        "(`cluster.sim.network`; node factor from Gavel's measurements, switch factor assumed: docs/simulator.md)",
        "- multi-GPU: jobs of more than one GPU; multi-node: those whose placement spans more than one node; spans "
        "are of each job's last placement; JCT = end - submit, in hours; identical inputs and seed for every policy",
        "",
        C.markdown_table(["policy", "multi-GPU jobs", "mean nodes", "mean switches", "on one switch",
                          "multi-node jobs", "their nodes", "their switches", "mean JCT h (all)",
                          "mean JCT h (multi-GPU)", "mean queue h (multi-GPU)", "cpu", "wall"], rows),
    ])
    print(body)
    if not args.no_write:
        C.update_results(args.section, body)
        print(f"wrote section {args.section!r} of {C.RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
