"""A node's lease file: how long the workers it placed may run without word from the scheduler, and which node
incarnations' workers it covers.

The node (``colocate.node.agent``) writes ``STATE_DIR/lease`` each time the scheduler echoes a heartbeat:
``{"until": T, "grace_s": G, "epoch": E, "epochs": [E, ...]}``, where ``T`` is on ``lease_clock()`` (Linux
``CLOCK_BOOTTIME``: system-wide, never set back, and counting a suspend, unlike ``CLOCK_MONOTONIC``), so a node
process and the launchers it started compare the same clock across their restarts. ``epoch`` is the writing node
incarnation's; ``epochs`` lists every incarnation whose workers the node holds (its own, and those it re-adopted
from a table that survived a restart). The launcher of a placed worker (``colocate run --lease-file PATH``, with
``COLOCATE_PLACEMENT=KEY@EPOCH`` from its node) checks it every ``LEASE_CHECK_S`` with ``LeaseWatch``; the lease
has lapsed for that worker when:

* ``now > until``; or
* its epoch is not in ``epochs`` (a node restarted on the same folder without it: a lost or corrupt table); or
* the file is missing or unreadable and ``now`` is past the last ``until`` this launcher read (a deleted state
  folder the node has not written again yet keeps what was already promised, nothing more; a launcher that never
  read the file has no promise at all).

Then the launcher SIGTERMs its worker's process group and SIGKILLs it ``grace_s`` later. A file without ``epochs``
(an older node) is not checked for epochs. Written atomically (write, rename): a reader never sees half a file.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from colocate.base.files import write_json_atomic


def lease_clock() -> float:
    """Seconds on the host's ``CLOCK_BOOTTIME`` (the clock of every lease file on this host)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Lease:
    until: float  # on lease_clock()
    grace_s: float
    epoch: int | None = None  # the writer's incarnation (None: an older node's file)
    epochs: frozenset | None = None  # the incarnations whose workers it covers (None: not checked)


def write_lease(path: str, until: float, grace_s: float, epoch: int | None = None, epochs=()) -> None:
    """Record the lease (raises OSError; the caller logs it: a lease it cannot renew lapses, which is safe).
    ``epochs``: the incarnations covered besides ``epoch`` itself."""
    data: dict = {"until": until, "grace_s": grace_s}
    if epoch is not None:
        data["epoch"] = int(epoch)
        data["epochs"] = sorted({int(epoch), *map(int, epochs)})
    # readable by every account: a root node's workers run as their owners and each reads its lease (no secret)
    write_json_atomic(path, data, mode=0o644)


def read_lease(path: str) -> Lease | None:
    """The lease, or None when the file is missing or unreadable (or holds a malformed lease)."""
    try:
        with open(path) as f:
            data = json.load(f)
        until, grace = float(data["until"]), float(data["grace_s"])
        if not (math.isfinite(until) and math.isfinite(grace) and grace >= 0):
            return None
        epoch = data.get("epoch")
        epochs = data.get("epochs")
        if epoch is not None and (type(epoch) is not int):
            return None
        if epochs is not None:
            if not isinstance(epochs, list) or any(type(e) is not int for e in epochs):
                return None
            epochs = frozenset(epochs)
        return Lease(until, grace, epoch, epochs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class LeaseWatch:
    """A launcher's view of its node's lease (see the module's docstring for when it has lapsed).
    ``epoch``: the incarnation that started this worker (None: not checked)."""

    def __init__(self, path: str, epoch: int | None = None):
        self.path, self.epoch = path, epoch
        self.known_until: float | None = None
        self.grace_s = 0.0

    def check(self, now: float) -> str | None:
        """None while the lease holds at ``now``; else why it lapsed (one line)."""
        lease = read_lease(self.path)
        if lease is None:
            if self.known_until is None:
                return f"the node's lease ({self.path}) is missing or unreadable"
            if now > self.known_until:
                return f"the node's lease ({self.path}) lapsed (the file is missing or unreadable)"
            return None
        self.grace_s = lease.grace_s
        if self.epoch is not None and lease.epochs is not None and self.epoch not in lease.epochs:
            return (f"the node's lease ({self.path}) is held by node incarnation {lease.epoch}, which does not hold "
                    f"this worker (started by incarnation {self.epoch}): the node restarted without it")
        self.known_until = lease.until
        if now > lease.until:
            return f"the node's lease ({self.path}) lapsed"
        return None


def placement_marker(key: str, epoch: int) -> str:
    """``COLOCATE_PLACEMENT``'s value for a worker of placement ``key`` (``CLUSTER/PLACEMENT``) started by node
    incarnation ``epoch``: ``KEY@EPOCH``."""
    return f"{key}@{int(epoch)}"


def parse_marker(value: str | None) -> tuple[str, int] | None:
    """(key, epoch) of a ``COLOCATE_PLACEMENT`` value, or None when it is not one."""
    if not value or "@" not in value:
        return None
    key, _, epoch = value.rpartition("@")
    if not key or not epoch.isdigit():
        return None
    return key, int(epoch)
