"""Assembling and running a node coordinator: the GPUs, the config, the core, the server.

``run(NodeOptions) -> exit code`` is what ``colocate node`` calls. It raises ``StartError``
(with the exit code: 2 for bad options or config, 1 for a start-up failure such as an endpoint
in use or a port taken) before serving; once serving, SIGTERM/SIGINT stop it cleanly (exit 0).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass


class StartError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodeOptions:
    endpoint: str
    ctl: str | None = None
    device: str = "auto"
    sim_gpus: int = 1
    sim_gpu_mem: int = 16 << 30
    policy: str | None = None
    config: str | None = None
    metrics_port: int | None = None
    record: str | None = None
    log_level: str = "info"


def run(opts: NodeOptions) -> int:
    from colocate.config import NodeConfig
    from colocate.gpus import node_gpus
    from colocate.gpus.sim import keep_off_cores
    from colocate.node.core import NodeCore
    from colocate.node.server import NodeServer

    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s colocate-node %(levelname)s %(message)s")
    try:
        cfg = NodeConfig.from_file(opts.config) if opts.config else NodeConfig()
        cfg = cfg.with_overrides(policy=opts.policy)
        gpus = node_gpus(opts.device, opts.sim_gpus, opts.sim_gpu_mem)
    except ValueError as exc:
        raise StartError(f"error: {exc}", 2) from None
    try:
        core = NodeCore(gpus, cfg, node_epoch=int(time.time() * 1000))
        server = NodeServer(core, opts.endpoint, opts.ctl, record_path=opts.record)
    except ValueError as exc:
        raise StartError(f"error: {exc}", 2) from None
    except Exception as exc:  # zmq bind errors, NVML failures
        raise StartError(f"cannot start: {type(exc).__name__}: {exc}", 1) from None
    if opts.metrics_port is not None:
        from colocate.node.metrics import serve

        try:
            serve(server, opts.metrics_port)
        except OSError as exc:
            server.close()
            raise StartError(f"cannot serve metrics on port {opts.metrics_port}: {exc.strerror}", 1) from None
    sim_cores = {g.core for g in gpus if g.core is not None}
    if sim_cores:  # the daemon stays off the simulated GPUs' cores
        keep_off_cores(sim_cores)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: server.stop())
    for g in gpus:
        logging.info("GPU %d: %s %s, %d MiB%s", g.index, g.kind, g.name, g.mem_total >> 20,
                     f", core {g.core}" if g.core is not None else "")
    server.serve_forever()
    return 0
