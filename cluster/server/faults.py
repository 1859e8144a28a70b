"""How the scheduler service survives its own faults: the core rebuilt from the journal.

``Faults`` is the part of ``SchedulerService`` (``cluster.server.service``, whose rules it keeps)
that handles what goes wrong inside the scheduler process, not on the wire:

  * ``_failed``: an exception in the policy core (or in handling a message) discards the core;
    ``_rebuild`` restores a fresh one from the journal and joins the connected nodes to it (their
    next reports re-adopt running workers), then its decisions are committed. Logged once per
    distinct failure (``faults`` counts them all). A rebuild that fails raises ``CoreBroken`` (exit non-zero);
  * ``_journal_failed``: a journal write failed; the core is rebuilt from what the journal holds,
    submits and cancels are refused (``_check_writable``), node messages are kept (``_defer``);
    ``_resume`` probes every ``PROBE_S`` and, once the journal takes writes, rebuilds with a cycle
    and replays the kept messages in order.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from cluster import events as ev
from cluster.core import SchedulerCore
from cluster.server.journal import Journal, JournalUnavailable
from cluster.server.learning import Learning
from cluster.server.ports import PortPool
from cluster.spec import NodeSpec
from colocate import protocol as P

log = logging.getLogger("colocate.scheduler")

PROBE_S = 1.0  # while the journal cannot be written: how often to try again (scheduler clock)
MAX_DEFERRED = 10000  # node messages kept while the journal cannot be written (the oldest go first)
MAX_FAILURES_LOGGED = 100  # distinct core failures logged (each once); the rest are only counted

Replies = list[tuple[bytes, P.Message]]  # what the service sends: (the connection's identity, the message)
NodeWrite = P.NodeStatus | P.WorkerStarted | P.WorkerExited | P.StartRefused  # node messages that change the core


class CoreBroken(Exception):
    """The policy core failed and cannot be rebuilt from the journal: exit non-zero."""


class _Refused(Exception):
    """Answer the sender with ``Error(code, message)``."""

    def __init__(self, code: P.ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class Faults:
    """Mixed into ``SchedulerService``: uses its core, journal, node tables, ports and ``_commit``/``_apply``.

    The attributes below are the service's (``SchedulerService.__init__`` sets each and says what it holds);
    declared here so the rules above are checked against their types."""

    core: SchedulerCore
    journal: Journal
    learning: Learning
    nodes: dict[str, bytes]
    epochs: dict[str, int]
    specs: dict[str, NodeSpec]
    ports: PortPool
    portless: dict[str, ev.StartWorkers]
    restop: dict[str, list[tuple[str, str, str]]]
    unavailable: str | None
    deferred: deque[tuple[str, NodeWrite]]
    lost_meanwhile: dict[str, tuple[str, float]]
    faults: Counter[str]
    _next_probe: float
    _outbox: Replies
    _failures_logged: set[tuple[str, str]]

    def _commit(self, decisions: list[ev.Decision], now: float) -> Replies:
        """Journal ``decisions``, then the messages they cause (``SchedulerService._commit``)."""
        raise NotImplementedError

    def _apply(self, node_id: str, m: NodeWrite, now: float) -> Replies:
        """Apply a node's message to the core (``SchedulerService._apply``)."""
        raise NotImplementedError

    def _check_writable(self, nothing: str) -> None:
        if self.unavailable is not None:
            raise self._unwritable(nothing)

    def _unwritable(self, nothing: str) -> _Refused:
        return _Refused(P.UNAVAILABLE, f"the scheduler cannot write its journal ({self.unavailable}): {nothing}; "
                        "try again later")

    def _defer(self, node_id: str, m: NodeWrite) -> None:
        if isinstance(m, P.NodeStatus):  # only a node's latest report matters
            for i, (n, old) in enumerate(self.deferred):
                if n == node_id and isinstance(old, P.NodeStatus):
                    del self.deferred[i]
                    break
        self.deferred.append((node_id, m))

    def _rebuild(self, now: float, schedule: bool = True, lost: dict[str, tuple[str, float]] | None = None) -> list:
        """Replace the core by one restored from the journal, joined by the connected nodes (their
        next reports re-adopt running workers) and by the ``lost`` ones (node id -> (why, the time from
        which its placements may be lost: its lease and stop grace, as ``NodeLost.hold_s``)), lost then.
        Returns its decisions (to commit); stops of the journal's stopping placements go to the
        outbox (connected nodes) or wait for the node's hello."""
        core = type(self.core)(self.core.config, self.core.rng)
        self.learning.teach(core)  # what ended jobs taught, before the jobs that wait are queued again
        decisions = core.restore(self.journal.records(), now)
        self.learning.restored(core, now)
        lost = {n: why for n, why in (lost or {}).items() if n not in self.nodes and n in self.specs}
        events: list = [ev.NodeJoined(self.specs[n], self.epochs[n]) for n in [*self.nodes, *lost] if n in self.specs]
        events += [ev.NodeLost(n, why, max(0.0, after - now)) for n, (why, after) in lost.items()]
        if events:
            decisions += core.handle_batch(events, now, schedule=schedule)
        self.core = core
        for pid, job_id, nodes, reason in self.journal.stopping():
            for n in nodes:
                if n in self.nodes:
                    self._outbox.append((self.nodes[n], P.StopPlacement(placement_id=pid, job_id=job_id, reason=reason)))
                elif (pid, job_id, reason) not in self.restop.get(n, []):
                    self.restop.setdefault(n, []).append((pid, job_id, reason))
        for pid in list(self.ports.held):
            if pid not in core.holders:
                self.ports.release(pid)
        self.portless = {pid: d for pid, d in self.portless.items() if pid in core.placing}
        return decisions

    def _failed(self, exc: Exception, what: str, now: float) -> None:
        """An exception while handling ``what``: rebuild the core from the journal (each distinct failure
        logged once, with its traceback); ``CoreBroken`` if that fails too."""
        self.faults["core"] += 1
        key = (type(exc).__name__, str(exc)[:200])
        if key not in self._failures_logged and len(self._failures_logged) < MAX_FAILURES_LOGGED:
            self._failures_logged.add(key)
            log.error("the policy core failed on %s (%s: %s): rebuilt from the journal", what, key[0], key[1],
                      exc_info=exc)
        try:
            decisions = self._rebuild(now, schedule=False)
        except Exception as broken:
            raise CoreBroken(f"the policy core cannot be rebuilt from {self.journal.path}: "
                             f"{type(broken).__name__}: {broken}") from broken
        if self.unavailable is None:
            try:
                self._outbox += self._commit(decisions, now)
            except JournalUnavailable as jexc:
                self._journal_failed(jexc, now)

    def _journal_failed(self, exc: JournalUnavailable, now: float) -> None:
        """A write failed: refuse work until a probe finds the journal writable; the core is rebuilt
        from what the journal holds (its decisions are made again on resuming)."""
        self.faults["journal"] += 1
        if self.unavailable is None:
            log.error("cannot write the journal %s (%s): refusing submits and cancels, keeping node reports, "
                      "until it can be written", self.journal.path, exc)
        self.unavailable = str(exc) or "write refused"
        self._next_probe = now + PROBE_S
        try:
            self._rebuild(now, schedule=False)
        except Exception as broken:
            raise CoreBroken(f"the policy core cannot be rebuilt from {self.journal.path}: "
                             f"{type(broken).__name__}: {broken}") from broken

    def _resume(self, now: float) -> Replies:
        """Probe the journal; once it takes writes, rebuild with a cycle and replay the kept node messages."""
        self._next_probe = now + PROBE_S
        if not self.journal.writable():
            return []
        log.warning("the journal %s can be written again: resuming (%d node messages to replay)",
                    self.journal.path, len(self.deferred))
        self.unavailable = None
        out: Replies = []
        try:
            out += self._commit(self._rebuild(now, lost=self.lost_meanwhile), now)
            self.lost_meanwhile = {}
            while self.deferred:
                node_id, m = self.deferred[0]
                if node_id in self.nodes and m.epoch >= self.epochs.get(node_id, 0):
                    try:
                        out += self._apply(node_id, m, now)
                    except _Refused:
                        pass
                self.deferred.popleft()
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
        return out
