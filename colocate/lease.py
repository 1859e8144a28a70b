"""A node's lease file: how long the workers it placed may run without word from the scheduler.

The node (``colocate.node.agent``) writes ``STATE_DIR/lease`` each time the scheduler echoes a heartbeat:
``{"until": T, "grace_s": G}``, where ``T`` is on ``lease_clock()`` (Linux ``CLOCK_BOOTTIME``: system-wide,
never set back, and counting a suspend, unlike ``CLOCK_MONOTONIC``), so a node process and the launchers it
started compare the same clock across their restarts. The launcher of a placed worker
(``colocate run --lease-file PATH``) reads it every ``LEASE_CHECK_S``; when ``now > until`` (or the file is
gone or unreadable) the lease has lapsed: the launcher SIGTERMs its worker's process group and SIGKILLs it
``grace_s`` later. Written atomically (write, rename): a reader never sees half a file.
"""

from __future__ import annotations

import json
import time

from colocate.files import write_json_atomic


def lease_clock() -> float:
    """Seconds on the host's ``CLOCK_BOOTTIME`` (the clock of every lease file on this host)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def write_lease(path: str, until: float, grace_s: float) -> None:
    """Record the lease (raises OSError; the caller logs it: a lease it cannot renew lapses, which is safe)."""
    write_json_atomic(path, {"until": until, "grace_s": grace_s})


def read_lease(path: str) -> tuple[float, float] | None:
    """(until, grace_s), or None when the file is missing or unreadable (a lapsed lease)."""
    try:
        with open(path) as f:
            data = json.load(f)
        return float(data["until"]), float(data["grace_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lapsed(path: str, now: float) -> tuple[bool, float]:
    """(whether the lease in ``path`` has lapsed at ``now``, its stop grace in seconds)."""
    lease = read_lease(path)
    if lease is None:
        return True, 0.0
    until, grace = lease
    return now > until, grace
