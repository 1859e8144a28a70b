"""The node's ``--record`` file: the one definition of its format, for writer, readers and tests.

JSON lines, one object per event, appended by the node server as events happen::

    {"kind": KIND, "node_t": SECONDS, <the message's wire fields>, ...}

``node_t`` is the node's own clock (``time.monotonic()`` of the node process) when it received
or sent the message: every time in a record is on that one clock, so rows from different jobs
compare. Message fields keep their protocol names (``colocate.protocol``); a field such as
``t_end`` is the *job's* clock and is kept only for reference.

kinds:
  ``report``   a ``BatchReport`` received, plus ``gpu`` and ``priority`` of the job
  ``limits``   a ``SetLimits`` sent (``job_id``, ``limits``), plus the job's policy label ``slo_state``
  ``welcome``  a ``Welcome`` sent (a registration's first limits), plus ``slo_state``
  ``applied``  a ``LimitsApplied`` received

A line cut short by a crash is skipped by the reader; unknown kinds are skipped too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colocate import protocol as P

REPORT, LIMITS, APPLIED, WELCOME = "report", "limits", "applied", "welcome"
KINDS = (REPORT, LIMITS, APPLIED, WELCOME)


def row(kind: str, node_t: float, msg: P.Message, **extra) -> str:
    """One record line (no newline) for ``msg`` handled at node time ``node_t``."""
    from colocate import protocol as P  # the writer's only (the node has it loaded): readers need no codec

    assert kind in KINDS, kind
    return json.dumps({"kind": kind, "node_t": node_t, **P.to_wire(msg), **extra})


@dataclass(frozen=True)
class BatchRecord:
    """One ``report`` row: a mini-batch as the node received it."""

    job_id: str
    klass: str  # the job class ("priority" in the record), "?" in a row that has none
    gpu: int
    node_t: float  # node's clock at receipt
    duration_s: float
    busy_s: float
    mem_reserved: int
    host_bytes: int
    limits_seq: int


@dataclass
class Record:
    batches: list[BatchRecord] = field(default_factory=list)
    limits: list[dict] = field(default_factory=list)  # raw ``limits`` rows
    applied: list[dict] = field(default_factory=list)  # raw ``applied`` rows
    welcomes: list[dict] = field(default_factory=list)  # raw ``welcome`` rows


def read(path: str) -> Record:
    out = Record()
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            kind = r.get("kind") if isinstance(r, dict) else None
            if kind == REPORT:
                out.batches.append(BatchRecord(r["job_id"], r.get("priority", "?"), r.get("gpu", 0), r["node_t"],
                                         r["duration_s"], r["busy_s"], r["mem_reserved"], r["host_bytes"],
                                         r["limits_seq"]))
            elif kind == LIMITS:
                out.limits.append(r)
            elif kind == APPLIED:
                out.applied.append(r)
            elif kind == WELCOME:
                out.welcomes.append(r)
    return out
