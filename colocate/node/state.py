"""What the node knows about its GPUs and registered workers (plain data, owned by NodeCore): ``RegisteredWorker``
per worker process registered with the node's job endpoint, ``LocalGpu`` per GPU of this node.

``GuaranteedSide`` is how a GPU's fixed partitions look to a node policy: one guaranteed job (see its
docstring), so a policy written for one guaranteed job per GPU co-locates opportunistic work beside them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from colocate import protocol as P
from colocate.base.vocab import JobClass, SloState
from colocate.gpus.spec import GpuSpec

RECENT = 64  # reports kept per job
# reports totalling less wall time than this measured nothing: the rates over them are 0.0. With at most RECENT
# reports, each of at most ``P.MAX_REPORT_S``, every rate and sum derived from them is finite
MIN_MEASURED_S = 1e-9


def host_served(report: P.BatchReport | None) -> int:
    """The host-memory bytes a job's last mini-batch used: what it still holds there at the boundary, or, where more,
    what the batch touched (a buffer spilled and freed within the batch holds none at the boundary)."""
    if report is None:
        return 0
    return max(report.host_bytes, report.host_bytes_touched)


@dataclass(slots=True)
class RegisteredWorker:
    """One worker process registered with the node (``P.Register``): ``job_id`` is the worker's id (``JOB/RANK`` for
    a torchrun worker, the job's id for a one-process job), ``job`` its job's."""

    job_id: str
    gpu: int
    klass: JobClass
    pid: int
    mem_request: int | None  # bytes; the most the policy may give (None: no limit)
    sm_request: float  # the most compute share the policy may give
    registered_at: float
    last_seen: float
    limits: P.Limits
    token: str = ""
    override_cap: int | None = None
    override_share: float | None = None
    iterations: int = 0
    recent: deque[P.BatchReport] = field(default_factory=lambda: deque(maxlen=RECENT))
    sent_at: dict[int, float] = field(default_factory=dict)  # limits seq -> node time it was sent
    slo_state: SloState = SloState.NEW
    applied_seq: int = 0  # the newest limits seq the job has reported in force
    last_report_at: float | None = None
    job: str = ""  # the job this worker belongs to (``Register.job``; job_id itself for a one-process job)
    rank: int | None = None  # torchrun's RANK, None for a one-process job
    priority_yield: bool = False  # ``Register.priority_yield``: told to yield, it takes low device priority
    partition: bool = False  # a guaranteed fixed partition: mem_request and sm_request are its limits, for good
    # progress (``colocate.node.progress``): totals and peaks over every report, and the job's features
    iterations_done: int = 0  # as the job counts them (its last report's seq + 1)
    busy_total_s: float = 0.0
    wall_total_s: float = 0.0
    mem_reserved_peak: int = 0
    mem_allocated_peak: int = 0
    features: P.Features | None = None  # from its FeaturesReport
    features_seq: int = 0  # bumps with every FeaturesReport (the scheduler agent resends what it has not sent)
    start_mem: int = 0  # the scheduler's recommendation for an opportunistic worker: the policy starts it here
    start_share: float = 0.0  # (0: the policy's own starting point)
    reclaim_since: float | None = None  # since when the policy has wanted its memory back (``Want.reclaim``)
    stopping: bool = False  # its placement is being stopped: it runs (share 1) to act on the stop signal

    def __post_init__(self) -> None:
        self.job = self.job or self.job_id

    @property
    def guaranteed(self) -> bool:
        return self.klass == JobClass.GUARANTEED

    @property
    def claim(self) -> float:
        """The share of its GPU this worker holds against other guaranteed ones (``colocate.node.claims``):
        a partition its own share, any other guaranteed worker the whole GPU, an opportunistic one nothing."""
        if not self.guaranteed:
            return 0.0
        return self.sm_request if self.partition else 1.0

    @property
    def last(self) -> P.BatchReport | None:
        return self.recent[-1] if self.recent else None

    @property
    def mem_held(self) -> int:
        """Bytes of its GPU this worker counts as using: a partition its whole cap (it may grow to it at any
        time), any other worker what it reserved at its last report (0 before one)."""
        if self.partition:
            return int(self.mem_request or 0)
        return self.last.mem_reserved if self.last is not None else 0

    def throughput(self, n: int = 16, now: float | None = None) -> float:
        """Iterations per second over the last ``n`` reports, and, with ``now`` (the node's clock), the time since
        the last one (a paused or stalled job's rate falls instead of showing its last pace for ever); 0.0 while
        the reports total less than ``MIN_MEASURED_S`` (a job's tiny durations never make a rate that overflows)."""
        reps = list(self.recent)[-n:]
        total = sum(r.duration_s for r in reps)
        return len(reps) / (total + self._since_last(now)) if total >= MIN_MEASURED_S else 0.0

    def busy_fraction(self, n: int = 16, now: float | None = None) -> float:
        """Device busy time over wall time of the last ``n`` reports (and the time since the last one, with
        ``now``: the policies read the reports alone), in [0, 1]; 0.0 while they total less than ``MIN_MEASURED_S``."""
        reps = list(self.recent)[-n:]
        total = sum(r.duration_s for r in reps)
        if total < MIN_MEASURED_S:
            return 0.0
        return min(1.0, sum(r.busy_s for r in reps) / (total + self._since_last(now)))

    def _since_last(self, now: float | None) -> float:
        if now is None or self.last_report_at is None:
            return 0.0
        return max(0.0, now - self.last_report_at)


@dataclass(slots=True)
class LocalGpu:
    """One GPU of this node as its core holds it: its registered workers and their reported device time."""

    spec: GpuSpec
    jobs: list[str] = field(default_factory=list)  # registered workers' ids, registration order
    busy: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4096))  # (node time, busy_s)
    policy: object | None = None  # the policy's own per-GPU state, a record of its own (``AdaptiveState``)

    def utilization(self, now: float, window_s: float = 2.0) -> float:
        """Fraction of the last ``window_s`` seconds the GPU did job device work."""
        busy = sum(b for t, b in self.busy if t > now - window_s)
        return min(1.0, busy / window_s)


class GuaranteedSide:
    """A GPU's fixed partitions as one guaranteed job, for a node policy (read-only, rebuilt per plan).

    ``job_id`` names the set of partitions (a new set is a new guaranteed job: the policy measures it again);
    its batches are the first-registered partition's (the policy's SLO guards that one), and ``mem_request``
    the sum of their caps. It is idle only when every partition is (``last_report_at`` is the latest of
    theirs). Memory needs no view: the node core never lets opportunistic caps on the GPU exceed what the
    partitions' caps leave, whatever the policy wishes.
    """

    guaranteed = True
    partition = False
    override_cap: int | None = None

    def __init__(self, parts: list[RegisteredWorker]):
        self.parts = parts
        first = parts[0]
        self.job_id = "\x00partitions:" + ",".join(p.job_id for p in parts)  # never a worker's id on the wire
        self.mem_request = sum(int(p.mem_request or 0) for p in parts)
        self.sm_request = min(1.0, sum(p.sm_request for p in parts))
        self.registered_at = first.registered_at
        self.iterations = first.iterations
        self.limits = first.limits
        self.applied_seq = first.applied_seq
        self.override_share: float | None = None
        reports = [p.last_report_at for p in parts if p.last_report_at is not None]
        self.last_report_at = max(reports) if reports else None
        self.recent = first.recent

    @property
    def last(self) -> P.BatchReport | None:
        return self.recent[-1] if self.recent else None

    def throughput(self, n: int = 16, now: float | None = None) -> float:
        return RegisteredWorker.throughput(self, n, now)  # type: ignore[arg-type]  # same fields, same arithmetic

    def busy_fraction(self, n: int = 16, now: float | None = None) -> float:
        return RegisteredWorker.busy_fraction(self, n, now)  # type: ignore[arg-type]

    def _since_last(self, now: float | None) -> float:
        return RegisteredWorker._since_last(self, now)  # type: ignore[arg-type]
