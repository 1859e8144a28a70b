"""The client requests of the scheduler service: submit, jobs (status, queue), recommend, nodes, cancel, logs.

``Requests`` is the part of ``SchedulerService`` (``cluster.server.service``, whose rules it keeps) that answers
clients: what each may do is ``cluster.server.identity``'s; a submit is journaled before it is acknowledged; a
submit that leaves a resource to its recommendation gets it (``cluster.server.advice``)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING

from cluster import events as ev
from cluster.predict.fingerprint import command_fingerprints
from cluster.server.advice import Sources, advise, auto_of, resolve, view
from cluster.server.faults import Replies, _Refused
from cluster.server.identity import Gate, Peer
from cluster.server.journal import Journal, JournalUnavailable
from cluster.server.learning import Learning
from cluster.server.logs import LogRelay
from cluster.server.views import Progress, QueueView, job_view, node_views, prediction_view
from cluster.spec import JobSpec, SpecError
from colocate import protocol as P
from colocate.base.vocab import TERMINAL

if TYPE_CHECKING:
    from cluster.core import SchedulerCore

log = logging.getLogger("colocate.scheduler")


class Requests:
    """Mixed into ``SchedulerService``: the attributes below are the service's (declared for the type checker)."""

    core: SchedulerCore
    journal: Journal
    gate: Gate
    peer: Peer
    learning: Learning
    progress: Progress
    log_relay: LogRelay
    speeds: dict[str, float]
    gpu_models: dict[str, dict[int, str]]
    hosts: dict[str, str]
    nodes: dict[str, bytes]
    epoch: int
    _submitted: list[ev.JobSubmitted] | None
    _submit_logs: list[tuple]

    if TYPE_CHECKING:  # the service's and its faults' (cluster.server.faults), which these requests use
        def _decide(self, events: list, now: float) -> Replies: ...
        def _error(self, ident: bytes, code: P.ErrorCode, message: str) -> tuple[bytes, P.Message]: ...
        def _check_writable(self, nothing: str) -> None: ...
        def _unwritable(self, nothing: str) -> _Refused: ...
        def _journal_failed(self, exc: JournalUnavailable, now: float) -> None: ...

    def _sources(self) -> Sources:
        return Sources(self.core, self.journal, self.learning.model(self.core), self.speeds)

    def _submit(self, ident: bytes, m: P.Submit, now: float) -> Replies:
        why = self.gate.client(self.peer, "submit jobs")
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        req, user = m.request, self.gate.user(self.peer, m.request.user)
        job_id = self.journal.peek_job_id()  # what new_job_id() gives below: one spec, no copy
        exact, family, _ = command_fingerprints(user, req.command, req.script_hash)
        auto = auto_of(req, self.core.config.scheduler.get("auto", ()))
        res = None
        if auto:  # the resources it leaves to its recommendation (cluster.server.advice)
            res = resolve(req, auto, advise(self._sources(), user, req.command, req.script_hash, req.workers,
                                            req.gpus, req.gpu_model, now))
        try:
            spec = JobSpec(job_id, submit_time=now, workers=req.workers, gpus=req.gpus,
                           gpu_mem=res.gpu_mem if res else req.gpu_mem, gpu_model=req.gpu_model.strip(),
                           klass=req.priority, queue=req.queue or "default",
                           user=user, name=req.name, estimate_s=req.estimate_s, fingerprint=exact, family=family,
                           mem_fallback=res.mem_fallback if res else None)
        except SpecError as exc:
            return [self._error(ident, P.INVALID, str(exc).replace(f"{job_id}: ", ""))]
        self._check_writable("nothing was submitted")
        why = self.core.validate(spec)  # duplicate id, unknown queue, a request no known node could take
        if why:
            return self._repeated(ident, spec.user, m.request_id) or [self._error(ident, P.INVALID, why)]
        wire = P.to_wire(m)["request"]
        wire["user"] = user  # the user is the key's, whatever the request said
        if res is not None:  # what it runs with; what it left to its recommendation is in jobs.advice
            wire.pop("auto", None)
            wire["gpu_mem"] = res.request_gpu_mem
            if res.sm_share is not None:
                wire["sm_share"] = res.sm_share
        try:
            new_id = self.journal.submit_job(spec, json.dumps(wire), now, m.request_id,
                                             json.dumps(res.advice) if res is not None else None)
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
            raise self._unwritable("nothing was submitted") from None
        if new_id is None:  # the request id is taken: a retry of a submit that was committed
            return self._repeated(ident, spec.user, m.request_id) or [self._error(ident, P.INVALID, "request id taken")]
        job_id = new_id
        if job_id != spec.job_id:
            spec = dataclasses.replace(spec, job_id=job_id)
        said = ("job %s submitted: %d x %d GPU(s), %s, queue %s%s", job_id, spec.workers, spec.gpus, spec.klass,
                self.core.fw.queue_of(spec), f"; {res.advice['text']}" if res is not None else "")
        ack: Replies = [(ident, P.Submitted(job_id=job_id))]
        if self._submitted is not None:  # in a batch: the core hears it with the batch's other submits
            self._submitted.append(ev.JobSubmitted(spec))
            self._submit_logs.append(said)  # said once the batch commits (handle_batch)
            return ack
        log.info(*said)  # committed: journal.submit_job's own transaction
        try:  # the job is journaled: acknowledged whatever happens to this cycle (a rebuilt core restores it)
            return ack + self._decide([ev.JobSubmitted(spec)], now)
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
        except _Refused:
            pass
        return ack

    def _repeated(self, ident: bytes, user: str, request_id: str) -> Replies | None:
        """The answer to a retry of ``user``'s committed submit of ``request_id``: the same job (None: not a retry).
        Looked up only where the submit cannot go on (the request id's unique index refused it, or it is no longer
        valid), so a new submit costs no read."""
        known = self.journal.job_of_request(user, request_id) if request_id else None
        if known is None:
            return None
        log.info("job %s: submit repeated (request %s)", known, request_id)
        return [(ident, P.Submitted(job_id=known))]

    def _jobs(self, ident: bytes, m: P.JobsRequest, now: float) -> Replies:
        if m.job_id is not None:
            row = self.journal.job(m.job_id)
            if row is None:
                return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
            rows, total = [row], 1
        else:
            rows, total = self.journal.jobs(m.active_only, m.offset, m.limit)
        queues = QueueView(self.core)
        one = m.job_id is not None  # features only for one job: a page of them could pass the message limit
        model = self.learning.model(self.core)
        views = tuple(job_view(r, self.core, queues, self.progress.of(r["job_id"], one),
                               prediction_view(self.core.job(r["job_id"]), model, now)) for r in rows)
        return [(ident, P.JobsReply(jobs=views, total=total, queued=tuple(queues.queued.items())))]

    def _recommend(self, ident: bytes, m: P.RecommendRequest, now: float) -> Replies:
        why = self.gate.client(self.peer, "ask for recommendations")
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        user, command, digest, workers, gpus, model = (self.gate.user(self.peer, m.user), m.command, m.script_hash,
                                                        m.workers, m.gpus, "")
        if m.job_id is not None:  # as it was submitted, by its user
            row = self.journal.job(m.job_id)
            if row is None:
                return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
            spec, request = json.loads(row["spec"]), json.loads(row["request"])
            why = self.gate.recommend_for(self.peer, m.job_id, spec.get("user", ""))
            if why:
                return [self._error(ident, P.FORBIDDEN, why)]
            user, command, digest = spec.get("user", ""), request["command"], request.get("script_hash", "")
            workers, gpus, model = spec["workers"], spec["gpus"], spec.get("gpu_model", "")
        advised = advise(self._sources(), user, command, digest, workers, gpus, model, now)
        return [(ident, P.RecommendReply(recommendation=view(advised)))]

    def _nodes(self, ident: bytes, m: P.NodesRequest, now: float) -> Replies:
        return [(ident, P.NodesReply(nodes=tuple(node_views(self.core, self.hosts, self.gpu_models)),
                                    scheduler_epoch=self.epoch))]

    def _cancel(self, ident: bytes, m: P.Cancel, now: float) -> Replies:
        job = self.core.job(m.job_id)
        if job is None:  # a job that ended before a restart is only in the journal
            row = self.journal.job(m.job_id)
            if row is None:
                return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
            why = self.gate.cancel(self.peer, m.job_id, row["submitter"])
            return [self._error(ident, P.FORBIDDEN, why) if why else
                    self._error(ident, P.INVALID, f"job {m.job_id} already {row['state']}")]
        why = self.gate.cancel(self.peer, m.job_id, job.spec.user)
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        if job.state in TERMINAL:
            return [self._error(ident, P.INVALID, f"job {m.job_id} already {job.state}")]
        self._check_writable("nothing was cancelled")
        try:
            out = self._decide([ev.JobCancelled(m.job_id)], now)
        except JournalUnavailable as exc:
            self._journal_failed(exc, now)
            raise self._unwritable("nothing was cancelled") from None
        return [(ident, P.Ok(message=f"job {m.job_id} cancelled"))] + out

    def _logs(self, ident: bytes, m: P.LogsRequest, now: float) -> Replies:
        why = self.gate.client(self.peer, "read logs")
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        row = self.journal.job(m.job_id)
        if row is None:
            return [self._error(ident, P.NOT_FOUND, f"no job {m.job_id}")]
        spec = json.loads(row["spec"])
        why = self.gate.read_logs(self.peer, m.job_id, spec.get("user", ""))
        if why:
            return [self._error(ident, P.FORBIDDEN, why)]
        workers = spec["workers"]
        if m.rank is not None and m.rank >= workers:
            return [self._error(ident, P.NOT_FOUND, f"job {m.job_id} has no worker {m.rank} (it has {workers}: "
                                                    f"ranks 0 to {workers - 1})")]
        held = [(r, n) for r, n, _ in self.journal.logs(m.job_id) if m.rank is None or r == m.rank]
        if not held:
            return [(ident, P.LogsReply(job_id=m.job_id, logs=()))]
        return self.log_relay.ask(ident, m.job_id, held, self.nodes, now)

