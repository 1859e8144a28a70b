"""What the node core tells its edge to do: ``NodeCore.handle`` returns a list of ``Command``.

The edge carries each out and dispatches on the type exhaustively (``typing.assert_never``): the job side
(``colocate.node.server``) sends ``Send``/``Reply``, the placement side (``colocate.node.workers``) runs
``Launch``/``Signal``/``Save`` and sends ``Report`` to the scheduler; either logs ``Note``.
"""

from __future__ import annotations

from dataclasses import dataclass

from colocate import protocol as P


@dataclass(frozen=True)
class Send:
    """Send ``msg`` to the registered worker ``job_id``."""

    job_id: str
    msg: P.Message


@dataclass(frozen=True)
class Reply:
    """Answer the sender of the event with ``msg``."""

    msg: P.Message


@dataclass(frozen=True)
class Note:
    """A line for the node's log."""

    level: str  # info | warning
    text: str


@dataclass(frozen=True)
class Launch:
    """Start every worker of ``msg`` (placement ``key``); answer the core with ``Launched`` or ``LaunchFailed``."""

    msg: P.StartPlacement
    key: str


@dataclass(frozen=True)
class Signal:
    """Signal worker ``rank`` of placement ``key`` (its process group) with ``sig``."""

    key: str
    rank: int
    sig: int


@dataclass(frozen=True)
class Report:
    """Send ``msg`` to the scheduler."""

    msg: P.Message


@dataclass(frozen=True)
class Save:
    """Persist the worker table."""


Command = Send | Reply | Note | Launch | Signal | Report | Save
