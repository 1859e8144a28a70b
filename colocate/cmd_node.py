"""``colocate node``: run the node coordinator daemon."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from colocate.cmd_run import _arg
from colocate.units import parse_size


def default_endpoint() -> str:
    return f"ipc:///tmp/colocate-{os.getuid()}/node.sock"


def register(sub) -> None:
    p = sub.add_parser(
        "node", help="run the node coordinator (one per machine)",
        description="Own this machine's GPUs (NVML, or simulated ones) and co-locate jobs on them: guaranteed jobs "
        "keep their resources, opportunistic jobs get what the guaranteed ones leave idle. Jobs join with "
        "`colocate run --node ENDPOINT ...`.",
    )
    p.add_argument("--endpoint", default=default_endpoint(), help="job endpoint (default %(default)s)")
    p.add_argument("--ctl", default=None, metavar="ENDPOINT",
                   help="operator endpoint for `colocate ctl`/`top` (default: the job endpoint + '.ctl')")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "sim"), help="GPU kind (default auto)")
    p.add_argument("--sim-gpus", type=int, default=1, metavar="N", help="sim: number of simulated GPUs (default 1)")
    p.add_argument("--sim-gpu-mem", type=_arg(parse_size, "size"), default=16 << 30, metavar="SIZE",
                   help="sim: memory of each simulated GPU (default 16GiB)")
    p.add_argument("--policy", default=None, choices=("exclusive", "pack", "static", "adaptive"),
                   help="co-location policy (default adaptive, or the config file's)")
    p.add_argument("--config", default=None, metavar="FILE", help="JSON file with NodeConfig fields (colocate/config.py)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")
    p.add_argument("--record", default=None, metavar="PATH", help="append every batch report and limit change as JSON lines")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    from colocate.config import NodeConfig
    from colocate.device import node_gpus
    from colocate.node.core import NodeCore
    from colocate.node.server import NodeServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s colocate-node %(levelname)s %(message)s")
    try:
        cfg = NodeConfig.from_file(args.config) if args.config else NodeConfig()
        cfg = cfg.with_overrides(policy=args.policy)
        gpus = node_gpus(args.device, args.sim_gpus, args.sim_gpu_mem)
        core = NodeCore(gpus, cfg, node_epoch=int(time.time() * 1000))
        server = NodeServer(core, args.endpoint, args.ctl, record_path=args.record)
    except ValueError as exc:
        print(f"colocate node: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # zmq bind errors, NVML failures
        print(f"colocate node: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.metrics_port is not None:
        from colocate.node.metrics import serve

        try:
            serve(server, args.metrics_port)
        except OSError as exc:
            print(f"colocate node: cannot serve metrics on port {args.metrics_port}: {exc.strerror}", file=sys.stderr)
            server.close()
            return 1
    if any(g.core is not None for g in gpus):  # sim: the daemon stays off the simulated GPUs' cores
        from colocate.device.sim import keep_off_cores

        keep_off_cores({g.core for g in gpus if g.core is not None})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: server.stop())
    for g in gpus:
        logging.info("GPU %d: %s %s, %d MiB%s", g.index, g.kind, g.name, g.mem_total >> 20,
                     f", core {g.core}" if g.core is not None else "")
    server.serve_forever()
    return 0
