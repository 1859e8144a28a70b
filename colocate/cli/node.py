"""``colocate node``: run the node coordinator daemon."""

from __future__ import annotations

import argparse
import sys

from colocate.base.env import LOG_LEVELS
from colocate.cli._common import ENDPOINT, NODE_ID, PORT, add_device_options, argtype

EPILOG = """\
examples:
  colocate node --device sim --sim-gpus 2 --sim-gpu-mem 8GiB --metrics-port 9464
  colocate node --policy exclusive --record /tmp/node.jsonl
  colocate node --scheduler tcp://sched:5555 --node-id gpu7 --host 10.0.0.7 --keys ~/.colocate/keys

With --scheduler (or COLOCATE_SCHEDULER set) the node joins the global scheduler and starts the
workers it places there (docs/node-placements.md): each under `colocate run`, logs in
--log-dir, its table in --state-dir. Without either it runs standalone.

Jobs join with `colocate run --node ENDPOINT ...`; operators use `colocate ctl` and
`colocate top`. SIGTERM or SIGINT stops the node; running jobs keep running at their
last limits and register again when a node comes back on the same endpoint (a node
started again with the same --state-dir re-adopts the workers it had started). With
--scheduler, the workers it placed stop once its lease lapses (about 10 s without the
node: they are fenced, and the scheduler places those jobs again); start it again
within that time to keep them.
Exit code: 0 after a clean stop, 1 if it cannot start, 2 on bad options or config.
"""


def register(sub) -> None:
    from colocate.base.endpoints import node_endpoint

    p = sub.add_parser(
        "node", help="run the node coordinator (one per machine)",
        description="Own this machine's GPUs (NVML, or simulated ones) and co-locate jobs on them: guaranteed jobs "
        "keep their resources, opportunistic jobs get what the guaranteed ones leave idle.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--endpoint", default=node_endpoint(), type=ENDPOINT, help="job endpoint (default %(default)s)")
    p.add_argument("--ctl", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="operator endpoint for `colocate ctl`/`top` (default: the job endpoint + '.ctl')")
    add_device_options(p, "sim: number of simulated GPUs, 1..64 (default 1), or typed ones with relative speeds, "
                       "e.g. 2:V100,2:T4@0.6 (V100 1, P100 0.81, K80 0.25 built in; others need @SPEED in [0.001, 1]): "
                       "device time scales by 1/speed, and the type is the model the scheduler sees", typed=True)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON file of node config fields (see the README's node configuration table)")
    p.add_argument("--metrics-port", type=PORT, default=None, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")
    p.add_argument("--record", default=None, metavar="PATH",
                   help="append every batch report and limit change as JSON lines (format: colocate/node/record.py)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    g = p.add_argument_group("scheduler link")
    g.add_argument("--scheduler", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="join the global scheduler at ENDPOINT, e.g. tcp://HOST:5555 (default: COLOCATE_SCHEDULER "
                        "if set, else run standalone)")
    g.add_argument("--node-id", default=None, type=NODE_ID, metavar="ID",
                   help="this node's name at the scheduler (default: host name)")
    g.add_argument("--host", default=None, metavar="ADDR",
                   help="address other nodes reach this one at, MASTER_ADDR of its gangs (default: host name)")
    g.add_argument("--topology", default=(), type=argtype(_topology, "topology"), metavar="switch=S,rack=R",
                   help="this node's network labels, sent to the scheduler (its topology file overrides them); "
                        "the topology placement plugin packs gangs by them")
    g.add_argument("--log-dir", default=None, metavar="DIR",
                   help="worker logs, DIR/CLUSTER/JOB/worker-RANK.PLACEMENT.log (CLUSTER: the scheduler's cluster id, "
                        "'unnamed' without one; default: STATE_DIR/logs)")
    g.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the node's worker table, kept across restarts (default: ~/.local/state/colocate/node-ID)")
    g.add_argument("--keys", default=None, metavar="DIR",
                   help="CURVE key folder holding scheduler.key and node-ID.key_secret (default: $COLOCATE_KEYS, "
                        "else ~/.config/colocate/keys, where a local node makes its key on first start)")
    g.add_argument("--insecure", action="store_true",
                   help="no CURVE, for a scheduler started with --insecure (loopback only)")
    p.set_defaults(func=main)


def _topology(text: str):
    from colocate.protocol import parse_topology

    return parse_topology(text)


def main(args) -> int:
    import os

    from colocate.base.endpoints import scheduler_endpoint
    from colocate.node.coordinator import NodeOptions, StartError, run

    scheduler = args.scheduler or (scheduler_endpoint() if os.environ.get("COLOCATE_SCHEDULER") else None)
    opts = NodeOptions(endpoint=args.endpoint, ctl=args.ctl, device=args.device, sim_gpus=args.sim_gpus,
                       sim_gpu_mem=args.sim_gpu_mem, policy=args.policy, config=args.config,
                       metrics_port=args.metrics_port, record=args.record, log_level=args.log_level,
                       scheduler=scheduler, node_id=args.node_id, host=args.host, log_dir=args.log_dir,
                       state_dir=args.state_dir, keys=args.keys, insecure=args.insecure, topology=args.topology)
    try:
        return run(opts)
    except StartError as exc:
        print(f"colocate node: {exc}", file=sys.stderr)
        return exc.code
