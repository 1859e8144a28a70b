"""Assembling and running a node coordinator: the GPUs, the config, the core, the server.

``run(NodeOptions) -> exit code`` is what ``colocate node`` calls. It raises ``StartError``
(with the exit code: 2 for bad options or config, 1 for a start-up failure such as an endpoint
in use or a port taken) before serving; once serving, SIGTERM/SIGINT stop it cleanly (exit 0).

With ``scheduler`` set, the node also joins the global scheduler: a ``WorkerManager`` (its table in
``state_dir``, worker logs in ``log_dir``) and a ``SchedulerAgent`` in the server's loop. Stopping the
node leaves its workers running; a node started again on the same ``state_dir`` re-adopts them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from colocate.base.serving import StartError, configure_logging, serve_metrics, stop_on_signals
from colocate.base.vocab import DeviceKind


@dataclass(frozen=True)
class NodeOptions:
    endpoint: str
    ctl: str | None = None
    device: str = "auto"
    sim_gpus: int | list = 1  # a count, or (type, speed) per GPU (colocate.gpus.sim.parse_sim_gpus)
    sim_gpu_mem: int = 16 << 30
    policy: str | None = None
    config: str | None = None
    metrics_port: int | None = None
    record: str | None = None
    log_level: str = "info"
    scheduler: str | None = None  # the scheduler's endpoint; None: a standalone node
    node_id: str | None = None  # default: this machine's host name
    host: str | None = None  # where other nodes reach this one (MASTER_ADDR); default: the host name
    log_dir: str | None = None  # default: STATE_DIR/logs
    state_dir: str | None = None  # default: default_state_dir(node id)
    keys: str | None = None  # CURVE key folder for the scheduler link; None: the user's own (keys.resolve)
    insecure: bool = False  # no CURVE on the scheduler link (loopback only)
    topology: tuple = ()  # network labels for the scheduler, as colocate.protocol.parse_topology gives them


def default_state_dir(node_id: str) -> str:
    """``$XDG_STATE_HOME/colocate/node-ID`` (``~/.local/state/colocate/node-ID`` without it)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "colocate", f"node-{node_id}")


def run(opts: NodeOptions) -> int:
    from colocate.base.endpoints import private_dir, runtime_dir
    from colocate.gpus import node_gpus
    from colocate.gpus.sim import claim_cores, keep_off_cores
    from colocate.node.config import NodeConfig
    from colocate.node.core import NodeCore
    from colocate.node.server import NodeServer

    configure_logging("node", opts.log_level)
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

        serve_metrics(serve, server, opts.metrics_port)
    sim_cores = {g.core for g in gpus if g.core is not None}
    ledgers: list[str] = []
    if sim_cores:  # the daemon stays off the simulated GPUs' cores
        keep_off_cores(sim_cores)
        try:
            folder = runtime_dir()
            private_dir(folder)
            for line in claim_cores({g.index: g.core for g in gpus if g.core is not None}, folder):
                logging.warning("%s", line)
        except (OSError, ValueError) as exc:  # a check, not a condition to run
            logging.warning("cannot check whether another node uses these simulated GPUs' cores: %s", exc)
        ledgers = _make_ledgers(opts.endpoint, gpus)
    if opts.scheduler:
        try:
            server.agent = _agent(opts, core, server, gpus)
        except StartError:
            server.close()
            _remove_ledgers(ledgers)
            raise
    stop_on_signals(server.stop)
    for g in gpus:
        logging.info("GPU %d: %s %s, %d MiB%s", g.index, g.kind, g.name, g.mem_total >> 20,
                     f", core {g.core}" if g.core is not None else "")
    try:
        server.serve_forever()
    finally:
        _remove_ledgers(ledgers)
    return 0


def _remove_ledgers(paths: list[str]) -> None:
    """At the node's stop: its ledgers that no running job holds (one that outlives the node keeps its GPU's)."""
    from colocate.gpus.ledger import remove_if_unused

    for path in paths:
        remove_if_unused(path)


def _make_ledgers(endpoint: str, gpus) -> list[str]:
    """Each simulated GPU's memory ledger (``colocate.gpus.ledger``): its jobs' device bytes together stay within
    its memory. Without one a job is held to its own cap only, which is said here once per GPU. The paths made."""
    from colocate.gpus import ledger

    made = []
    for g in gpus:
        if g.core is None:
            continue
        path = ledger.ledger_path(endpoint, g.index)
        try:
            ledger.create(path, g.mem_total)
            made.append(path)
        except (OSError, ValueError) as exc:
            logging.warning("simulated GPU %d: no memory ledger (%s): each job on it is held to its own cap only, "
                            "not the GPU's total", g.index, exc)
    return made


def _agent(opts: NodeOptions, core, server, gpus):
    """The scheduler link and its worker manager (started: table recovered, hello sent); ``opts.scheduler`` is
    set."""
    from colocate.node.accounts import Accounts
    from colocate.node.agent import SchedulerAgent
    from colocate.node.gpustatus import NvmlSampler
    from colocate.node.worker_table import lease_path
    from colocate.node.workers import StateDirError, WorkerConfig, WorkerManager

    assert opts.scheduler is not None
    node_id = opts.node_id or socket.gethostname()
    state_dir = os.path.abspath(opts.state_dir or default_state_dir(node_id))
    log_dir = os.path.abspath(opts.log_dir or os.path.join(state_dir, "logs"))
    kind = gpus[0].kind if gpus else DeviceKind.SIM
    try:
        workers = WorkerManager(WorkerConfig(node_id=node_id, epoch=core.node_epoch, job_endpoint=opts.endpoint,
                                             device=kind, gpus={g.index: g.mem_total for g in gpus},
                                             log_dir=log_dir, state_dir=state_dir, cluster_id=None,
                                             lease_file=lease_path(state_dir)),
                                clock=server.clock, core=core, lock=server.lock)
        workers.jobs = server  # the limits a promotion changes go to the jobs' sockets
    except StateDirError as exc:
        raise StartError(str(exc), 1) from None
    gpu_status = server.gpu_status if kind == DeviceKind.SIM else NvmlSampler([g.index for g in gpus])
    try:
        from colocate.base import keys as K

        keys = K.resolve(opts.keys, opts.insecure)
        K.require_keys(opts.scheduler, keys)
        workers.accounts = Accounts(keys)  # jobs run as their owners' accounts (``colocate.node.accounts``)
        server.launchers = workers.launchers
        agent = SchedulerAgent(opts.scheduler, node_id, core.node_epoch, opts.host or socket.gethostname(), gpus,
                               workers, gpu_status, keys_dir=keys, log_dir=log_dir, topology=opts.topology)
        agent.start()
    except Exception as exc:  # bad keys (KeyError_ is a ValueError), a malformed endpoint (ZMQError)
        workers.close()
        raise StartError(f"error: scheduler link: {exc}", 2) from None
    logging.info("node %s joins the scheduler at %s (state %s, worker logs %s)", node_id, opts.scheduler, state_dir,
                 log_dir)
    return agent
