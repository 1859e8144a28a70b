"""``colocate top``: a live, nvidia-smi/htop-like view of a node's GPUs and jobs.

Polls the node's operator endpoint (``CtlList``) every ``--interval`` seconds and redraws: per GPU its
index, kind, memory and a utilization bar; per job its priority, memory cap, compute share, reserved and
host bytes, throughput, SLO state and iterations. When the node is away it says so and keeps retrying.
``--once`` prints one frame and exits (0 when the node answered, 1 when it did not). Ctrl-C exits 0.
"""

from __future__ import annotations

import sys
import time

from colocate.cli._common import add_node_options, seconds


def register(sub) -> None:
    p = sub.add_parser(
        "top", help="live view of a node's GPUs, jobs, caps, shares and throughput",
        description="An nvidia-smi/htop-like live view of a running node coordinator. Ctrl-C quits.",
    )
    add_node_options(p)
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
    parts = [header]
    if error is not None:
        parts.append(Text(f"node not reachable, retrying every {interval:g}s ({error})", style="bold red"))
    if listing is None:
        return Group(*parts)
    parts.append(T.gpu_table(listing, bars=True))
    parts.append(T.job_table(listing) if listing.jobs else Text("no jobs", style="dim"))
    return Group(*parts)


def _poll(endpoint: str, timeout_s: float):
    from colocate.node import client as C

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
    from colocate.node import client as C

    try:
        endpoint = C.resolve_ctl_endpoint(args.node, args.ctl)
    except C.BadEndpoint as exc:
        print(f"colocate top: {exc}", file=sys.stderr)
        return 2
    console = T.console()
    timeout = min(args.timeout, max(0.5, args.interval))
    try:
        if args.once:
            listing, error = _poll(endpoint, args.timeout)
            console.print(render(endpoint, listing, error, time.time(), args.interval))
            return 0 if error is None else 1
        return _live(console, endpoint, args.interval, timeout)
    except C.BadEndpoint as exc:
        print(f"colocate top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _live(console, endpoint: str, interval: float, timeout: float) -> int:
    """Redraw every ``interval`` seconds until Ctrl-C (KeyboardInterrupt, handled by the caller)."""
    from rich.live import Live

    last = None
    with Live(render(endpoint, None, None, time.time(), interval), console=console,
              refresh_per_second=max(1, min(10, int(2 / interval) + 1)), screen=False) as live:
        while True:
            t0 = time.monotonic()
            listing, error = _poll(endpoint, timeout)
            if listing is not None:
                last = listing
            live.update(render(endpoint, listing if listing is not None else last, error, time.time(), interval))
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))
