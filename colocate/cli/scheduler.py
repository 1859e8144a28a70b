"""``colocate scheduler``: run the global scheduler daemon."""

from __future__ import annotations

import argparse
import sys

from colocate.base.env import LOG_LEVELS
from colocate.cli._common import ENDPOINT, PORT, argtype, bounded_int, seconds

EPILOG = """\
examples:
  colocate scheduler --bind tcp://127.0.0.1:5555 --state sched.db
  colocate scheduler --bind tcp://0.0.0.0:5555 --state /var/lib/colocate/sched.db --keys /etc/colocate/keys \\
                     --config policy.toml --metrics-port 9465

--config takes a policy preset (fifo, gang-binpack, multi-queue, backfill, antman, quota, ...)
or a TOML file (see docs/scheduler.md). Nodes join with `colocate node --scheduler ENDPOINT`;
users submit with `colocate submit`. Every job state change is committed to the state file
before it is acted on: after a crash, start it again on the same file. One scheduler per state
file: a second one exits at once, naming the holder of PATH.db.lock (never delete that file while
its holder runs: the holder would stop at its next commit, exit 1). When the state file cannot
be written (disk full, read-only), it refuses submits and cancels with one line, keeps its nodes,
and resumes by itself once it can write again.

Peers authenticate with CURVE keys, and who they are comes from their key (`colocate keys --help`):
without --keys the user's own folder ~/.config/colocate/keys ($XDG_CONFIG_HOME) is used, made on
first start; local nodes and clients find it there. --insecure runs without keys (no identities:
any local process may register as a node and cancel any job), on loopback only.
Exit code: 0 after a clean stop (SIGTERM/SIGINT), 1 if it cannot start (or its policy failed
and could not be rebuilt from the state file, or its lock file was removed or replaced), 2 on bad options.
"""


LIVENESS = bounded_int(1, 1000, "heartbeats")


def _state_path(text: str) -> str:
    if not text.strip():
        raise ValueError("an empty path (SQLite would keep the state in a temporary file, lost at exit)")
    return text


def register(sub) -> None:
    from colocate.base.endpoints import (
        NODE_HEARTBEAT_S,
        NODE_LEASE_S,
        NODE_LIVENESS,
        SCHEDULER_ENDPOINT,
        replace_after_s,
    )

    p = sub.add_parser("scheduler", help="run the global scheduler (one per cluster)",
                       description="Place jobs on the nodes that join it: gang and bin-packing for guaranteed jobs, "
                       "idle capacity for opportunistic ones, with the queueing policy of --config.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bind", default=SCHEDULER_ENDPOINT, type=ENDPOINT, metavar="ENDPOINT",
                   help="endpoint (default %(default)s)")
    p.add_argument("--state", required=True, type=argtype(_state_path, "path"), metavar="PATH.db",
                   help="SQLite state file (created if missing)")
    p.add_argument("--config", default="antman", metavar="NAME|FILE",
                   help="policy preset or TOML file (default %(default)s)")
    p.add_argument("--keys", default=None, metavar="DIR",
                   help="CURVE key folder (default: $COLOCATE_KEYS, else ~/.config/colocate/keys, made on first start)")
    p.add_argument("--insecure", action="store_true",
                   help="no CURVE keys: no peer is authenticated (loopback only)")
    p.add_argument("--metrics-port", type=PORT, default=None, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")
    p.add_argument("--heartbeat", type=seconds(0.05, 60), default=NODE_HEARTBEAT_S, metavar="S",
                   help=f"node heartbeat interval in seconds (default {NODE_HEARTBEAT_S:g})")
    p.add_argument("--liveness", type=LIVENESS, default=NODE_LIVENESS, metavar="N",
                   help=f"missed heartbeats before a node is down (default {NODE_LIVENESS}: "
                        f"{NODE_HEARTBEAT_S * NODE_LIVENESS:g} s of silence)")
    p.add_argument("--lease", type=seconds(0, 3600), default=NODE_LEASE_S, metavar="S",
                   help=f"nodes' lease in seconds: a node's placed workers stop when it has not heard the scheduler "
                        f"for this long, and a silent node's jobs are placed again {replace_after_s():g} s after it "
                        f"was last heard (default {NODE_LEASE_S:g}; 0: no fencing, placed again at once)")
    p.add_argument("--seed", type=int, default=0, help="seed of the policy's random choices (default 0)")
    p.add_argument("--topology", default=None, metavar="FILE.csv",
                   help="network topology, a CSV node_id,switch[,rack]: overrides the labels nodes give "
                        "(colocate node --topology); read by the topology placement plugin")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.set_defaults(func=main)


def main(args) -> int:
    from cluster.server.startup import SchedulerOptions, StartError, run

    opts = SchedulerOptions(bind=args.bind, state=args.state, config=args.config, keys=args.keys,
                            insecure=args.insecure,
                            metrics_port=args.metrics_port, heartbeat_s=args.heartbeat, liveness=args.liveness,
                            lease_s=args.lease,
                            seed=args.seed, log_level=args.log_level, topology=args.topology)
    try:
        return run(opts)
    except StartError as exc:
        print(f"colocate scheduler: {exc}", file=sys.stderr)
        return exc.code
