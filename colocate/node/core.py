"""The node coordinator's one pure core: ``NodeCore.handle(event, now) -> commands``, for jobs and placements.

Events are decoded protocol messages from jobs (``Register``, ``BatchReport``, ``LimitsApplied``, ``Heartbeat``,
``Goodbye``), operator messages (``CtlSet``, ``CtlList``), and ``colocate.node.events``: the job edge's ``NodeTick`` and
``JobLost``, the placement edge's ``Start``, ``Launched``, ``Stop``, ``Promoted``... (their rules:
``colocate.node.placements``, a base class of this one). The core's unit on the job side is one worker process on
one GPU: a torchrun worker registers as ``JOB/RANK`` and ``RegisteredWorker.job`` names its job. Commands
(``colocate.node.commands``) tell the edge what to do: ``Send(job_id, msg)`` to a job, ``Reply(msg)`` to the sender
of the event, ``Note`` for the log, and the placement commands. ``now`` is the node's monotonic clock in seconds; the
core reads no clock and does no I/O, so the simulator and tests drive it directly.

One truth per GPU: a guaranteed claim is a registered guaranteed worker's (started by a placement or by hand with
``colocate run --node``) or a running guaranteed placement's, and both kinds are checked by every admission: a
worker's registration, a placement's start, a promotion.

A promoted job's workers are guaranteed from then on, those registered and those that
register later (whatever priority they started with), where their GPU holds no other
guaranteed claim; a new placement of the job, or the end of its placement, forgets the promotion.

Invariants: the guaranteed claims on a GPU sum to at most 1 (``colocate.node.claims``): a guaranteed worker claims the whole GPU, so there is one per GPU, except fixed partitions
(``Register.partition``), each claiming its own share; partitions of one GPU also have caps summing to at most its
memory. A partition's limits are its request, never changed (not by the policy, not by ``CtlSet``); the policy sees
a GPU's partitions as one guaranteed job (``GuaranteedSide``) and opportunistic caps there never exceed what the
partitions' caps leave. An opportunistic ``Register.pick_gpu`` is placed by ``colocate.node.pick``. Limits sent to
a job carry a strictly increasing ``seq``; a job never gets more than it asked for at
registration (``Register.mem_request`` and ``sm_share`` are ceilings on what the
policy gives); an operator override (``CtlSet``) pins the job's cap and/or share
until the job leaves. Handlers are found through one explicit table (``_handlers``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from colocate import protocol as P
from colocate.base.units import format_size
from colocate.base.vocab import DeviceKind, JobClass, SloState
from colocate.gpus.spec import SIM_NAME, GpuSpec
from colocate.node import progress
from colocate.node.claims import WHOLE, Claim, conflict
from colocate.node.commands import Command, Note, Reply, Send
from colocate.node.config import NodeConfig
from colocate.node.events import JobLost, NodeTick
from colocate.node.pick import GpuRoom, pick_gpu
from colocate.node.placements import PlacementRules
from colocate.node.policies import POLICIES, Want
from colocate.node.state import GuaranteedSide, LocalGpu, RegisteredWorker, host_served

__all__ = ["NodeCore", "Send", "Reply", "Note", "NodeTick", "JobLost"]
WORKER = "\x00worker:"  # a registered worker's claim owner: never a placement key

PICK_WINDOW_S = 10.0  # a picked GPU is the least utilized over this window (AntMan's rule, as the scheduler's)


class NodeCore(PlacementRules):
    """Counters (only ever go up): ``jobs_exited`` (said goodbye), ``jobs_lost`` (process gone or
    silent), ``control_count``/``control_sum_s`` (limit sent -> in force, over all updates);
    ``control_latencies`` keeps the last ``LATENCY_WINDOW`` of them for quantiles."""

    LATENCY_WINDOW = 2000

    def __init__(self, gpus: list[GpuSpec], cfg: NodeConfig, node_epoch: int):
        """Raises ValueError (one line) for a GPU whose speed a ``Welcome`` cannot carry (``P.SIM_SPEED``), so a
        node refuses it at its start and never at a job's registration."""
        for g in gpus:
            P.SIM_SPEED.check(g.speed, f"GPU {g.index}{f' ({g.name})' if g.name else ''} speed")
        self.cfg = cfg
        self.node_epoch = node_epoch
        self.gpus = {g.index: LocalGpu(g) for g in gpus}
        self.jobs: dict[str, RegisteredWorker] = {}
        self.policy = POLICIES[cfg.policy]()
        self.control_latencies: deque[float] = deque(maxlen=self.LATENCY_WINDOW)
        self.control_count = 0
        self.control_sum_s = 0.0
        self.jobs_exited = 0
        self.jobs_lost = 0
        self.left: deque[tuple[str, str]] = deque(maxlen=1000)  # (job_id, reason), for logs
        # the last progress of workers that left since the last status: sent once, so the scheduler learns a job's
        # final iterations and peaks (what its history records) and not those of the status before its end
        self.final: dict[str, P.JobProgress] = {}
        self.promoted: set[str] = set()  # jobs (not worker ids) the scheduler promoted to guaranteed
        self._init_placements()
        self._handlers: dict[type, Callable[..., Any]] = {
            P.Register: self._on_register,
            P.BatchReport: self._on_batch_report,
            P.FeaturesReport: self._on_features,
            P.LimitsApplied: self._on_limits_applied,
            P.Heartbeat: self._on_heartbeat,
            P.Goodbye: self._on_goodbye,
            P.Error: self._on_error,
            P.CtlSet: self._on_ctl_set,
            P.CtlList: self._on_ctl_list,
            JobLost: self._on_job_lost,
            NodeTick: self._on_tick,
            **self._placement_handlers(),
        }

    # ------------------------------------------------------------------ events
    def handle(self, event: object, now: float) -> list[Command]:
        """Run ``event`` (a protocol message of a job or operator, or a ``colocate.node.events`` event) at ``now``
        (the node's monotonic clock, seconds); the commands for the edge. Not thread-safe: one caller at a time."""
        fn = self._handlers.get(type(event))
        if fn is None:
            return [Reply(P.Error(code=P.FORBIDDEN, message=f"{type(event).__name__} is not accepted here", job_id=None))]
        return fn(event, now)

    def _on_register(self, m: P.Register, now: float) -> list[Command]:
        old = self.jobs.get(m.job_id)
        if old is not None and old.token != m.token:
            return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id,
                                  message=f"job id {m.job_id} is registered with another token"))]
        if old is not None and old.pid != m.pid:
            return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id,
                                  message=f"job id {m.job_id} is in use by pid {old.pid}"))]
        index = m.gpu
        if m.pick_gpu:
            picked = old.gpu if old is not None else pick_gpu(self._rooms(now), m.mem_request)
            if picked is None:
                return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id, message=self._no_pick(m.mem_request, now)))]
            index = picked
        if index not in self.gpus:
            return [Reply(P.Error(code=P.INVALID, message=f"no GPU {index} on this node (have {sorted(self.gpus)})",
                                  job_id=m.job_id))]
        gpu = self.gpus[index]
        claim = m.sm_request if m.partition else WHOLE
        holder = self._guaranteed_holder(gpu, m.job_id, m.job, claim)
        klass = JobClass.GUARANTEED if m.job in self.promoted and holder is None else m.priority
        if klass == JobClass.GUARANTEED and holder is not None:
            return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id, message=self._no_room(gpu, m, holder)))]
        if m.partition and klass == JobClass.GUARANTEED:
            held = sum(int(self.jobs[j].mem_request or 0) for j in gpu.jobs
                       if j != m.job_id and self.jobs[j].partition)
            if held + int(m.mem_request or 0) > gpu.spec.mem_total:
                return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id, message=(
                    f"GPU {index}: a partition capped at {m.mem_request} bytes does not fit: its partitions "
                    f"hold {held} of {gpu.spec.mem_total} bytes")))]
        if old is not None and old.gpu != index:
            self._drop(old.job_id)
            old = None
        if old is None:
            job = RegisteredWorker(job_id=m.job_id, gpu=index, klass=klass, pid=m.pid, mem_request=m.mem_request,
                           sm_request=m.sm_request, registered_at=now, last_seen=now, token=m.token,
                           limits=P.Limits(seq=0, mem_cap=m.mem_cap, sm_share=m.sm_share, gate=False),
                           job=m.job, rank=m.rank, partition=m.partition and klass == JobClass.GUARANTEED,
                           priority_yield=m.priority_yield)
            job.start_mem, job.start_share = self.start_point(m.job)
            self.jobs[m.job_id] = job
            gpu.jobs.append(m.job_id)
        else:  # the same job registering again (its link reconnected)
            job = old
            job.last_seen = now
        wants = self._want(gpu, now)  # one plan for the whole GPU, the new job included
        out = self._send_changes(wants, now, exclude=job.job_id)
        job.limits = self._limits_for(job, wants.get(job.job_id), bump=True)
        # not timed: a job acknowledges the limits of its Welcome at its first device work, after its start-up
        # (model, data), which is no control latency (it made the metric's p50 5 s)
        welcome = P.Welcome(job_id=job.job_id, node_epoch=self.node_epoch, limits=job.limits,
                            heartbeat_s=self.cfg.heartbeat_s, liveness=self.cfg.liveness, gpu=job.gpu,
                            mem_total=gpu.spec.mem_total, sim_core=gpu.spec.core, sim_speed=gpu.spec.speed,
                            sim_type=_sim_type(gpu.spec))
        return [Send(job.job_id, welcome)] + out

    def _on_batch_report(self, m: P.BatchReport, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:
            return [Reply(_unknown(m.job_id))]
        job.last_seen = now
        job.last_report_at = now
        job.iterations += 1
        job.recent.append(m)
        progress.note(job, m)
        job.applied_seq = max(job.applied_seq, m.limits_seq)
        gpu = self.gpus[job.gpu]
        gpu.busy.append((now, m.busy_s))  # the node's receive time: the job's clock is not comparable
        return self._replan(gpu, now)

    def _on_features(self, m: P.FeaturesReport, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:
            return [Reply(_unknown(m.job_id))]
        job.last_seen = now
        if m.features != job.features:
            job.features = m.features
            job.features_seq += 1
        return []

    def progress(self, now: float, told: dict[str, int], max_features: int = 8) -> list[P.JobProgress]:
        """Every registered worker's progress (``colocate.node.progress``) at ``now``. Features go with the
        workers whose ``features_seq`` differs from ``told[worker id]``, at most ``max_features`` of them;
        ``told`` is updated for those (the caller's record of what the scheduler was sent), and forgets workers
        that left. The workers that left since the last call come first, with their last progress, once."""
        for gone in [w for w in told if w not in self.jobs]:
            del told[gone]
        out = list(self.final.values())
        self.final.clear()
        for w in self.jobs.values():
            send = w.features is not None and told.get(w.job_id) != w.features_seq and max_features > 0
            if send:
                told[w.job_id] = w.features_seq
                max_features -= 1
            out.append(progress.summarise(w, now, with_features=send))
        return out

    def _on_limits_applied(self, m: P.LimitsApplied, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:
            return [Reply(_unknown(m.job_id))]
        job.last_seen = now
        job.applied_seq = max(job.applied_seq, m.limits_seq)
        sent = job.sent_at.pop(m.limits_seq, None)
        for seq in [s for s in job.sent_at if s < m.limits_seq]:
            job.sent_at.pop(seq)
        if sent is not None:  # both times on the node's clock: sent, and this acknowledgement's receipt
            latency = max(0.0, now - sent)
            self.control_latencies.append(latency)
            self.control_count += 1
            self.control_sum_s += latency
        return self._replan(self.gpus[job.gpu], now)

    def _on_heartbeat(self, m: P.Heartbeat, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:
            return [Reply(_unknown(m.job_id))]
        job.last_seen = now
        return [Reply(P.Heartbeat(job_id=m.job_id, sent_at=now))]

    def _on_goodbye(self, m: P.Goodbye, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:
            return []
        if m.reason == P.GOODBYE_OOM:  # its placed worker's exit is reported as out of memory
            self.note_oom(job.job, job.rank or 0)
        self.jobs_exited += 1
        return self._leave(m.job_id, f"exited ({m.reason})", now)

    def _on_job_lost(self, m: JobLost, now: float) -> list[Command]:
        if m.job_id not in self.jobs:
            return []
        self.jobs_lost += 1
        return self._leave(m.job_id, m.reason, now)

    def _on_error(self, m: P.Error, now: float) -> list[Command]:
        return []  # a job reporting trouble; the edge logs it

    def _on_tick(self, m: NodeTick, now: float) -> list[Command]:
        out: list[Command] = []
        limit = self.cfg.heartbeat_s * self.cfg.liveness
        for job in [j for j in self.jobs.values() if now - j.last_seen > limit]:
            self.jobs_lost += 1
            out += self._leave(job.job_id, f"silent for {now - job.last_seen:.1f}s", now)
        for w in [j for j in self.jobs.values() if j.job in self.promoted and not j.guaranteed]:
            out += self._claim_promoted(w, now, retry=True)
        for gpu in self.gpus.values():
            out += self._replan(gpu, now)
        return out

    def _guarantee(self, job: str, on: bool, now: float) -> list[Command]:
        """Job ``job``'s workers count as guaranteed from now on, those registered and those that register later,
        where their GPU holds no other guaranteed claim (``on=False``: forget that; a new placement)."""
        if not on:
            self.promoted.discard(job)
            return []
        self.promoted.add(job)
        out: list[Command] = []
        for w in [j for j in self.jobs.values() if j.job == job and not j.guaranteed]:
            out += self._claim_promoted(w, now, retry=False)
        return out

    def _claim_promoted(self, w: RegisteredWorker, now: float, retry: bool) -> list[Command]:
        """Worker ``w`` of a promoted job becomes guaranteed if its GPU holds no other guaranteed claim now. Else it
        stays opportunistic, said once (not on a ``retry``); each tick retries until the other claim is gone."""
        gpu = self.gpus[w.gpu]
        holder = self._guaranteed_holder(gpu, w.job_id, w.job)
        if holder is not None:
            return [] if retry else [Note("warning", f"{w.job_id} stays opportunistic until guaranteed job {holder} "
                                                     f"leaves GPU {w.gpu}")]
        w.klass = JobClass.GUARANTEED
        said = [Note("info", f"{w.job_id} of promoted job {w.job} is guaranteed now")] if retry else []
        return said + self._replan(gpu, now)

    def _on_ctl_set(self, m: P.CtlSet, now: float) -> list[Command]:
        job = self.jobs.get(m.job_id)
        if job is None:  # a scheduler's job id (``colocate status``): its one worker here, JOB/RANK
            workers = sorted(k for k in self.jobs if k.startswith(f"{m.job_id}/"))
            if len(workers) != 1:
                return [Reply(_unknown(m.job_id) if not workers else P.Error(
                    code=P.UNKNOWN_JOB, job_id=m.job_id, message=f"job {m.job_id} has {len(workers)} workers on "
                    f"this node ({', '.join(workers[:8])}{', ...' if len(workers) > 8 else ''}): name one"))]
            job = self.jobs[workers[0]]
        if job.partition:
            return [Reply(P.Error(code=P.REJECTED, job_id=m.job_id, message=(
                f"{job.job_id} is a fixed partition of GPU {job.gpu}: its limits are what its engine granted")))]
        if m.clear:
            job.override_cap = job.override_share = None
            out = self._replan(self.gpus[job.gpu], now)
            return out + [Reply(P.CtlOk(message=f"{job.job_id}: overrides cleared; its node's policy decides its limits "
                                                f"again (now cap {format_size(job.limits.mem_cap)}, share "
                                                f"{job.limits.sm_share:g}, seq {job.limits.seq})"))]
        total = self.gpus[job.gpu].spec.mem_total
        if m.mem_cap is not None and total and m.mem_cap > total:
            return [Reply(P.Error(code=P.INVALID, job_id=m.job_id, message=(
                f"a cap of {format_size(m.mem_cap)} is over GPU {job.gpu}'s {format_size(total)}: nothing was set")))]
        if m.mem_cap is not None:
            job.override_cap = m.mem_cap
        if m.sm_share is not None:
            job.override_share = m.sm_share
        out = self._replan(self.gpus[job.gpu], now)
        return out + [Reply(P.CtlOk(message=f"{job.job_id}: cap {format_size(job.limits.mem_cap)}, share "
                                            f"{job.limits.sm_share:g} (seq {job.limits.seq})"))]

    def _on_ctl_list(self, m: P.CtlList, now: float) -> list[Command]:
        return [Reply(self.snapshot(now))]

    # ----------------------------------------------------------------- helpers
    def snapshot(self, now: float) -> P.CtlJobs:
        gpus = [P.GpuInfo(index=g.spec.index, mem_total=g.spec.mem_total, utilization=g.utilization(now),
                          kind=g.spec.kind, model=g.spec.name[:128]) for g in self.gpus.values()]
        jobs = []
        for j in self.jobs.values():
            last = j.last
            jobs.append(P.JobInfo(
                job_id=j.job_id, gpu=j.gpu, priority=j.klass, pid=j.pid, mem_cap=j.limits.mem_cap,
                sm_share=j.limits.sm_share, mem_reserved=last.mem_reserved if last else 0,
                mem_allocated_peak=last.mem_allocated_peak if last else 0, host_bytes=host_served(last),
                throughput=j.throughput(now=now), slo_state=j.slo_state, iterations=j.iterations_done))
        return P.CtlJobs(node_epoch=self.node_epoch, gpus=tuple(gpus), jobs=tuple(jobs))

    def _guaranteed_holder(self, gpu: LocalGpu, job_id: str, job: str, share: float = WHOLE) -> str | None:
        """The job on ``gpu`` (a registered worker's id, or a placement's job) that keeps worker ``job_id`` of job
        ``job`` from claiming ``share`` of it as guaranteed, else None. The rule is ``colocate.node.claims``, over
        the claims of registered workers and placements alike (the placements of ``job`` itself left out)."""
        index = gpu.spec.index
        claims = chain(self.placement_claims(except_job=job),
                       (c for c in self.worker_claims() if c.gpu == index))
        held = conflict(claims, (index,), WORKER + job_id, share)
        if held is None:
            return None
        if held.owner.startswith(WORKER):
            return held.owner[len(WORKER):]
        return self.table.placements[held.owner].job_id

    def worker_claims(self, except_job: str | None = None) -> Iterator[Claim]:
        """The claim of every registered guaranteed worker (but those of job ``except_job``) on its GPU."""
        for w in self.jobs.values():
            if w.guaranteed and w.job != except_job:
                yield Claim(w.gpu, WORKER + w.job_id, w.claim)

    def _resume_to_stop(self, job: str, now: float) -> list[Command]:
        gpus = set()
        for w in self.jobs.values():
            if w.job == job and not w.stopping:
                w.stopping = True
                gpus.add(w.gpu)
        return [c for g in sorted(gpus) for c in self._replan(self.gpus[g], now)]

    def reclaimable(self, now: float) -> tuple[float, list[tuple[str, str]]]:
        after = self.cfg.reclaim_after_s
        return self.cfg.reclaim_grace_s, [(w.job, w.job_id) for w in self.jobs.values()
                                          if w.reclaim_since is not None and now - w.reclaim_since >= after]

    def _gpu_indices(self) -> set[int]:
        return set(self.gpus)

    def _worker_holder(self, owner: str) -> str:
        w = self.jobs[owner[len(WORKER):]]
        return f"{w.job} (worker {w.job_id}, pid {w.pid}, registered with this node)"

    def _no_room(self, gpu: LocalGpu, m: P.Register, holder: str) -> str:
        """The one line refusing guaranteed worker ``m`` on ``gpu``, which ``holder`` (and maybe others) hold."""
        parts = [self.jobs[j] for j in gpu.jobs if j != m.job_id and self.jobs[j].partition]
        if not m.partition or not parts:
            return f"GPU {gpu.spec.index} already runs guaranteed job {holder}"
        held = sum(p.sm_request for p in parts)
        return (f"GPU {gpu.spec.index}: a partition of share {m.sm_request:g} does not fit: its partitions "
                f"({', '.join(sorted(p.job_id for p in parts))[:200]}) hold {held:g} of its compute")

    def _rooms(self, now: float) -> list[GpuRoom]:
        """Each GPU's utilization over the last 10 s and the memory its jobs leave (``RegisteredWorker.mem_held``),
        for ``pick_gpu``."""
        rooms = []
        for g in self.gpus.values():
            used = sum(self.jobs[j].mem_held for j in g.jobs)
            rooms.append(GpuRoom(g.spec.index, g.utilization(now, PICK_WINDOW_S), max(0, g.spec.mem_total - used)))
        return rooms

    def _no_pick(self, mem_request: int | None, now: float) -> str:
        rooms = ", ".join(f"GPU {r.index}: {r.utilization:.0%} busy, {r.mem_free >> 20} MiB free"
                          for r in self._rooms(now))
        need = f"{mem_request >> 20} MiB" if mem_request else "any memory"
        return f"no GPU on this node is under 80% busy with {need} free ({rooms})"[:1000]

    def _want(self, gpu: LocalGpu, now: float) -> dict[str, Want]:
        """The policy's plan for ``gpu``: its partitions appear to it as one guaranteed job (``GuaranteedSide``)
        and keep their own limits; opportunistic caps stay within what the partitions' caps leave."""
        jobs = [self.jobs[j] for j in gpu.jobs]
        parts = [j for j in jobs if j.partition]
        if not parts:
            return self.policy.plan(gpu, jobs, self.cfg, now)
        side = GuaranteedSide(parts)
        wants = self.policy.plan(gpu, [side] + [j for j in jobs if not j.partition], self.cfg, now)
        wants.pop(side.job_id, None)
        left = max(0, gpu.spec.mem_total - side.mem_request)
        for job_id, want in list(wants.items()):
            if want.mem_cap > left:
                wants[job_id] = dataclasses.replace(want, mem_cap=left)
        for p in parts:
            wants[p.job_id] = Want(int(p.mem_request or 0), p.sm_request, False, SloState.PARTITION)
        return wants

    def _limits_for(self, job: RegisteredWorker, want: Want | None, bump: bool = False) -> P.Limits:
        """The policy's wish, within the job's own request (``--gpu-mem``/``--sm-share`` are ceilings),
        then the operator's override; ``seq`` goes up when anything changed (or ``bump``)."""
        cur = job.limits
        cap = cur.mem_cap if want is None else want.mem_cap
        share = cur.sm_share if want is None else want.sm_share
        gate = cur.gate if want is None else want.gate
        if want is not None and want.slo_state is not None:
            job.slo_state = want.slo_state
        if job.mem_request is not None:
            cap = min(cap, job.mem_request)
        share = min(share, job.sm_request)
        if job.override_cap is not None:
            cap = job.override_cap
        if job.override_share is not None:
            share = job.override_share
            job.slo_state = SloState.OVERRIDE
        if job.stopping:  # its placement is being stopped: a paused job could not act on the stop signal
            share = max(share, job.sm_request)
        new = P.Limits(seq=cur.seq, mem_cap=int(cap), sm_share=round(float(share), 4), gate=bool(gate))
        if bump or new != cur:
            new = P.Limits(seq=cur.seq + 1, mem_cap=new.mem_cap, sm_share=new.sm_share, gate=new.gate)
        return new

    def _replan(self, gpu: LocalGpu, now: float) -> list[Command]:
        return self._send_changes(self._want(gpu, now), now)

    def _send_changes(self, wants: dict[str, Want], now: float, exclude: str | None = None) -> list[Command]:
        out: list[Command] = []
        for job_id, want in wants.items():
            if job_id == exclude:
                continue
            job = self.jobs[job_id]
            if not want.reclaim:
                job.reclaim_since = None
            elif job.reclaim_since is None:
                job.reclaim_since = now
            new = self._limits_for(job, want)
            if new.seq != job.limits.seq:
                job.limits = new
                job.sent_at[new.seq] = now
                out.append(Send(job_id, P.SetLimits(job_id=job_id, limits=new)))
        return out

    def _drop(self, job_id: str) -> RegisteredWorker:
        job = self.jobs.pop(job_id)
        self.gpus[job.gpu].jobs.remove(job_id)
        return job

    def _leave(self, job_id: str, reason: str, now: float) -> list[Command]:
        job = self._drop(job_id)
        if job.iterations_done or job.mem_reserved_peak:  # what it did, for the next status (``progress``)
            self.final[job_id] = progress.summarise(job, now)
        self.left.append((job_id, reason))
        return self._replan(self.gpus[job.gpu], now)


def _unknown(job_id: str) -> P.Error:
    return P.Error(code=P.UNKNOWN_JOB, message=f"job {job_id} is not registered with this node", job_id=job_id)


def _sim_type(spec: GpuSpec) -> str:
    """The type a simulated GPU was declared with (``--sim-gpus 1:K80``), "" for an untyped or a CUDA one."""
    return spec.name if spec.kind == DeviceKind.SIM and spec.name != SIM_NAME else ""
