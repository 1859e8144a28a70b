"""``colocate top``: a live, nvidia-smi/htop-like view of a node's GPUs and jobs.

Polls the node's operator endpoint (``CtlList``) every ``--interval`` seconds and redraws: per GPU its
index, kind, memory and a utilization bar; per job its priority, memory cap, compute share, reserved and
host bytes, throughput, SLO state and iterations. When the node is away it says so and keeps retrying.
``--once`` prints one frame and exits (0 when the node answered, 1 when it did not). Ctrl-C exits 0.
"""

from __future__ import annotations

import sys
import time

from colocate.cmd_ctl import add_node_options
from colocate.cmd_run import _arg

BAR_WIDTH = 20
SLO_STYLES = {"ok": "green", "violated": "bold red", "baseline": "yellow", "paused-mem": "red",
              "waiting": "yellow", "backoff": "yellow", "holding": "yellow", "growing": "green", "full": "cyan", "override": "magenta",
              "idle": "dim"}


def _interval(text: str) -> float:
    value = float(text)
    if not (0.05 <= value <= 3600):
        raise ValueError(f"must be between 0.05 and 3600 seconds, got {text}")
    return value


def register(sub) -> None:
    p = sub.add_parser(
        "top", help="live view of a node's GPUs, jobs, caps, shares and throughput",
        description="An nvidia-smi/htop-like live view of a running node coordinator. Ctrl-C quits.",
    )
    add_node_options(p)
    p.add_argument("--interval", type=_arg(_interval, "seconds"), default=1.0, metavar="S",
                   help="refresh period in seconds (default 1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    p.set_defaults(func=run)


def util_bar(ratio: float, width: int = BAR_WIDTH):
    from rich.text import Text

    ratio = min(1.0, max(0.0, ratio))
    full = int(round(ratio * width))
    style = "green" if ratio < 0.7 else ("yellow" if ratio < 0.9 else "red")
    bar = Text()
    bar.append("█" * full, style=style)
    bar.append("░" * (width - full), style="dim")
    bar.append(f" {ratio * 100:5.1f}%")
    return bar


def render(endpoint: str, listing, error: str | None, now_wall: float, interval: float):
    """One frame: a header line, the GPU table and the job table (``listing`` may be None)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from colocate import ctl_client as C

    stamp = time.strftime("%H:%M:%S", time.localtime(now_wall))
    header = Text()
    header.append("colocate top", style="bold")
    header.append(f"  node {endpoint}")
    if listing is not None:
        header.append(f"  epoch {listing.node_epoch}")
    header.append(f"  {stamp}")
    parts = [header]
    if error is not None:
        parts.append(Text(f"node not reachable, retrying every {interval:g}s ({error})", style="bold red"))
    if listing is None:
        return Group(*parts)

    gt = Table(title="GPUs", title_justify="left", expand=False)
    for h in ("GPU", "KIND", "MEMORY", "UTILIZATION", "JOBS"):
        gt.add_column(h, justify="right" if h in ("GPU", "MEMORY", "JOBS") else "left", no_wrap=True)
    for g in listing.gpus:
        n = sum(1 for j in listing.jobs if j.gpu == g.index)
        gt.add_row(str(g.index), g.kind, C.fmt_size(g.mem_total), util_bar(g.utilization), str(n))
    parts.append(gt)

    if not listing.jobs:
        parts.append(Text("no jobs", style="dim"))
        return Group(*parts)
    jt = Table(title="Jobs", title_justify="left", expand=False)
    right = {"GPU", "PID", "CAP", "SHARE", "RESERVED", "HOST", "IT/S", "ITERS"}
    for h in C.JOB_HEADERS:
        jt.add_column(h, justify="right" if h in right else "left", no_wrap=True)
    for j in sorted(listing.jobs, key=lambda j: (j.gpu, j.priority != "guaranteed", j.job_id)):
        cols = list(C.job_columns(j))
        prio_style = "bold" if j.priority == "guaranteed" else ""
        cells = [Text(c) for c in cols]
        cells[2] = Text(cols[2], style=prio_style)
        cells[9] = Text(cols[9], style=SLO_STYLES.get(j.slo_state, ""))
        if j.host_bytes:
            cells[7] = Text(cols[7], style="red")
        jt.add_row(*cells)
    parts.append(jt)
    return Group(*parts)


def _poll(endpoint: str, timeout_s: float):
    from colocate import ctl_client as C

    try:
        return C.list_jobs(endpoint, timeout_s), None
    except C.BadEndpoint:
        raise  # retrying cannot help
    except C.NoAnswer:
        return None, "no answer"
    except C.CtlClientError as exc:
        return None, str(exc)


def run(args) -> int:
    from rich.console import Console

    from colocate import ctl_client as C

    try:
        endpoint = C.resolve_ctl_endpoint(args.node, args.ctl)
    except C.BadEndpoint as exc:
        print(f"colocate top: {exc}", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
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
