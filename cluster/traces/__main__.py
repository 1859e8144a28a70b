"""``python -m cluster.traces [--nodes] [--format F] [--allow-no-duration] PATH...``: read trace
files (or node lists with ``--nodes``) and print their summaries, one JSON object per file."""

from __future__ import annotations

import argparse
import json
import time

from cluster.traces import load_nodes, load_trace
from cluster.traces.summary import summarize_jobs, summarize_nodes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cluster.traces", description=__doc__)
    p.add_argument("paths", nargs="+")
    p.add_argument("--nodes", action="store_true", help="the files are node lists")
    p.add_argument("--format", default=None)
    p.add_argument("--allow-no-duration", action="store_true")
    p.add_argument("--problems", type=int, default=0, help="print up to N problem lines per file")
    args = p.parse_args(argv)
    for path in args.paths:
        t = time.perf_counter()
        if args.nodes:
            nodes = load_nodes(path, format=args.format)
            facts, problems = summarize_nodes(nodes), nodes.problems
        else:
            opts = {"allow_no_duration": True} if args.allow_no_duration else {}
            trace = load_trace(path, args.format, **opts)
            facts, problems = summarize_jobs(trace), trace.problems
        facts["load_s"] = round(time.perf_counter() - t, 3)
        print(json.dumps(facts))
        for line in problems[: args.problems]:
            print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
