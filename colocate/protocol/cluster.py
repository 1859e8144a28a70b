"""Messages of the node <-> scheduler link and of the client <-> scheduler requests.

The scheduler binds one ROUTER endpoint (``colocate scheduler --bind``); nodes (``colocate node
--scheduler``) and clients (``colocate submit``, ``status``, ...) connect DEALER sockets to it.

Who sends what:
  node -> scheduler   NodeHello (register; the reply is NodeWelcome), NodeHeartbeat, NodeStatus,
                      WorkerStarted, WorkerExited, StartRefused, LogTail
  scheduler -> node   NodeWelcome, NodeHeartbeat (the echo), StartPlacement, StopPlacement,
                      PromotePlacement, LogTailRequest, PlacementsSettled, Error
  client -> scheduler Submit, JobsRequest, NodesRequest, Cancel, LogsRequest, RecommendRequest
  scheduler -> client Submitted, JobsReply, NodesReply, Ok, LogsReply, RecommendReply, Error

Rules:
  * ``NodeHello.epoch`` counts node incarnations (a restarted node has a new one); every later node
    message repeats it, and the scheduler drops messages of an older epoch. A node message from a node
    the scheduler does not know (it restarted) gets ``Error(code="unknown_node")``: the node says
    ``NodeHello`` and its ``NodeStatus`` again, and the scheduler re-adopts its running workers.
  * Liveness (zguide Paranoid Pirate): the node sends ``NodeHeartbeat`` every ``heartbeat_s`` of the
    ``NodeWelcome`` and the scheduler echoes it; a node silent for ``heartbeat_s * liveness`` is down; a
    node that hears nothing for as long reconnects with exponential backoff and says hello again.
  * ``StartRefused.code``: ``refused`` (this request cannot run here: counts as a failed start) or ``stale``
    (the node is still stopping a placement of its own on those GPUs, e.g. an orphan of a silent spell:
    never the job's failure; the scheduler retries later with a backoff).
  * Fencing: ``NodeWelcome.lease_s`` > 0 gives the node a lease, renewed by each echoed heartbeat from the
    time the node sent it; the launchers of placed workers stop them when it lapses. ``WorkerExited.fenced``
    and ``WorkerStatus.fenced`` mark a worker that ended that way (not the job's failure).
  * ``WorkerExited.oom`` and ``WorkerStatus.oom`` (optional: an older peer leaves them off): the worker said, in
    its last words to its node (``Goodbye.reason`` ``oom``), that it is ending for want of GPU memory (over its
    cap with ``--on-cap error``, or CUDA's out-of-memory error); the scheduler learns the run's exit state from it.
  * ``WorkerExited.reclaimed`` and ``WorkerStatus.reclaimed`` (optional): the node stopped the (opportunistic)
    worker itself, to give the GPU memory it held and could not give back to the guaranteed job beside it
    (``colocate.node.policies.Adaptive``): not the job's failure; the scheduler puts the job back in its queue.
  * ``StartPlacement`` is idempotent per ``(cluster_id, placement_id)``: a node that has seen the id starts nothing
    twice. ``StopPlacement`` and ``PromotePlacement`` are idempotent too.
  * ``PlacementsSettled`` follows the commit of a batch that ended placements of the node (or of a report
    that shows ended placements whose end the journal already has): the node then forgets those that have
    ended there, so its status and its table hold only what the scheduler may still need.
  * Each worker of a placement is one process with torchrun's contract (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) on its GPUs.
  * Logs travel over the link: ``LogsRequest`` makes the scheduler send each worker's node a
    ``LogTailRequest``; the node reads the log file it wrote itself (a path it builds from the
    validated job id and rank, never one it was sent) and answers ``LogTail`` with at most
    ``max_bytes`` of its end; the scheduler relays the answers in one ``LogsReply``, with an error
    line for a node that is down or does not answer within ``endpoints.LOGS_DEADLINE_S``.
  * Times in views (``submitted_at`` ...) are the scheduler's wall clock, seconds since the epoch.
"""

from __future__ import annotations

import re
from enum import StrEnum

from colocate.base.text import quoted
from colocate.base.vocab import JobClass, JobState
from colocate.protocol.codec import (
    COUNT,
    EXIT_CODE,
    INVALID,
    JOB_CLASS,
    JOB_ID,
    NAME,
    NODE_ID,
    PID,
    SECONDS,
    SHARE,
    SIZE,
    TEXT,
    Bool,
    Choice,
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
from colocate.protocol.job import Features

PORT = Num(int, 0, 65535)
STATE = Choice(JobState)
MAX_NODE_GPUS = 64  # GPUs of one node
MAX_WORKERS = 4096  # workers (ranks) of one job
MAX_ENV_VALUE_CHARS = 65536  # one variable of a job's environment
GPU_INDICES = ListOf(COUNT, MAX_NODE_GPUS)
_HEX64 = re.compile(r"[0-9a-f]{64}")
AUTO = ("gpu_mem", "sm_share")  # what a job may leave to its recommendation (``JobRequest.auto``)
FIGURES = ("gpu_mem", "sm_share", "gpus", "gpu_type", "run_time")  # what a recommendation gives


def _check_hash(where: str, digest: str) -> None:
    if digest and not _HEX64.fullmatch(digest):
        raise ProtocolError(INVALID, f"{where}.script_hash: expected 64 lowercase hex digits, got {digest[:70]!r}")


MAX_GPU_MODEL_CHARS = 64  # one GPU model's name, as a node's hello or NVML gives it (e.g. "NVIDIA H200")


def gpu_model_problem(constraint: str) -> str | None:
    """Why ``constraint`` is not a GPU model constraint, in one line, else None. A constraint is "" (any model),
    one model, or several joined by ``|`` (any of them); each is 1..64 characters, spaces around it ignored,
    without ``@`` (a node's speed, ``--sim-gpus 2:T4@0.6``, is no part of the name)."""
    if not constraint:
        return None
    for part in constraint.split("|"):
        name = part.strip()
        if not name:
            return f"an empty model name in {constraint[:80]!r} (one model, or several joined by |)"
        if len(name) > MAX_GPU_MODEL_CHARS:
            return f"a model name of {len(name)} characters (at most {MAX_GPU_MODEL_CHARS}): {name[:40]!r}..."
        if "@" in name:
            return f"{name[:80]!r}: a model name has no @ (a node declares a speed with it, not a job)"
    return None


class Refusal(StrEnum):
    """``StartRefused.code``: the request's fault, or the node's own stale state (the value is the wire string)."""

    REFUSED = "refused"
    STALE = "stale"


REFUSED, REFUSED_STALE = Refusal.REFUSED, Refusal.STALE
REFUSAL = Choice(Refusal)
MAX_PAGE = 1000  # jobs per JobsReply
LOG_TAIL_MAX_BYTES = 64 << 10  # the most of one worker's log a LogTail carries
LOG_TEXT = Str(LOG_TAIL_MAX_BYTES)
TOPOLOGY_LEVELS = ("switch", "rack")  # a node's network labels, innermost first
LABEL = Str(64, min_len=1, printable=True)
TOPOLOGY = MapOf(Str(choices=TOPOLOGY_LEVELS), LABEL)
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/")


def parse_topology(text: str) -> tuple[tuple[str, str], ...]:
    """``"switch=s1,rack=r2"`` -> ``(("switch", "s1"), ("rack", "r2"))`` (levels in ``TOPOLOGY_LEVELS``
    order; either may be left out; ``""`` gives none). A label is 1-64 characters of letters, digits and
    ``._-:/``. Raises ValueError with one line naming what is wrong."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or key not in TOPOLOGY_LEVELS:
            raise ValueError(f"topology: expected {'=LABEL, '.join(TOPOLOGY_LEVELS)}=LABEL separated by commas, "
                             f"got {quoted(part)}")
        if key in out:
            raise ValueError(f"topology: {key} given twice")
        if not (1 <= len(value) <= 64) or not set(value) <= _LABEL_CHARS:
            raise ValueError(f"topology: {key} label {quoted(value)} must be 1-64 letters, digits or ._-:/")
        out[key] = value
    return tuple((k, out[k]) for k in TOPOLOGY_LEVELS if k in out)


# ---------------------------------------------------------------- nested records


@_record()
class NodeGpu(_Record):
    index: int = _f(COUNT)
    model: str = _f(NAME)
    mem_total: int = _f(SIZE)
    # the model's speed relative to the fastest type, where the node declares it (typed simulated GPUs); 0: not known
    speed: float = _f(SHARE, default=0.0, optional=True)


@_record()
class GpuStatus(_Record):
    index: int = _f(COUNT)
    utilization: float = _f(SHARE)  # device busy fraction over the last 10 s
    mem_used: int = _f(SIZE)


@_record()
class WorkerStatus(_Record):
    job_id: str = _f(JOB_ID)
    placement_id: str = _f(NAME)
    rank: int = _f(COUNT)
    pid: int = _f(PID)
    running: bool = _f(Bool())
    exit_code: int | None = _f(Opt(EXIT_CODE), default=None)
    fenced: bool = _f(Bool(), default=False)  # it ended while the node's lease had lapsed: not the job's failure
    oom: bool = _f(Bool(), default=False, optional=True)  # it ended because it ran out of GPU memory (its cap)
    reclaimed: bool = _f(Bool(), default=False, optional=True)  # the node stopped it for the guaranteed job's memory


@_record()
class WorkerLaunch(_Record):
    rank: int = _f(COUNT)
    local_rank: int = _f(COUNT)
    gpus: tuple = _f(GPU_INDICES)


@_record()
class JobRequest(_Record):
    """What a user submits: resources per worker, the command, and where and how it runs."""

    command: tuple = _f(ListOf(TEXT, 256, min_len=1))  # the program and its arguments: never empty
    cwd: str = _f(TEXT)
    # the submitter's environment, COLOCATE_*-free
    env: tuple = _f(MapOf(Str(256, min_len=1), Str(MAX_ENV_VALUE_CHARS)))
    workers: int = _f(Num(int, 1, MAX_WORKERS), default=1)
    gpus: int = _f(Num(int, 0, 64), default=1)  # per worker
    gpu_mem: int = _f(SIZE, default=0)  # bytes per GPU; 0: not stated
    priority: JobClass = _f(JOB_CLASS, default=JobClass.GUARANTEED)
    queue: str = _f(NAME, default="")  # "": the policy's default queue
    name: str = _f(NAME, default="")
    user: str = _f(NAME, default="")
    estimate_s: float | None = _f(Opt(SECONDS), default=None)
    iterations: int | None = _f(Opt(Num(int, 1, 1 << 40)), default=None)  # --iterations: the total, as the user said
    epochs: int | None = _f(Opt(Num(int, 1, 1 << 20)), default=None)  # --epochs: x len(DataLoader) is the total
    # the entry script's content hash (SHA-256, 64 lowercase hex digits) as the submitting client read it; "" when
    # it could not (``cluster.predict.fingerprint``: the scheduler makes the job's fingerprints from it, the command
    # and the user of the submitter's key). Only a key for the job's history: nothing trusts it
    script_hash: str = _f(Str(64), default="", optional=True)
    # the compute share each worker may use (``colocate submit --sm-share``; None: the whole GPU), and the resources
    # it leaves to its recommendation (``--gpu-mem auto``, ``--sm-share auto``: the scheduler's history decides)
    sm_share: float | None = _f(Opt(Num(float, 0.01, 1.0)), default=None, optional=True)
    auto: tuple = _f(ListOf(Str(choices=AUTO), len(AUTO)), default=(), optional=True)
    # only GPUs of this model, or of one of several joined by "|" ("": any), as the nodes' hellos name them
    gpu_model: str = _f(NAME, default="", optional=True)

    def _check(self) -> None:
        _check_hash("JobRequest", self.script_hash)
        why = gpu_model_problem(self.gpu_model)
        if why:
            raise ProtocolError(INVALID, f"JobRequest.gpu_model: {why}")
        if len(set(self.auto)) != len(self.auto):
            raise ProtocolError(INVALID, f"JobRequest.auto: a resource named twice in {list(self.auto)}")
        if "gpu_mem" in self.auto and self.gpu_mem or "sm_share" in self.auto and self.sm_share is not None:
            raise ProtocolError(INVALID, "JobRequest: a resource is either stated or auto, not both")


@_record()
class JobProgress(_Record):
    """One worker's progress as its node summarises the ``BatchReport``s it received (``colocate.node.progress``).

    ``job_id`` is the job's id (not ``JOB/RANK``), ``rank`` the worker's (0 for a one-process job).
    ``iterations``: mini-batches done, as the job counts them. ``step_p50_s``/``step_p90_s``/``step_mean_s``:
    median, 90th percentile and mean of the time per iteration (boundary to boundary, throttle idle included)
    over the last ``window`` iterations, the job's first left out once there is another (its start-up); the
    mean is the recent wall time per iteration (0 from a node that predates it). ``step_host_s``: the mean, over
    the same window, of the time from a mini-batch's start to its first device work (the host part of the step:
    waiting for input, host work; 0 from a node that predates it). Peaks are over the worker's life at the node
    (reserved: before any release at a boundary). ``busy_fraction``: device busy time over wall time, summed over every report.
    ``total_iterations``: what the job knows of its total (``Features.total_iterations``). ``since_report_s``:
    seconds, on the node's clock, since the last report. ``features``: the job's ``Features``, carried by the
    first ``NodeStatus`` after the node learned them and after each ``NodeWelcome``, otherwise None (the
    scheduler keeps the last it was sent)."""

    job_id: str = _f(JOB_ID)
    rank: int = _f(COUNT)
    iterations: int = _f(COUNT)
    step_p50_s: float = _f(SECONDS)
    step_p90_s: float = _f(SECONDS)
    window: int = _f(COUNT)
    mem_reserved_peak: int = _f(SIZE)
    mem_allocated_peak: int = _f(SIZE)
    busy_fraction: float = _f(SHARE)
    total_iterations: int | None = _f(Opt(COUNT), default=None)
    since_report_s: float = _f(SECONDS, default=0.0)
    features: Features | None = _f(Opt(Nested(Features)), default=None)
    step_mean_s: float = _f(SECONDS, default=0.0, optional=True)
    step_host_s: float = _f(SECONDS, default=0.0, optional=True)


# ---------------------------------------------------------------- node -> scheduler


@_record("node_hello")
class NodeHello(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    host: str = _f(NAME)  # the address workers on other nodes reach this node at (MASTER_ADDR)
    gpus: tuple = _f(ListOf(Nested(NodeGpu), MAX_NODE_GPUS))
    cpu_milli: int = _f(COUNT, default=0)
    mem_mib: int = _f(COUNT, default=0)
    # network labels (``parse_topology``): a scheduler topology file overrides them; optional on the wire
    topology: tuple = _f(TOPOLOGY, default=(), optional=True)


@_record("node_heartbeat")
class NodeHeartbeat(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)  # the sender's incarnation (the node's, or the scheduler's in the echo)


@_record("node_status")
class NodeStatus(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    gpus: tuple = _f(ListOf(Nested(GpuStatus), MAX_NODE_GPUS))
    workers: tuple = _f(ListOf(Nested(WorkerStatus)))
    progress: tuple = _f(ListOf(Nested(JobProgress)), default=())  # the node's registered workers' progress


@_record("worker_started")
class WorkerStarted(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    job_id: str = _f(JOB_ID)
    placement_id: str = _f(NAME)
    rank: int = _f(COUNT)
    pid: int = _f(PID)
    log_path: str = _f(TEXT)


@_record("worker_exited")
class WorkerExited(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    job_id: str = _f(JOB_ID)
    placement_id: str = _f(NAME)
    rank: int = _f(COUNT)
    exit_code: int = _f(EXIT_CODE)  # 128+N when killed by signal N
    fenced: bool = _f(Bool(), default=False)  # it ended while the node's lease had lapsed: not the job's failure
    # it ended because it ran out of GPU memory: its runtime said so in its Goodbye (``GOODBYE_OOM``) before it exited
    oom: bool = _f(Bool(), default=False, optional=True)
    # the node stopped it to give the memory it held back to the guaranteed job on its GPU: not the job's failure
    reclaimed: bool = _f(Bool(), default=False, optional=True)


@_record("start_refused")
class StartRefused(Message):
    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    job_id: str = _f(JOB_ID)
    placement_id: str = _f(NAME)
    reason: str = _f(TEXT)
    code: Refusal = _f(REFUSAL, default=REFUSED)  # REFUSED_STALE: the node is busy with its own stale state


@_record("log_tail")
class LogTail(Message):
    """The answer to ``LogTailRequest``: the end of the log (at most its ``max_bytes``, decoded with
    replacement characters), or ``error``."""

    node_id: str = _f(NODE_ID)
    epoch: int = _f(COUNT)
    request_id: str = _f(NAME)
    text: str = _f(LOG_TEXT, default="")
    truncated: bool = _f(Bool(), default=False)  # earlier output was left out
    error: str = _f(TEXT, default="")


# ---------------------------------------------------------------- scheduler -> node


@_record("node_welcome")
class NodeWelcome(Message):
    node_id: str = _f(NODE_ID)
    scheduler_epoch: int = _f(COUNT)
    heartbeat_s: float = _f(Num(float, 0.01, 3600.0))
    liveness: int = _f(Num(int, 1, 1000))
    cluster_id: str = _f(NAME, default="")  # minted with the scheduler's state file; scopes placement ids
    lease_s: float = _f(Num(float, 0.0, 3600.0), default=0.0)  # the node's lease per echoed heartbeat; 0: none


@_record("start_placement")
class StartPlacement(Message):
    placement_id: str = _f(NAME)
    job_id: str = _f(JOB_ID)
    priority: JobClass = _f(JOB_CLASS)
    request: JobRequest = _f(Nested(JobRequest))
    workers: tuple = _f(ListOf(Nested(WorkerLaunch)))  # this node's workers
    world_size: int = _f(Num(int, 1, 1 << 20))
    group_rank: int = _f(COUNT)  # this node's index among the placement's nodes
    master_addr: str = _f(NAME)
    master_port: int = _f(PORT)
    cluster_id: str = _f(NAME, default="")  # the placement's identity on the node is (cluster_id, placement_id)
    # an opportunistic job's recommended memory and share: the node's policy starts it there (0: its own defaults)
    start_mem: int = _f(SIZE, default=0, optional=True)
    start_share: float = _f(SHARE, default=0.0, optional=True)
    # the request's gpu_mem is its recommendation: over it the job stops (``--on-cap error``) and the scheduler
    # restarts it at the whole GPU, rather than letting it run on slowed by host memory
    cap_recommended: bool = _f(Bool(), default=False, optional=True)


@_record("stop_placement")
class StopPlacement(Message):
    placement_id: str = _f(NAME)
    job_id: str = _f(JOB_ID)
    reason: str = _f(TEXT)
    grace_s: float = _f(Num(float, 0.0, 3600.0), default=10.0)  # SIGTERM, then SIGKILL after this


@_record("promote_placement")
class PromotePlacement(Message):
    placement_id: str = _f(NAME)
    job_id: str = _f(JOB_ID)


@_record("log_tail_request")
class LogTailRequest(Message):
    """Asks a node for the end of worker ``rank``'s log of job ``job_id`` (answered with ``LogTail``)."""

    request_id: str = _f(NAME)
    job_id: str = _f(JOB_ID)
    rank: int = _f(COUNT)
    max_bytes: int = _f(Num(int, 1, LOG_TAIL_MAX_BYTES), default=LOG_TAIL_MAX_BYTES)


@_record("placements_settled")
class PlacementsSettled(Message):
    """The scheduler has journaled the end of these placements of the node (sent after the commit): the node
    may forget those that have ended there (it keeps their ids, so none starts again). At most
    ``MAX_LIST_ITEMS`` ids a message; more go in several."""

    node_id: str = _f(NODE_ID)
    placement_ids: tuple = _f(ListOf(NAME))



NODE_TO_SCHEDULER = (NodeHello, NodeHeartbeat, NodeStatus, WorkerStarted, WorkerExited, StartRefused, LogTail)
SCHEDULER_TO_NODE = (NodeWelcome, NodeHeartbeat, StartPlacement, StopPlacement, PromotePlacement, LogTailRequest,
                     PlacementsSettled)
