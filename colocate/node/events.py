"""What the node core hears: ``NodeCore.handle(event, now)`` takes these, and the protocol messages of jobs and
operators (``colocate.protocol``: ``Register``, ``BatchReport``, ``LimitsApplied``, ``Heartbeat``, ``Goodbye``,
``Error``, ``CtlSet``, ``CtlList``).

``now`` is always the node's monotonic clock (seconds). Events that set or compare a time the worker table
persists (kill deadlines, end times: they outlive the node process) carry the wall clock as ``wall`` (seconds since
the epoch); the edge reads both clocks, the core neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from colocate import protocol as P
from colocate.node.table import Worker


# ---------------------------------------------------------------- jobs (the node server's edge)
@dataclass(frozen=True)
class NodeTick:
    """Periodic: liveness checks and time-driven policy steps."""


@dataclass(frozen=True)
class JobLost:
    """Worker ``job_id``'s process is gone (``reason``: one line for the log)."""

    job_id: str
    reason: str


# ---------------------------------------------------------------- placements (the worker manager's edge)
@dataclass(frozen=True)
class Start:
    """The scheduler asks for placement ``msg`` on this node."""

    msg: P.StartPlacement


@dataclass(frozen=True)
class Launched:
    """The edge started every worker of ``msg`` (``workers``: their ``Worker`` records)."""

    msg: P.StartPlacement
    workers: tuple[Worker, ...]


@dataclass(frozen=True)
class LaunchFailed:
    """The edge started nothing: ``reason`` (cwd, command, port, the launcher itself)."""

    msg: P.StartPlacement
    reason: str


@dataclass(frozen=True)
class Stop:
    """Stop placement ``placement_id`` of cluster ``cluster_id``: SIGTERM now, SIGKILL ``grace_s`` later."""

    placement_id: str
    job_id: str = ""
    grace_s: float = 10.0
    cluster_id: str = ""
    wall: float = field(kw_only=True)


@dataclass(frozen=True)
class Promoted:
    """The scheduler promoted placement ``placement_id``: its job's workers on this node are guaranteed from now
    on (those registered and those that register later), where their GPU holds no other guaranteed worker."""

    placement_id: str
    cluster_id: str = ""


@dataclass(frozen=True)
class Settled:
    """The scheduler of ``cluster_id`` has journaled the end of these placements: the ones that have ended here
    retire at once (only their ids are remembered); one still running is kept."""

    placement_ids: tuple[str, ...]
    cluster_id: str = ""


@dataclass(frozen=True)
class Exited:
    """Worker ``rank`` of placement ``key`` (``scoped``) ended with ``code``."""

    key: str
    rank: int
    code: int
    wall: float = field(kw_only=True)


@dataclass(frozen=True)
class WallTick:
    """Time passed on the wall clock: kill deadlines, forgetting long-ended placements."""

    wall: float


@dataclass(frozen=True)
class Fence:
    """The node's lease has lapsed (True) or was renewed (False)."""

    lapsed: bool


@dataclass(frozen=True)
class Welcomed:
    """The scheduler of cluster ``cluster_id`` welcomed the node: other clusters' placements are stopped, SIGKILL
    ``grace_s`` after SIGTERM."""

    cluster_id: str
    grace_s: float = field(kw_only=True)
    wall: float = field(kw_only=True)


@dataclass(frozen=True)
class Recovered:
    """The table was loaded by a new node process: its promotions hold again."""


PLACEMENT_EVENTS = (Start, Launched, LaunchFailed, Stop, Promoted, Settled, Exited, WallTick, Fence, Welcomed, Recovered)
