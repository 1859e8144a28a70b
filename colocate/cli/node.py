"""``colocate node``: run the node coordinator daemon."""

from __future__ import annotations

import argparse
import sys

from colocate.cli._common import PORT, POSITIVE_INT, SIZE
from colocate.config import POLICY_NAMES
from colocate.env import DEVICE_CHOICES, LOG_LEVELS

EPILOG = """\
examples:
  colocate node --device sim --sim-gpus 2 --sim-gpu-mem 8GiB --metrics-port 9464
  colocate node --policy exclusive --record /tmp/node.jsonl

Jobs join with `colocate run --node ENDPOINT ...`; operators use `colocate ctl` and
`colocate top`. SIGTERM or SIGINT stops the node; running jobs keep running at their
last limits and register again when a node comes back on the same endpoint.
Exit code: 0 after a clean stop, 1 if it cannot start, 2 on bad options or config.
"""


def register(sub) -> None:
    from colocate.endpoints import node_endpoint

    p = sub.add_parser(
        "node", help="run the node coordinator (one per machine)",
        description="Own this machine's GPUs (NVML, or simulated ones) and co-locate jobs on them: guaranteed jobs "
        "keep their resources, opportunistic jobs get what the guaranteed ones leave idle.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--endpoint", default=node_endpoint(), help="job endpoint (default %(default)s)")
    p.add_argument("--ctl", default=None, metavar="ENDPOINT",
                   help="operator endpoint for `colocate ctl`/`top` (default: the job endpoint + '.ctl')")
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="GPU kind (default auto)")
    p.add_argument("--sim-gpus", type=POSITIVE_INT, default=1, metavar="N", help="sim: number of simulated GPUs (default 1)")
    p.add_argument("--sim-gpu-mem", type=SIZE, default=16 << 30, metavar="SIZE",
                   help="sim: memory of each simulated GPU (default 16GiB)")
    p.add_argument("--policy", default=None, choices=POLICY_NAMES,
                   help="co-location policy (default adaptive, or the config file's)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON file of node config fields (see the README's node configuration table)")
    p.add_argument("--metrics-port", type=PORT, default=None, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")
    p.add_argument("--record", default=None, metavar="PATH",
                   help="append every batch report and limit change as JSON lines (format: colocate/record.py)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.node.daemon import NodeOptions, StartError, run

    opts = NodeOptions(endpoint=args.endpoint, ctl=args.ctl, device=args.device, sim_gpus=args.sim_gpus,
                       sim_gpu_mem=args.sim_gpu_mem, policy=args.policy, config=args.config,
                       metrics_port=args.metrics_port, record=args.record, log_level=args.log_level)
    try:
        return run(opts)
    except StartError as exc:
        print(f"colocate node: {exc}", file=sys.stderr)
        return exc.code
