"""What jobs ask for and what nodes offer: the scheduler's plain input records.

Pure data, no I/O, no clock. The live scheduler builds these from ``colocate submit`` and from
the nodes' registrations; the trace readers build them from trace rows; the policy core and its
plugins read them and never change them.

Units: GPU shares in milli-GPUs (1000 = one whole GPU), sizes in bytes, host memory in MiB (as
the Alibaba traces give it), CPU in milli-cores, times in seconds on the scheduler's clock.

A job is a gang of ``workers`` identical workers (torchrun's contract: one process per worker).
Each worker needs ``gpus`` GPUs on one node, ``gpu_milli`` of each (``gpu_milli < 1000`` is a
fractional GPU and then ``gpus == 1``), plus ``gpu_mem`` bytes of each GPU's memory when stated.
A job with ``gpus == 0`` needs no GPU (CPU-only pods of the Alibaba trace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from colocate.base.frozen import quick_init
from colocate.base.vocab import JOB_CLASSES, JobClass

MILLI = 1000  # milli-GPUs in one GPU


class SpecError(ValueError):
    """A job or node description that can never be valid; ``str()`` is one line for the user."""


@quick_init
@dataclass(frozen=True, slots=True)
class JobSpec:
    job_id: str
    submit_time: float = 0.0
    workers: int = 1
    gpus: int = 1  # GPUs per worker
    gpu_milli: int = MILLI  # share of each of those GPUs, 1..1000
    gpu_mem: int = 0  # bytes of each GPU's memory (0: not stated)
    cpu_milli: int = 0  # per worker (0: not stated)
    mem_mib: int = 0  # host memory per worker (0: not stated)
    gpu_model: str = ""  # only GPUs of this model ("" any)
    klass: JobClass = JobClass.GUARANTEED  # the job class (its "priority" on the wire, in traces and the journal)
    queue: str = "default"
    user: str = ""
    name: str = ""
    estimate_s: float | None = None  # the submitter's run-time estimate (backfill); None: unknown
    fingerprint: str = ""  # exact fingerprint (cluster.predict.fingerprint); "" unknown: user+name stands in
    family: str = ""  # family fingerprint (numeric hyperparameters masked); "" unknown
    # gpu_mem is the job's recommendation, not its request: a run out of memory under it is restarted with this
    # gpu_mem (0: the whole GPU), never charged to the job; None: gpu_mem is the job's own
    mem_fallback: int | None = None

    def __post_init__(self) -> None:
        if not self.job_id:
            raise SpecError("job id must not be empty")
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise SpecError(f"{self.job_id}: workers must be an integer >= 1, got {self.workers!r}")
        if not (isinstance(self.gpus, int) and self.gpus >= 0):
            raise SpecError(f"{self.job_id}: gpus per worker must be an integer >= 0, got {self.gpus!r}")
        if not (isinstance(self.gpu_milli, int) and 1 <= self.gpu_milli <= MILLI):
            raise SpecError(f"{self.job_id}: gpu_milli must be an integer in 1..1000, got {self.gpu_milli!r}")
        if self.gpu_milli < MILLI and self.gpus != 1:
            raise SpecError(f"{self.job_id}: a fractional GPU share (gpu_milli {self.gpu_milli}) needs gpus == 1")
        for name in ("gpu_mem", "cpu_milli", "mem_mib"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise SpecError(f"{self.job_id}: {name} must be an integer >= 0, got {v!r}")
        if self.klass.__class__ is not JobClass:  # a string is made the member
            if self.klass not in JOB_CLASSES:
                raise SpecError(f"{self.job_id}: priority must be one of {', '.join(JOB_CLASSES)}, got {self.klass!r}")
            object.__setattr__(self, "klass", JobClass(self.klass))
        if not (isinstance(self.submit_time, (int, float)) and math.isfinite(self.submit_time)):
            raise SpecError(f"{self.job_id}: submit_time must be a finite number, got {self.submit_time!r}")
        if self.mem_fallback is not None and not (isinstance(self.mem_fallback, int) and self.mem_fallback >= 0):
            raise SpecError(f"{self.job_id}: mem_fallback must be bytes >= 0 or None, got {self.mem_fallback!r}")
        if self.estimate_s is not None and not (math.isfinite(self.estimate_s) and self.estimate_s > 0):
            raise SpecError(f"{self.job_id}: estimate must be a positive number of seconds, got {self.estimate_s!r}")

    @property
    def guaranteed(self) -> bool:
        return self.klass == JobClass.GUARANTEED

    @property
    def total_gpus(self) -> int:
        """Whole GPUs the gang touches (a fractional worker touches one)."""
        return self.workers * self.gpus

    @property
    def total_milli(self) -> int:
        """The gang's GPU demand in milli-GPUs."""
        return self.workers * self.gpus * self.gpu_milli


@quick_init
@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    gpus: int
    gpu_model: str = ""
    gpu_mem: int = 0  # bytes per GPU (0: not stated; memory then never limits placement)
    cpu_milli: int = 0  # 0: not tracked
    mem_mib: int = 0  # 0: not tracked
    switch: str = ""  # network labels (topology-aware placement): "" not stated; a rack holds switches
    rack: str = ""

    def __post_init__(self) -> None:
        if not self.node_id:
            raise SpecError("node id must not be empty")
        if not (isinstance(self.gpus, int) and self.gpus >= 0):
            raise SpecError(f"node {self.node_id}: gpus must be an integer >= 0, got {self.gpus!r}")
        for name in ("gpu_mem", "cpu_milli", "mem_mib"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise SpecError(f"node {self.node_id}: {name} must be an integer >= 0, got {v!r}")


@quick_init
@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Where one worker of a placement runs: a node and its GPU indices on that node."""

    rank: int
    node_id: str
    gpus: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Placement:
    """One start of a job: every worker's slot. ``placement_id`` is unique per start (a
    requeued job gets a new one), so a node that sees the same id twice starts nothing twice."""

    placement_id: str
    job_id: str
    slots: tuple[WorkerSlot, ...]
    klass: JobClass  # the class it runs in on its GPUs (guaranteed | opportunistic): the job's class, or
    # opportunistic for a guaranteed job placed as such, guaranteed once promoted (the wire and the journal
    # call it ``priority``: StartPlacement.priority)

    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.node_id for s in self.slots))


@lru_cache(maxsize=4096)
def allowed_models(constraint: str) -> frozenset[str]:
    """The GPU models a ``JobSpec.gpu_model`` constraint names: ``"A|B"`` -> {A, B}; ``""`` -> {}
    (meaning any model)."""
    return frozenset(p.strip() for p in constraint.split("|") if p.strip())


def model_allows(constraint: str, model: str) -> bool:
    """Whether a node whose GPUs are ``model`` satisfies a job's ``gpu_model`` constraint.
    ``""`` allows every model; otherwise the constraint is one model or several separated by
    ``|`` (any of them will do), compared exactly. A node of unknown model (``""``) satisfies
    only the empty constraint."""
    return not constraint or model in allowed_models(constraint)
