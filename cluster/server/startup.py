"""Assembling and running the scheduler: config, journal, core (restored), service, server.

``run(SchedulerOptions) -> exit code`` is what ``colocate scheduler`` calls. It raises
``StartError`` (with the exit code: 2 for bad options, config or keys; 1 for a start-up failure
such as an endpoint in use, a state file another scheduler holds (its lock names the holder's
pid and host), or one that cannot be read or written) before serving, in one line; once serving,
SIGTERM/SIGINT stop it cleanly (exit 0), and a policy core that failed and cannot be rebuilt from
the journal, or a lock file removed or replaced under it (``cluster.server.journal``), stops it with exit 1.
A full disk or a read-only journal while serving does not stop
it (see ``cluster.server.service``). After kill -9, starting it again on the same state file
restores every job and re-adopts running workers from the nodes' reports.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from colocate.base.endpoints import NODE_HEARTBEAT_S, NODE_LEASE_S, NODE_LIVENESS
from colocate.base.serving import StartError, configure_logging, serve_metrics, stop_on_signals

if TYPE_CHECKING:
    from cluster.server.server import SchedulerServer


@dataclass(frozen=True)
class SchedulerOptions:
    bind: str
    state: str
    config: str = "antman"  # a preset name or a TOML file
    keys: str | None = None  # CURVE key folder; None: the user's own (colocate.base.keys.resolve)
    insecure: bool = False  # no CURVE (loopback only)
    metrics_port: int | None = None
    heartbeat_s: float = NODE_HEARTBEAT_S
    liveness: int = NODE_LIVENESS
    lease_s: float = NODE_LEASE_S  # nodes' lease (fencing); 0: none
    seed: int = 0
    log_level: str = "info"
    topology: str | None = None  # a topology CSV (node_id,switch[,rack]): overrides the nodes' own labels


def build(opts: SchedulerOptions, clock: Callable[[], float] = time.time) -> SchedulerServer:
    """The server, ready to serve (restored from the state file); raises StartError."""
    import zmq

    from cluster.config_file import resolve
    from cluster.core import SchedulerCore
    from cluster.server.journal import Journal, JournalError, JournalLockLost, JournalUnavailable
    from cluster.server.server import SchedulerServer
    from cluster.server.service import SchedulerService
    from cluster.traces.topology import read_topology
    from colocate.base import keys as K

    try:
        config = resolve(opts.config)
        topology = read_topology(opts.topology) if opts.topology else None
        keys = K.resolve(opts.keys, opts.insecure)
        K.require_keys(opts.bind, keys)
        if keys is not None:
            K.check_server(keys)
    except (ValueError, OSError) as exc:
        raise StartError(f"error: {exc}", 2) from None
    try:
        journal = Journal(opts.state)
    except JournalError as exc:
        raise StartError(f"cannot start: {exc}", 1) from None
    try:
        with journal.transaction():
            epoch = journal.next_epoch()
            journal.cluster_id()  # minted with a new file, in the same transaction
    except JournalLockLost as exc:
        journal.close()
        raise StartError(f"cannot start: {exc}", 1) from None
    except JournalUnavailable as exc:
        journal.close()
        raise StartError(f"cannot start: cannot write the state file {opts.state}: {exc}", 1) from None
    core = SchedulerCore(config, random.Random(opts.seed))
    service = SchedulerService(core, journal, epoch, heartbeat_s=opts.heartbeat_s, liveness=opts.liveness,
                               lease_s=opts.lease_s, topology=topology)
    try:
        service.restore(clock())
    except (ValueError, JournalError) as exc:
        journal.close()
        raise StartError(f"cannot restore {opts.state}: {exc}", 1) from None
    try:
        return SchedulerServer(service, opts.bind, keys, clock=clock)
    except zmq.ZMQError as exc:
        journal.close()
        raise StartError(f"cannot bind {opts.bind}: {exc}", 1) from None


GC_THRESHOLDS = (20_000, 20, 20)  # young collections every 20k allocations, not 700: fewer, and each still short


def settle_memory() -> None:
    """Collect once, then freeze what survived (the restored core: up to millions of long-lived objects) out of
    the collector's reach, so no later collection walks it (no pause growing with the journal); raise the
    young generation's threshold. The server freezes again after bulk submits (``SchedulerServer``)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(opts: SchedulerOptions) -> int:
    configure_logging("scheduler", opts.log_level)
    server = build(opts)
    settle_memory()
    if opts.metrics_port is not None:
        from cluster.server.metrics import serve

        serve_metrics(serve, server, opts.metrics_port)
    stop_on_signals(server.stop)
    try:
        server.serve_forever()
    finally:
        server.service.journal.close()
    return server.exit_code
