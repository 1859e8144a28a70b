"""The scheduler core's inputs (events) and outputs (decisions).

``SchedulerCore.handle(event, now) -> list[decision]`` is the whole contract. The live server
(``colocate scheduler``) turns wire messages into events and decisions into messages and journal
rows; the trace simulator turns decisions into future events. Neither adds policy of its own, so
the same events at the same times give the same decisions in both.

Who produces which event:
  user/client   JobSubmitted, JobCancelled
  node edge     NodeJoined (register, with an epoch), NodeLost (missed heartbeats), NodeReport
                (periodic: GPU utilization and memory, the node's workers), RankStarted,
                RankExited, PlacementRefused (the protocol's WorkerStarted, WorkerExited, StartRefused),
                JobProgressed (a running job's progress, from the summaries a NodeStatus carries)
  clock         Tick (time-driven steps: promotions, start deadlines, reconciliation)

Decisions, in the order the edge must act on them:
  JobChanged    a job's state changed; the live edge commits it to the journal *before* acting
                on any decision that follows it in the same list
  StartWorkers  start the workers of a placement on their nodes (idempotent per placement id)
  StopWorkers   stop the workers of a placement (SIGTERM, grace, SIGKILL); idempotent
  Promote       an opportunistic placement runs on as guaranteed (AntMan upgrade in place)

Times are seconds on the scheduler's clock (``now``); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.spec import JobSpec, NodeSpec, Placement
from colocate.base.frozen import quick_init
from colocate.base.vocab import JobState

# job states (one small state machine; the terminal ones, colocate.base.vocab.TERMINAL, never change again)
PENDING, PLACING, RUNNING = JobState.PENDING, JobState.PLACING, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
STATES = (PENDING, PLACING, RUNNING, SUCCEEDED, FAILED, CANCELLED)


# ---------------------------------------------------------------- events


@quick_init
@dataclass(frozen=True, slots=True)
class JobSubmitted:
    spec: JobSpec


@quick_init
@dataclass(frozen=True, slots=True)
class JobCancelled:
    job_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node registered. A known node with a new ``epoch`` restarted: the core reconciles it
    (workers it no longer reports are gone)."""

    spec: NodeSpec
    epoch: int


@quick_init
@dataclass(frozen=True, slots=True)
class NodeLost:
    """A node fell silent. Its placements are lost at once (``hold_s`` 0), or only after ``hold_s`` seconds
    if it has not come back by then (its workers are fenced by their lease meanwhile); either way it takes
    no new work until it registers again."""

    node_id: str
    reason: str
    hold_s: float = 0.0


@quick_init
@dataclass(frozen=True, slots=True)
class GpuReport:
    index: int
    utilization: float  # 0..1, device busy fraction over the last 10 s
    mem_used: int  # bytes


@quick_init
@dataclass(frozen=True, slots=True)
class WorkerReport:
    job_id: str
    placement_id: str
    rank: int
    running: bool
    exit_code: int | None = None  # when not running
    fenced: bool = False  # ended by its node's lapsed lease: lost, not failed
    oom: bool = False  # ended for want of GPU memory (as the worker said)
    reclaimed: bool = False  # stopped by its node for the guaranteed job's memory: put back in the queue


@quick_init
@dataclass(frozen=True, slots=True)
class NodeReport:
    """Periodic state of one node: its GPUs and every worker it holds (the basis for re-adopting
    running workers after a scheduler restart and for stopping orphans)."""

    node_id: str
    epoch: int
    gpus: tuple[GpuReport, ...]
    workers: tuple[WorkerReport, ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class RankStarted:
    job_id: str
    placement_id: str
    rank: int
    node_id: str = ""  # the node that says so: the event counts only if it holds that rank ("": a trusted source)


@quick_init
@dataclass(frozen=True, slots=True)
class RankExited:
    job_id: str
    placement_id: str
    rank: int
    exit_code: int  # 0 success; 128+N killed by signal N
    fenced: bool = False  # ended by its node's lapsed lease: lost, not failed
    oom: bool = False  # ended for want of GPU memory (as the worker said)
    node_id: str = ""  # the node that says so: the event counts only if it holds that rank ("": a trusted source)
    reclaimed: bool = False  # stopped by its node for the guaranteed job's memory: put back in the queue


@quick_init
@dataclass(frozen=True, slots=True)
class PlacementRefused:
    """A node could not start a worker of a placement (bad command, no such GPU...)."""

    job_id: str
    placement_id: str
    node_id: str
    reason: str
    stale: bool = False  # the node is busy with its own stale state: never counted as a failed start


@quick_init
@dataclass(frozen=True, slots=True)
class JobProgressed:
    """A running job's progress, as its lowest rank's node summarised it: ``done`` of ``total`` iterations
    (``total`` 0: unknown), the recent median, p90 (and mean) seconds per iteration, reported ``age_s`` seconds before
    ``now``. It moves the job's remaining-time prediction (``on_progress``); it never changes the job's state."""

    job_id: str
    done: int
    total: int
    step_p50_s: float
    step_p90_s: float
    age_s: float = 0.0
    step_mean_s: float | None = None  # the window's mean (what a projection of the remaining steps uses); None: not reported


@quick_init
@dataclass(frozen=True, slots=True)
class Tick:
    """Periodic; time-driven policy steps run here."""


# ---------------------------------------------------------------- journal


@quick_init
@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as the live server journals it (one row per job, rewritten on every JobChanged and
    Promote): what ``SchedulerCore.restore`` rebuilds the core from after a restart. ``attempt``
    is the number of placements made so far (the current placement's id is
    ``f"{job_id}.{attempt}"``); ``placement`` is the current one for placing/running jobs."""

    spec: JobSpec
    state: JobState
    placement: Placement | None = None
    attempt: int = 0
    failed_starts: int = 0


# ---------------------------------------------------------------- decisions


@quick_init
@dataclass(frozen=True, slots=True)
class JobChanged:
    job_id: str
    state: JobState
    reason: str = ""
    placement_id: str | None = None
    oom: bool = False  # the run ended because a worker ran out of GPU memory (what the journal's history records)
    spec: JobSpec | None = None  # the job's spec changed to this (restarted at a larger memory cap): journal it


@quick_init
@dataclass(frozen=True, slots=True)
class StartWorkers:
    spec: JobSpec
    placement: Placement


@quick_init
@dataclass(frozen=True, slots=True)
class StopWorkers:
    job_id: str
    placement_id: str
    nodes: tuple[str, ...]
    reason: str


@quick_init
@dataclass(frozen=True, slots=True)
class Promote:
    job_id: str
    placement_id: str
    nodes: tuple[str, ...]


Decision = JobChanged | StartWorkers | StopWorkers | Promote  # what ``SchedulerCore.handle`` returns: a closed
# union, so an edge dispatches on it exhaustively (``match`` ending in ``typing.assert_never``)
