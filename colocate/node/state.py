"""What the node knows about its GPUs and jobs (plain data, owned by NodeCore)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.vocab import Priority

RECENT = 64  # reports kept per job


@dataclass
class JobState:
    job_id: str
    gpu: int
    priority: str
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
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    sent_at: dict = field(default_factory=dict)  # limits seq -> node time it was sent
    slo_state: str = "new"
    applied_seq: int = 0  # the newest limits seq the job has reported in force
    last_report_at: float | None = None
    job: str = ""  # the job this worker belongs to (``Register.job``; job_id itself for a one-process job)
    rank: int | None = None  # torchrun's RANK, None for a one-process job
    priority_yield: bool = False  # ``Register.priority_yield``: told to yield, it takes low device priority

    def __post_init__(self) -> None:
        self.job = self.job or self.job_id

    @property
    def guaranteed(self) -> bool:
        return self.priority == Priority.GUARANTEED

    @property
    def last(self) -> P.BatchReport | None:
        return self.recent[-1] if self.recent else None

    def throughput(self, n: int = 16) -> float:
        """Iterations per second over the last ``n`` reports."""
        reps = list(self.recent)[-n:]
        total = sum(r.duration_s for r in reps)
        return len(reps) / total if total > 0 else 0.0

    def busy_fraction(self, n: int = 16) -> float:
        reps = list(self.recent)[-n:]
        total = sum(r.duration_s for r in reps)
        return sum(r.busy_s for r in reps) / total if total > 0 else 0.0


@dataclass
class GpuState:
    spec: GpuSpec
    jobs: list = field(default_factory=list)  # job ids, registration order
    busy: deque = field(default_factory=lambda: deque(maxlen=4096))  # (node receive time, busy_s) per report
    policy: dict = field(default_factory=dict)  # the policy's own per-GPU state

    def utilization(self, now: float, window_s: float = 2.0) -> float:
        """Fraction of the last ``window_s`` seconds the GPU did job device work."""
        busy = sum(b for t, b in self.busy if t > now - window_s)
        return min(1.0, busy / window_s)
