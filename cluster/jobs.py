"""The core's mutable job record and the per-attempt request the plugins see.

``Job`` is owned by ``SchedulerCore``; plugins read it and never change it. ``Request`` describes
one placement attempt of one job in one cycle (the framework reuses one object, so a plugin must
not keep a reference to it past the call).
"""

from __future__ import annotations

from types import MappingProxyType

from cluster.events import PENDING
from cluster.spec import JobSpec, Placement
from colocate.base.vocab import JobClass, JobState

# What a job holds for ranks while it has no current placement: shared, read-only (a write raises).
# ``begin_attempt`` gives it fresh ones; ``end_attempt`` takes them back (a million jobs kept, a
# third of their memory saved).
NO_RANKS: frozenset[int] = frozenset()
NO_EXITS: MappingProxyType[int, int] = MappingProxyType({})


class Job:
    __slots__ = ("spec", "job_id", "seq", "state", "queue", "key", "rshape", "attempt",
                 "placement", "started", "exited", "failed_starts", "enqueued_at", "placed_at",
                 "running_since", "ended_at", "reason")

    def __init__(self, spec: JobSpec, seq: int) -> None:
        self.spec = spec
        self.job_id = spec.job_id
        self.seq = seq  # arrival order at the core (ties in submit time)
        self.state: JobState = PENDING
        self.queue = ""  # set by the queue-sort plugin at submit
        self.key: tuple = ()  # sort key within the queue
        self.rshape: tuple = ()
        self.respec(spec)
        self.attempt = 0  # placements made so far; the next id is f"{job_id}.{attempt + 1}"
        self.placement: Placement | None = None  # current placement (placing/running)
        self.started: set[int] = NO_RANKS  # type: ignore[assignment]  # ranks of the current placement started
        self.exited: dict[int, int] = NO_EXITS  # type: ignore[assignment]  # rank -> exit code, current placement
        self.failed_starts = 0
        self.enqueued_at = spec.submit_time  # when it last became pending (scheduler clock)
        self.placed_at: float | None = None
        self.running_since: float | None = None
        self.ended_at: float | None = None
        self.reason = ""

    def respec(self, spec: JobSpec) -> None:
        """The job asks for ``spec`` from now on (same id); only the core calls it, while the job is not queued."""
        self.spec = spec
        self.rshape = (spec.workers, spec.gpus, spec.gpu_milli, spec.gpu_mem, spec.cpu_milli, spec.mem_mib,
                       spec.gpu_model)

    @property
    def placement_id(self) -> str | None:
        return self.placement.placement_id if self.placement else None

    def next_pid(self) -> str:
        return f"{self.job_id}.{self.attempt + 1}"

    def begin_attempt(self, started=()) -> None:
        """A placement starts (or is restored with ``started`` ranks): fresh rank records."""
        self.started = set(started)
        self.exited = {}

    def end_attempt(self) -> None:
        """No current placement any more (requeued or ended): the shared empty rank records."""
        self.started = NO_RANKS  # type: ignore[assignment]
        self.exited = NO_EXITS  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, {self.state}, queue={self.queue!r}, attempt={self.attempt})"


class Request:
    """One attempt to place ``job`` as ``klass``; ``rank``/``remaining`` move worker by worker."""

    __slots__ = ("job", "spec", "klass", "queue", "pid", "now", "workers", "gpus", "milli", "mem",
                 "cpu", "host_mem", "model", "rank", "remaining", "seen", "gang_nodes")

    def __init__(self) -> None:
        self.job: Job = None  # type: ignore[assignment]  # set by setup() before any plugin sees it
        self.seen: set = set()
        self.gang_nodes: dict = {}  # nodes holding workers placed so far in this attempt, in order

    def setup(self, job: Job, klass: JobClass, now: float) -> Request:
        s = job.spec
        self.job, self.spec, self.klass, self.queue, self.now = job, s, klass, job.queue, now
        self.pid = f"{job.job_id}.{job.attempt + 1}"  # job.next_pid()
        self.workers, self.gpus, self.milli, self.mem = s.workers, s.gpus, s.gpu_milli, s.gpu_mem
        self.cpu, self.host_mem, self.model = s.cpu_milli, s.mem_mib, s.gpu_model
        self.rank, self.remaining = 0, s.workers
        self.gang_nodes.clear()
        return self

    @property
    def whole(self) -> bool:
        """Whole GPUs per worker (not a fractional share)."""
        return self.milli >= 1000

    @property
    def remaining_gpus(self) -> int:
        """GPUs the workers not yet placed still need (rank's included)."""
        return self.remaining * self.gpus
