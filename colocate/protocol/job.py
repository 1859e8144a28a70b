"""Messages of the job <-> node link and of the node's operator endpoint (``colocate ctl``/``top``).

Who sends what:
  job -> node   Register, BatchReport (once per mini-batch), FeaturesReport (once, after the first mini-batch,
                and again after each Welcome), LimitsApplied, Heartbeat, Goodbye, Error
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

from colocate.base.units import LONGEST_S
from colocate.base.vocab import DeviceKind, JobClass, SloState
from colocate.protocol.codec import (
    COUNT,
    EXIT_CODE,
    INVALID,
    JOB_CLASS,
    JOB_ID,
    MAX_ID_CHARS,
    PID,
    SECONDS,
    SHARE,
    SIZE,
    TEXT,
    Bool,
    Choice,
    Error,
    ListOf,
    MapOf,
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
    # the GPU's model as the node names it (NVML's name; a simulated GPU's declared type, "sim" untyped)
    model: str = _f(Str(128, printable=True), default="", optional=True)


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
    iterations: int = _f(COUNT)  # mini-batches done, as the job counts them (its last report's batch index + 1)


FLOPS = Num(float, 0.0, math.inf)  # floating-point operations (a count, kept as a float: it may pass 2**63)
KIND = Str(64, min_len=1, printable=True)  # a module's or optimizer's class name
MAX_LAYER_GROUPS = 64  # LayerGroup entries of one ModelFeatures: the groups with the most FLOPs are kept
MAX_LAYER_KINDS = 128


@_record()
class LayerGroup(_Record):
    """Layers of one kind and shape that ran in the job's first mini-batch.

    ``kind`` is the module's class name; ``dims`` its shape-defining sizes by name: Linear ``in``, ``out``;
    ConvNd ``in``, ``out``, ``kernel`` (the product of its sizes), ``stride`` (likewise), ``groups``, ``out_size``
    (output elements per channel and sample, as observed); RNN/LSTM/GRU ``in``, ``hidden``, ``layers``,
    ``directions``, ``seq`` (as observed); MultiheadAttention ``embed``, ``heads``, ``seq``; Embedding ``num``,
    ``dim`` (EmbeddingBag too); normalisations ``features``. ``count`` modules of it ran (calls of one module counted once),
    holding ``params`` parameters; ``flops`` is their forward FLOPs in that mini-batch (multiply-add = 2)."""

    kind: str = _f(KIND)
    count: int = _f(Num(int, 1, 1 << 40))
    params: int = _f(COUNT)
    flops: float = _f(FLOPS)
    dims: tuple = _f(MapOf(Str(32, min_len=1, printable=True), COUNT, 16))


@_record()
class ModelFeatures(_Record):
    """The model as the job's first mini-batch showed it (``torch_hooks.features``).

    ``params``: distinct parameters (elements) of the modules that ran; ``trainable_params`` those requiring
    grad. ``layers``: at most ``MAX_LAYER_GROUPS`` groups, those with the most FLOPs; ``layer_counts``: modules
    that ran, by class name, every kind (activations, normalisations, containers excluded). ``forward_flops``:
    the FLOPs of the layers the runtime counts (matmuls and convolutions of Linear, ConvNd, RNN/LSTM/GRU,
    MultiheadAttention; functional calls outside modules are not seen) in that mini-batch;
    ``flops_per_iteration`` ~ 3x that (forward + backward). ``batch_size``: the training DataLoader's, else the
    first dimension of the first module's first tensor input; None when neither is known. ``optimizers``:
    class names of the optimizers that stepped in it. ``param_dtype``: the dtype holding most parameters
    (``float32``...); ``autocast_dtype``: the autocast dtype in force during it, "" when off."""

    params: int = _f(COUNT)
    trainable_params: int = _f(COUNT)
    layers: tuple = _f(ListOf(Nested(LayerGroup), MAX_LAYER_GROUPS))
    layer_counts: tuple = _f(MapOf(KIND, COUNT, MAX_LAYER_KINDS))
    forward_flops: float = _f(FLOPS)
    flops_per_iteration: float = _f(FLOPS)
    batch_size: int | None = _f(Opt(COUNT))
    optimizers: tuple = _f(ListOf(KIND, 16))
    param_dtype: str = _f(Str(32, printable=True))
    autocast_dtype: str = _f(Str(32, printable=True))


@_record()
class HardwareFeatures(_Record):
    """The job's GPU: from NVML and CUDA's device properties on CUDA, from the declared spec of a simulated GPU
    (``colocate.gpus.sim.declared``). 0 means unknown. ``mem_bandwidth`` is bytes/s, ``peak_flops`` FLOP/s
    (FP32); ``gpus`` the GPUs of the job (its world size, at least 1). ``sim_speed``: a simulated GPU's speed
    relative to the fastest type (its device work takes 1/speed as long; ``name`` is then its type); 0 on CUDA
    and from a job that predates it."""

    kind: DeviceKind = _f(Choice(DeviceKind))
    name: str = _f(Str(MAX_ID_CHARS, printable=True))
    mem_total: int = _f(SIZE)
    sm_count: int = _f(COUNT)
    sm_clock_mhz: int = _f(COUNT)
    mem_clock_mhz: int = _f(COUNT)
    mem_bandwidth: float = _f(FLOPS)
    peak_flops: float = _f(FLOPS)
    gpus: int = _f(Num(int, 1, 1 << 20))
    sim_speed: float = _f(Num(float, 0.0, 1.0), default=0.0, optional=True)


@_record()
class Features(_Record):
    """What a job taught at its first mini-batch: its model, its GPU and what it knows of its total iterations.

    ``loader_batches``: ``len()`` of the training DataLoader (the last one iterated before that mini-batch
    ended), None when there is none or it has no length. ``iterations_hint``/``epochs_hint``: the job's
    ``--iterations``/``--epochs`` (``COLOCATE_ITERATIONS``/``COLOCATE_EPOCHS``). ``total_iterations``: the
    iterations hint, else ``loader_batches x epochs_hint``, else None. ``read_s``: seconds the runtime spent
    reading all this (its cost to the first mini-batch)."""

    model: ModelFeatures = _f(Nested(ModelFeatures))
    hardware: HardwareFeatures = _f(Nested(HardwareFeatures))
    loader_batches: int | None = _f(Opt(COUNT))
    iterations_hint: int | None = _f(Opt(COUNT))
    epochs_hint: int | None = _f(Opt(COUNT))
    total_iterations: int | None = _f(Opt(COUNT))
    read_s: float = _f(SECONDS)


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


# a BatchReport's seconds are at most this (100 years: more than any monotonic clock has run), so that whatever a
# node derives from a job's reports (sums over every report, means, rates) stays a finite number
MAX_REPORT_S = LONGEST_S  # 100 years, as trace rows (colocate.base.units)
REPORT_SECONDS = Num(float, 0.0, MAX_REPORT_S)


@_record("batch_report")
class BatchReport(Message):
    """One mini-batch of a worker. Its seconds (``t_end``, ``duration_s``, ``busy_s``, ``device_start_s``) are in
    [0, ``MAX_REPORT_S``]; a report beyond that is ``invalid``."""

    job_id: str = _f(JOB_ID)
    seq: int = _f(COUNT)
    t_end: float = _f(REPORT_SECONDS)  # job's monotonic clock at the batch boundary
    duration_s: float = _f(REPORT_SECONDS)
    busy_s: float = _f(REPORT_SECONDS)  # device busy time within the batch
    device_start_s: float = _f(REPORT_SECONDS)  # offset within the batch where device work began
    mem_allocated_peak: int = _f(SIZE)
    mem_reserved: int = _f(SIZE)
    mem_floor: int = _f(SIZE)  # 0 when none
    host_bytes: int = _f(SIZE)
    host_bytes_touched: int = _f(SIZE)
    limits_seq: int = _f(COUNT)  # seq of the last SetLimits applied
    mem_reserved_peak: int = _f(SIZE, default=0)  # the most reserved during the batch (before any release)


@_record("features_report")
class FeaturesReport(Message):
    """The job's ``Features``, sent once its first mini-batch has ended, and again after every later ``Welcome``
    (a restarted node has forgotten them)."""

    job_id: str = _f(JOB_ID)
    features: Features = _f(Nested(Features))


@_record("limits_applied")
class LimitsApplied(Message):
    job_id: str = _f(JOB_ID)
    limits_seq: int = _f(COUNT)
    applied_at: float = _f(SECONDS)


GOODBYE_OOM = "oom"  # ``Goodbye.reason`` of a job ending for want of GPU memory (its node tells the scheduler)


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
# what a Welcome can tell a job (a node refuses, at its start, a config or GPU outside them: colocate.node.config)
HEARTBEAT_S = Num(float, 0.01, 3600.0)  # seconds between a job's heartbeats
LIVENESS = Num(int, 1, 1000)  # silent heartbeat intervals before a peer counts as gone
SIM_SPEED = Num(float, 0.001, 1.0)  # a simulated GPU's speed relative to the fastest type


@_record("welcome")
class Welcome(Message):
    job_id: str = _f(JOB_ID)
    node_epoch: int = _f(COUNT)
    limits: Limits = _f(Nested(Limits))
    heartbeat_s: float = _f(HEARTBEAT_S, default=1.0)  # the job heartbeats this often
    liveness: int = _f(LIVENESS, default=3)  # silent intervals before a peer counts as gone
    gpu: int | None = _f(Opt(COUNT), default=None)  # the GPU the node registered the worker on (its pick)
    mem_total: int | None = _f(Opt(SIZE), default=None)  # that GPU's memory in bytes
    sim_core: int | None = _f(Opt(COUNT), default=None)  # a simulated GPU's CPU core (None: not simulated)
    # a simulated GPU's speed relative to the fastest type: its device work takes 1/speed as long
    sim_speed: float = _f(SIM_SPEED, default=1.0, optional=True)
    sim_type: str = _f(Str(32, printable=True), default="", optional=True)  # that GPU's type ("": untyped)


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
    """An operator's override of a job's limits on its node (until the job leaves), or with ``clear`` the end of
    every override of the job: its node's policy decides its limits again."""

    job_id: str = _f(JOB_ID)
    mem_cap: int | None = _f(Opt(SIZE), default=None)
    sm_share: float | None = _f(Opt(SHARE), default=None)
    clear: bool = _f(Bool(), default=False, optional=True)

    def _check(self) -> None:
        if self.clear and (self.mem_cap is not None or self.sm_share is not None):
            raise ProtocolError(INVALID, "CtlSet: clear takes no mem_cap or sm_share")
        if not self.clear and self.mem_cap is None and self.sm_share is None:
            raise ProtocolError(INVALID, "CtlSet: set at least one of mem_cap, sm_share")
        if self.mem_cap == 0:
            raise ProtocolError(INVALID, "a memory cap of 0 bytes would serve every allocation from host memory: give "
                                         "a cap above 0 (a share of 0 pauses the job)")


# node -> ctl/top
@_record("ctl_jobs")
class CtlJobs(Message):
    node_epoch: int = _f(COUNT)
    gpus: tuple = _f(ListOf(Nested(GpuInfo), 64))
    jobs: tuple = _f(ListOf(Nested(JobInfo)))


@_record("ctl_ok")
class CtlOk(Message):
    message: str = _f(TEXT)


JOB_TO_NODE = (Register, BatchReport, FeaturesReport, LimitsApplied, Goodbye, Heartbeat, Error)
NODE_TO_JOB = (Welcome, SetLimits, Error)
CTL_TO_NODE = (CtlList, CtlSet)
NODE_TO_CTL = (CtlJobs, CtlOk, Error)
