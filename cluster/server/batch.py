"""Group commit: the messages waiting on the scheduler's socket handled as one journal transaction.

``handle_batch(service, items, now) -> [(ident, msg), ...]``, ``items`` = ``[(ident, msg, peer), ...]``
(decoded, in arrival order). Every message is handled as ``SchedulerService.on_message`` would, inside
one ``Journal.batch()``; the jobs submitted in it enter the core as one ``handle_batch`` (one
scheduling cycle) at its end; then the batch commits with one fsync. The caller sends what this
returns only after it returned, so nothing is acknowledged (and no placement started) before its commit.

If the journal refuses a write of the batch or its commit, the whole batch is rolled back; the service
then is as after any refused write (``Faults._journal_failed``: the core rebuilt from the journal, work
refused until a probe finds it writable) and what the lost part of the batch had answered is taken
back: its submits and cancels get ``Error(unavailable)`` (nothing was done: a client retries with the
same request id), its node messages are kept to be replayed (``Faults._defer``), and the messages it
would have caused (placements, stops) are not sent. Hellos, heartbeats and reads keep their replies.
"""

from __future__ import annotations

import logging
from typing import Protocol

from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.server.faults import NodeWrite, Replies, _Refused
from cluster.server.journal import Journal, JournalUnavailable
from colocate import protocol as P

log = logging.getLogger("colocate.scheduler")

MAX_BATCH = 256  # messages per transaction: bounds a reply's wait and the work between two ticks

_WRITES = (P.Submit, P.Cancel)


class Service(Protocol):
    """What a batch uses of ``SchedulerService`` (its attributes and steps, documented there)."""

    core: SchedulerCore
    journal: Journal
    idents: dict[bytes, str]
    unavailable: str | None
    _submitted: list[ev.JobSubmitted] | None
    _submit_logs: list[tuple]

    def on_message(self, ident: bytes, msg: P.Message, now: float, peer: str | None = None) -> Replies: ...
    def _decide(self, events: list, now: float) -> Replies: ...
    def _journal_failed(self, exc: JournalUnavailable, now: float) -> None: ...
    def _unwritable(self, nothing: str) -> _Refused: ...
    def _defer(self, node_id: str, m: NodeWrite) -> None: ...
    def _error(self, ident: bytes, code: P.ErrorCode, message: str) -> tuple[bytes, P.Message]: ...
    def _take_outbox(self) -> Replies: ...


def handle_batch(service: Service, items: list[tuple[bytes, P.Message, str | None]], now: float) -> Replies:
    outs: list[Replies] = []
    lost = len(items)  # the items before this index were rolled back (if the batch failed)
    service._submitted = []
    service._submit_logs = []
    try:
        with service.journal.batch() as b:
            for ident, msg, peer in items:
                outs.append(service.on_message(ident, msg, now, peer=peer))
                if b.failed is not None and lost == len(items):
                    lost = len(outs) - 1
            events, service._submitted = service._submitted or [], None
            events = [e for e in events if service.core.job(e.spec.job_id) is None]  # a rebuild restored the rest
            tail: Replies = []
            if events and b.failed is None and service.unavailable is None:
                try:
                    tail = service._decide(events, now)
                except JournalUnavailable:
                    pass  # b.failed says so
                except _Refused:
                    pass  # logged by _failed; the jobs are journaled, a rebuilt core has them
    finally:
        service._submitted = None
    said, service._submit_logs = service._submit_logs, []
    if b.failed is None:
        for line in said:  # committed: the log never says a job was submitted that the journal does not hold
            log.info(*line)
        return [m for out in outs for m in out] + tail + service._take_outbox()
    if lost == len(items):  # the end of the batch failed (its cycle or its commit): nothing was handled yet
        service._journal_failed(b.failed, now)
    out: Replies = []
    for i, ((ident, msg, _peer), replies) in enumerate(zip(items, outs)):
        if i >= lost:
            out += replies
        elif isinstance(msg, _WRITES):
            out.append(service._error(ident, P.UNAVAILABLE, str(service._unwritable(
                f"nothing was {'submitted' if isinstance(msg, P.Submit) else 'cancelled'}"))))
        elif isinstance(msg, NodeWrite):
            if service.idents.get(ident) == msg.node_id:
                service._defer(msg.node_id, msg)
        else:
            out += replies
    return out + service._take_outbox()
