"""The one way commands print tables: ``rich``, readable in a terminal, a pipe and a CI log.

In a terminal the console takes the terminal's width; elsewhere (a pipe, a file, a CI log) it is
wide enough for any table, so headers and cells are never cut ("guarant…"). Tables have no wrap
in their cells; a column's header may span two lines where the caller gives a newline. Every str
(cell, header, title) is shown as it is, never read as rich markup: a job named ``[/x]`` or a
``[exact 3]`` annotation prints literally; a caller that wants a style passes rich ``Text``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from colocate import protocol as P
from colocate.base.units import format_size
from colocate.base.vocab import JobClass, JobState, Phase

WIDE = 400  # columns of the console when output is not a terminal


def console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr)
    if not c.is_terminal:
        c = Console(stderr=stderr, width=WIDE)
    return c


def literal(value) -> Text:
    """``value`` as rich shows it: a ``Text`` as it is, anything else as its ``str``, never parsed as markup."""
    return value if isinstance(value, Text) else Text(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence], title: str | None = None,
          right: Iterable[str] = ()) -> Table:
    """A table of ``rows`` (cells are rich Text, or anything else shown as its str, literally); headers in
    ``right`` align right."""
    right = set(right)
    shown = None if title is None else Text(title, style="table.title")  # the style a str title gets
    t = Table(title=shown, title_justify="left", expand=False, box=box.SIMPLE_HEAD)
    for h in headers:
        t.add_column(literal(h), justify="right" if h in right else "left", no_wrap=True)
    for r in rows:
        t.add_row(*[literal(c) for c in r])
    return t


def print_table(headers, rows, title: str | None = None, right=(), out: Console | None = None) -> None:
    (out or console()).print(table(headers, rows, title, right))


# ---- a node's GPUs and jobs (ctl list, top) --------------------------------------------------

GPU_HEADERS = ("GPU", "KIND", "MODEL", "MEMORY", "UTILIZATION", "JOBS")
JOB_HEADERS = ("JOB", "GPU", "PRIORITY", "PID", "CAP", "SHARE", "RESERVED", "HOST", "IT/S", "SLO", "ITERS")
_RIGHT = {"GPU", "MEMORY", "JOBS", "PID", "CAP", "SHARE", "RESERVED", "HOST", "IT/S", "ITERS"}
SLO_STYLES = {"ok": "green", "violated": "bold red", "baseline": "yellow", "paused-mem": "red",
              "waiting": "yellow", "backoff": "yellow", "holding": "yellow", "growing": "green", "full": "cyan",
              "override": "magenta", "idle": "dim", Phase.RUNNING: "green", Phase.PAUSED: "red"}


def util_bar(ratio: float, width: int = 20) -> Text:
    ratio = min(1.0, max(0.0, ratio))
    full = int(round(ratio * width))
    style = "green" if ratio < 0.7 else ("yellow" if ratio < 0.9 else "red")
    bar = Text()
    bar.append("█" * full, style=style)
    bar.append("░" * (width - full), style="dim")
    bar.append(f" {ratio * 100:5.1f}%")
    return bar


def gpu_table(listing: P.CtlJobs, bars: bool = False) -> Table:
    rows = []
    for g in listing.gpus:
        n = sum(1 for j in listing.jobs if j.gpu == g.index)
        util = util_bar(g.utilization) if bars else f"{g.utilization * 100:.0f}%"
        rows.append((str(g.index), g.kind, g.model or "-", format_size(g.mem_total), util, str(n)))
    return table(GPU_HEADERS, rows, title="GPUs", right=_RIGHT)


def job_table(listing: P.CtlJobs) -> Table:
    rows = []
    for j in sorted(listing.jobs, key=lambda j: (j.gpu, j.priority != JobClass.GUARANTEED, j.job_id)):
        rows.append((j.job_id, str(j.gpu), Text(j.priority, style="bold" if j.priority == JobClass.GUARANTEED else ""),
                     str(j.pid), format_size(j.mem_cap), f"{j.sm_share:.2f}", format_size(j.mem_reserved),
                     Text(format_size(j.host_bytes), style="red" if j.host_bytes else ""), f"{j.throughput:.1f}",
                     Text(j.slo_state or "-", style=SLO_STYLES.get(j.slo_state, "")), str(j.iterations)))
    return table(JOB_HEADERS, rows, title="Jobs", right=_RIGHT)


# ---- the cluster as the scheduler sees it (top --scheduler, demo) ---------------------------------


_QUEUE_ORDER = {JobState.RUNNING: 0, JobState.PLACING: 1, JobState.PENDING: 2}


def in_queue_order(jobs) -> list:
    """Scheduler jobs as a queue shows them: running, placing, pending, then the rest; oldest first."""
    return sorted(jobs, key=lambda j: (_QUEUE_ORDER.get(j.state, 3), j.submitted_at))


def render_cluster(endpoint: str, snap, error: str | None, now_wall: float, interval: float):
    """One cluster frame: nodes (utilization bars) and active jobs (``snap`` = (NodesReply, jobs) or None)."""
    from rich.console import Group

    from colocate.base.units import format_duration

    header = Text()
    header.append("colocate top", style="bold")
    header.append(f"  scheduler {endpoint}  {time.strftime('%H:%M:%S', time.localtime(now_wall))}")
    parts: list[RenderableType] = [header]
    if error is not None:
        parts.append(Text(f"scheduler not reachable, retrying every {interval:g}s ({error})", style="bold red"))
    if snap is None:
        return Group(*parts)
    nodes, jobs = snap
    total = sum(n.gpus for n in nodes.nodes if n.up)
    alloc = sum(n.gpus_allocated for n in nodes.nodes if n.up)
    shared = sum(n.gpus_shared for n in nodes.nodes if n.up)
    parts.append(Text(f"{sum(1 for n in nodes.nodes if n.up)}/{len(nodes.nodes)} nodes up, {total} GPUs: "
                      f"{alloc} allocated, {shared} shared; {sum(1 for j in jobs if j.state == 'running')} running, "
                      f"{sum(1 for j in jobs if j.state == 'pending')} pending"))
    rows = [(n.node_id, Text("up", style="green") if n.up else Text("down", style="bold red"), str(n.gpus),
             str(n.gpus_allocated), str(n.gpus_shared), util_bar(n.utilization), str(n.workers)) for n in nodes.nodes]
    parts.append(table(("NODE", "STATE", "GPUS", "ALLOC", "SHARED", "UTILIZATION", "WORKERS"), rows, title="Nodes",
                         right=("GPUS", "ALLOC", "SHARED", "WORKERS")))
    job_rows = [(j.job_id, j.name, j.priority, j.state, f"{j.workers}x{j.gpus}",
                 format_duration(now_wall - (j.started_at or j.submitted_at)),
                 ",".join(j.nodes) if j.state != JobState.PENDING else j.reason)
                for j in in_queue_order(jobs)]
    parts.append(table(("JOB", "NAME", "CLASS", "STATE", "GPUS", "TIME", "NODES / WHY WAITING"), job_rows,
                         title="Jobs", right=("GPUS", "TIME")) if job_rows else Text("no jobs", style="dim"))
    return Group(*parts)


# ---- a job's predicted run time (queue, status) ----------------------------------------------------


def prediction_cell(pred, learning: bool = False) -> str:
    """A ``PredictionView`` in a table cell: ``p50..p90`` (``left`` for a running job) and ``[level n]``; a job
    that runs as requested for want of history to recommend from is marked ``learning``."""
    from colocate.base.units import format_duration

    mark = " learning" if learning else ""
    if pred is None:
        return "-" + mark
    left = " left" if pred.remaining else ""
    return f"{format_duration(pred.p50_s)}..{format_duration(pred.p90_s)}{left} [{pred.level} {pred.history}]{mark}"


def prediction_line(pred) -> str:
    """A ``PredictionView`` for ``colocate status JOB``: what it predicts and from what."""
    from colocate.base.units import format_duration

    what = "left" if pred.remaining else "run time"
    if pred.level == "progress":
        behind = f"from its progress ({pred.history} iterations done) and its recent time per iteration"
    elif pred.level == "default":
        behind = "the policy's default (no history)"
    else:
        behind = f"from {pred.history} ended run(s) at history level {pred.level}"
    return f"p50 {format_duration(pred.p50_s)}, p90 {format_duration(pred.p90_s)} {what}, {behind}"
