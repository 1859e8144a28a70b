"""``colocate top``: a live, nvidia-smi/htop-like view of a node's GPUs and jobs, or of the cluster.

Node view (default): polls the node's operator endpoint (``CtlList``) every ``--interval`` seconds and
redraws: per GPU its index, kind, memory and a utilization bar; per job its priority, memory cap,
compute share, reserved and host bytes, throughput, SLO state and iterations.
Cluster view (``--scheduler``): polls the scheduler: per node its state, GPUs allocated and shared and
a utilization bar; the running and pending jobs with their nodes or why they wait.
When the daemon is away it says so and keeps retrying. ``--once`` prints one frame and exits (0 when it
answered, 1 when it did not). Ctrl-C exits 0.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from colocate.cli._common import ENDPOINT, add_node_options, seconds

if TYPE_CHECKING:
    from rich.console import RenderableType


def register(sub) -> None:
    p = sub.add_parser(
        "top", help="live view of a node's GPUs, jobs, caps, shares and throughput",
        description="An nvidia-smi/htop-like live view of a running node coordinator. Ctrl-C quits.",
    )
    add_node_options(p)
    p.add_argument("--scheduler", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="show the cluster as this scheduler sees it instead of one node")
    p.add_argument("--keys", default=None, metavar="DIR",
                   help="CURVE key folder for --scheduler (default: $COLOCATE_KEYS, else ~/.config/colocate/keys)")
    p.add_argument("--insecure", action="store_true", help="no CURVE, for a scheduler started with --insecure")
    p.add_argument("--interval", type=seconds(0.05, 3600), default=1.0, metavar="S",
                   help="refresh period in seconds (default 1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    p.set_defaults(func=main)


def render(endpoint: str, listing, error: str | None, now_wall: float, interval: float):
    """One frame: a header line, the GPU table and the job table (``listing`` may be None)."""
    from rich.console import Group
    from rich.text import Text

    from colocate.cli import _tables as T

    header = Text()
    header.append("colocate top", style="bold")
    header.append(f"  node {endpoint}")
    if listing is not None:
        header.append(f"  epoch {listing.node_epoch}")
    header.append(f"  {time.strftime('%H:%M:%S', time.localtime(now_wall))}")
    parts: list[RenderableType] = [header]
    if error is not None:
        parts.append(Text(f"node not reachable, retrying every {interval:g}s ({error})", style="bold red"))
    if listing is None:
        return Group(*parts)
    parts.append(T.gpu_table(listing, bars=True))
    parts.append(T.job_table(listing) if listing.jobs else Text("no jobs", style="dim"))
    return Group(*parts)


def _poll_cluster(client):
    from colocate.clients import rpc

    try:
        return (client.nodes(), client.jobs(active_only=True)[0]), None
    except rpc.BadEndpoint:
        raise
    except rpc.RpcError as exc:
        return None, str(exc)


def _poll(endpoint: str, timeout_s: float):
    from colocate.clients import node as C

    try:
        return C.list_jobs(endpoint, timeout_s), None
    except C.BadEndpoint:
        raise  # retrying cannot help
    except C.NoAnswer:
        return None, "no answer"
    except C.CtlClientError as exc:
        return None, str(exc)


def main(args) -> int:
    from colocate.cli import _tables as T
    from colocate.clients import rpc

    console = T.console()
    try:
        if args.scheduler:
            from colocate.clients.scheduler import SchedulerClient

            client = SchedulerClient(args.scheduler, "" if args.insecure else args.keys, min(args.timeout, max(0.5, args.interval)))
            poll = once = lambda: _poll_cluster(client)
            frame = lambda snap, error: T.render_cluster(client.endpoint, snap, error, time.time(), args.interval)
        else:
            from colocate.clients import node as C

            endpoint = C.resolve_ctl_endpoint(args.node, args.ctl)
            timeout = min(args.timeout, max(0.5, args.interval))  # a live frame waits at most an interval
            poll = lambda: _poll(endpoint, timeout)
            once = lambda: _poll(endpoint, args.timeout)
            frame = lambda listing, error: render(endpoint, listing, error, time.time(), args.interval)
        if args.once:
            data, error = once()
            console.print(frame(data, error))
            return 0 if error is None else 1
        return _live(console, poll, frame, args.interval)
    except rpc.BadEndpoint as exc:  # the node client's BadEndpoint too
        print(f"colocate top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _live(console, poll, frame, interval: float) -> int:
    """Redraw ``frame(data, error)`` every ``interval`` seconds from ``poll() -> (data, error)``,
    keeping the last data while the daemon does not answer, until Ctrl-C (KeyboardInterrupt,
    handled by the caller)."""
    from rich.live import Live

    last = None
    with Live(frame(None, None), console=console,
              refresh_per_second=max(1, min(10, int(2 / interval) + 1)), screen=False) as live:
        while True:
            t0 = time.monotonic()
            data, error = poll()
            if data is not None:
                last = data
            live.update(frame(last, error))
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))
