"""Messages of the job <-> node link and of the node's operator endpoint (``colocate ctl``/``top``).

Who sends what:
  job -> node   Register, BatchReport (once per mini-batch), LimitsApplied, Heartbeat, Goodbye, Error
  node -> job   Welcome (the reply to Register), SetLimits, Error
  ctl -> node   CtlList, CtlSet                      node -> ctl   CtlJobs, CtlOk, Error

``t_end``/``applied_at``/``sent_at`` are read from the *sender's* ``time.monotonic()`` and are only
comparable with each other (a node uses its own receive time).

Partitions and picks: a guaranteed ``Register`` with ``partition`` holds a fixed partition of its GPU (its
``mem_request`` and ``sm_request``, which the node never changes); the node admits it only while the partitions
of that GPU fit (shares summing to at most 1, memory requests to at most the GPU's memory) and no whole-GPU
guaranteed worker is there, else answers ``Error(REJECTED)`` with one line. An opportunistic ``Register`` with
``pick_gpu`` leaves the GPU to the node (``gpu`` is ignored); ``Welcome.gpu`` names the GPU it was registered
on, or ``Error(REJECTED)`` says that none fits.

Workers: a job may be several processes (torchrun's workers), each on its own GPU. Each registers on its own,
as ``job_id = "JOB/RANK"`` with ``Register.rank``/``world_size`` when torchrun's ``RANK`` is set, else as
``job_id = "JOB"`` with ``rank=None``; the node treats each worker as one of its jobs (one GPU, its own
limits) and knows the job of each (``Register.job``). Every later message of a worker names it by that id.

Ordering and idempotence:
  * ``Register.epoch`` counts the job runtime's incarnations; after a coordinator restart the job registers
    again with the same ``job_id``. ``Welcome.node_epoch`` counts coordinator incarnations; a job drops
    node messages whose epoch is older than the one it was welcomed with (stale messages are fenced off).
  * ``Limits.seq`` increases monotonically per job. A job applies a ``SetLimits`` only if its seq is greater
    than the seq it already has (duplicates and reordered messages are harmless), then answers
    ``LimitsApplied``; every ``BatchReport.limits_seq`` names the seq in force during that batch.
  * ``Limits.gate``: the job must yield its device work to the guaranteed job's device phases.

Liveness (zguide Paranoid Pirate): ``Welcome`` tells the job the node's ``heartbeat_s`` and ``liveness``.
The job sends a ``Heartbeat`` every ``heartbeat_s`` and the node echoes it; either side that hears nothing
from the other for ``heartbeat_s * liveness`` seconds treats it as gone (the job reconnects and registers
again; the node drops the job).
"""

from __future__ import annotations

import math

from colocate.protocol.codec import (
    COUNT,
    EXIT_CODE,
    INVALID,
    JOB_CLASS,
    JOB_ID,
    PID,
    SECONDS,
    SHARE,
    SIZE,
    TEXT,
    Bool,
    Choice,
    Error,
    ListOf,
    Message,
    Nested,
    Num,
    Opt,
    ProtocolError,
    Str,
    _f,
    _Record,
    _record,
)
from colocate.vocab import DeviceKind, JobClass, SloState


@_record()
class Limits(_Record):
    seq: int = _f(COUNT)
    mem_cap: int = _f(SIZE)
    sm_share: float = _f(SHARE)
    gate: bool = _f(Bool())


@_record()
class GpuInfo(_Record):
    index: int = _f(COUNT)
    mem_total: int = _f(SIZE)
    utilization: float = _f(SHARE)
    kind: DeviceKind = _f(Choice(DeviceKind))


@_record()
class JobInfo(_Record):
    job_id: str = _f(JOB_ID)
    gpu: int = _f(COUNT)
    priority: JobClass = _f(JOB_CLASS)
    pid: int = _f(PID)
    mem_cap: int = _f(SIZE)
    sm_share: float = _f(SHARE)
    mem_reserved: int = _f(SIZE)
    mem_allocated_peak: int = _f(SIZE)
    host_bytes: int = _f(SIZE)
    throughput: float = _f(Num(float, 0.0, math.inf))  # iterations per second
    slo_state: SloState = _f(Choice(SloState))
    iterations: int = _f(COUNT)


# job -> node
@_record("register")
class Register(Message):
    job_id: str = _f(JOB_ID)
    pid: int = _f(PID)
    gpu: int = _f(COUNT)
    priority: JobClass = _f(JOB_CLASS)
    mem_request: int | None = _f(Opt(SIZE))  # the job's --gpu-mem: the most the node may give (None: any)
    sm_share: float = _f(SHARE)  # the share in force now (a re-registering job may be paused)
    mem_cap: int = _f(SIZE)  # the cap in force now
    epoch: int = _f(COUNT)  # job-side incarnation counter
    token: str = _f(Str(128), default="")  # secret from the launcher; re-registering must repeat it
    sm_request: float = _f(SHARE, default=1.0)  # the job's --sm-share: the most the node may give
    rank: int | None = _f(Opt(COUNT), default=None)  # torchrun's RANK of this worker; None: not a torchrun worker
    world_size: int = _f(Num(int, 1, 1 << 20), default=1)  # torchrun's WORLD_SIZE (1 without one)
    partition: bool = _f(Bool(), default=False)  # a guaranteed fixed partition: mem_request, sm_request are its own
    pick_gpu: bool = _f(Bool(), default=False)  # the node picks this (opportunistic) worker's GPU; ``gpu`` is ignored
    # told to yield (limits ``gate``), the job takes low device priority (COLOCATE_YIELD_VIA has it, the device can)
    priority_yield: bool = _f(Bool(), default=False)

    def _check(self) -> None:
        if self.partition and (self.priority != JobClass.GUARANTEED or self.mem_request is None
                               or not self.sm_request > 0):
            raise ProtocolError(INVALID, "Register: a partition is guaranteed, with a mem_request and an "
                                         "sm_request above 0")
        if self.pick_gpu and self.priority != JobClass.OPPORTUNISTIC:
            raise ProtocolError(INVALID, "Register: the node picks the GPU of opportunistic workers only")
        if self.rank is not None and not self.job_id.endswith(f"/{self.rank}"):
            raise ProtocolError(INVALID, f"Register: a worker of rank {self.rank} registers as JOB/{self.rank}, "
                                         f"not {self.job_id!r:.80}")
        if self.rank is not None and self.rank >= self.world_size:
            raise ProtocolError(INVALID, f"Register: rank {self.rank} outside world size {self.world_size}")

    @property
    def job(self) -> str:
        """The job this worker belongs to: ``job_id`` without the ``/RANK`` of a torchrun worker."""
        return self.job_id if self.rank is None else self.job_id[: -len(f"/{self.rank}")]


@_record("batch_report")
class BatchReport(Message):
    job_id: str = _f(JOB_ID)
    seq: int = _f(COUNT)
    t_end: float = _f(SECONDS)  # job's monotonic clock at the batch boundary
    duration_s: float = _f(SECONDS)
    busy_s: float = _f(SECONDS)  # device busy time within the batch
    device_start_s: float = _f(SECONDS)  # offset within the batch where device work began
    mem_allocated_peak: int = _f(SIZE)
    mem_reserved: int = _f(SIZE)
    mem_floor: int = _f(SIZE)  # 0 when none
    host_bytes: int = _f(SIZE)
    host_bytes_touched: int = _f(SIZE)
    limits_seq: int = _f(COUNT)  # seq of the last SetLimits applied


@_record("limits_applied")
class LimitsApplied(Message):
    job_id: str = _f(JOB_ID)
    limits_seq: int = _f(COUNT)
    applied_at: float = _f(SECONDS)


@_record("goodbye")
class Goodbye(Message):
    job_id: str = _f(JOB_ID)
    exit_code: int | None = _f(Opt(EXIT_CODE))
    reason: str = _f(TEXT)


@_record("heartbeat")
class Heartbeat(Message):
    job_id: str = _f(JOB_ID)
    sent_at: float = _f(SECONDS)  # job's monotonic clock ("t" is the wire key of the type)


# node -> job
@_record("welcome")
class Welcome(Message):
    job_id: str = _f(JOB_ID)
    node_epoch: int = _f(COUNT)
    limits: Limits = _f(Nested(Limits))
    heartbeat_s: float = _f(Num(float, 0.01, 3600.0), default=1.0)  # the job heartbeats this often
    liveness: int = _f(Num(int, 1, 1000), default=3)  # silent intervals before a peer counts as gone
    gpu: int | None = _f(Opt(COUNT), default=None)  # the GPU the node registered the worker on (its pick)
    mem_total: int | None = _f(Opt(SIZE), default=None)  # that GPU's memory in bytes
    sim_core: int | None = _f(Opt(COUNT), default=None)  # a simulated GPU's CPU core (None: not simulated)


@_record("set_limits")
class SetLimits(Message):
    job_id: str = _f(JOB_ID)
    limits: Limits = _f(Nested(Limits))


# ctl/top -> node
@_record("ctl_list")
class CtlList(Message):
    pass


@_record("ctl_set")
class CtlSet(Message):
    job_id: str = _f(JOB_ID)
    mem_cap: int | None = _f(Opt(SIZE))
    sm_share: float | None = _f(Opt(SHARE))

    def _check(self) -> None:
        if self.mem_cap is None and self.sm_share is None:
            raise ProtocolError(INVALID, "CtlSet: set at least one of mem_cap, sm_share")


# node -> ctl/top
@_record("ctl_jobs")
class CtlJobs(Message):
    node_epoch: int = _f(COUNT)
    gpus: tuple = _f(ListOf(Nested(GpuInfo), 64))
    jobs: tuple = _f(ListOf(Nested(JobInfo)))


@_record("ctl_ok")
class CtlOk(Message):
    message: str = _f(TEXT)


JOB_TO_NODE = (Register, BatchReport, LimitsApplied, Goodbye, Heartbeat, Error)
NODE_TO_JOB = (Welcome, SetLimits, Error)
CTL_TO_NODE = (CtlList, CtlSet)
NODE_TO_CTL = (CtlJobs, CtlOk, Error)
