"""Messages of the client <-> scheduler requests (``colocate submit``, ``status``, ``queue``, ``nodes``, ``cancel``,
``logs``, ``recommend``) and the views they carry; the rules of the link are ``colocate.protocol.cluster``'s.

Who sends what:
  client -> scheduler Submit, JobsRequest, NodesRequest, Cancel, LogsRequest, RecommendRequest
  scheduler -> client Submitted, JobsReply, NodesReply, Ok, LogsReply, RecommendReply, Error
"""

from __future__ import annotations

from colocate.base.vocab import JobClass, JobState
from colocate.protocol.cluster import (
    FIGURES,
    LOG_TEXT,
    MAX_PAGE,
    MAX_WORKERS,
    STATE,
    JobProgress,
    JobRequest,
    _check_hash,
)
from colocate.protocol.codec import (
    COUNT,
    EXIT_CODE,
    INVALID,
    JOB_CLASS,
    JOB_ID,
    NAME,
    SECONDS,
    SHARE,
    TEXT,
    Bool,
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
class PredictionView(_Record):
    """What the scheduler predicts of a job: its run time (pending) or, ``remaining``, what is left of it (running),
    p50 and p90 in seconds, and what is behind it: the history key ``level`` (``cluster.predict.history.LEVELS``,
    ``progress``, or ``default``) and ``history`` (ended runs at that level; iterations done, for ``progress``)."""

    p50_s: float = _f(SECONDS)
    p90_s: float = _f(SECONDS)
    level: str = _f(NAME)
    history: int = _f(COUNT)
    remaining: bool = _f(Bool(), default=False)


@_record()
class JobView(_Record):
    job_id: str = _f(JOB_ID)
    name: str = _f(NAME)
    user: str = _f(NAME)
    queue: str = _f(NAME)
    priority: JobClass = _f(JOB_CLASS)
    state: JobState = _f(STATE)
    workers: int = _f(COUNT)
    gpus: int = _f(COUNT)
    submitted_at: float = _f(SECONDS)
    started_at: float | None = _f(Opt(SECONDS))
    ended_at: float | None = _f(Opt(SECONDS))
    reason: str = _f(TEXT)
    placement_id: str = _f(NAME)  # "" when none
    nodes: tuple = _f(ListOf(NAME))
    attempts: int = _f(COUNT)
    exit_code: int | None = _f(Opt(EXIT_CODE))
    # the latest progress a node reported for the job's lowest rank; its features only when one job was asked for
    progress: JobProgress | None = _f(Opt(Nested(JobProgress)), default=None)
    # its predicted run time (pending) or remaining time (running); None when nothing is known (or it ended)
    prediction: PredictionView | None = _f(Opt(Nested(PredictionView)), default=None, optional=True)
    # what the job left to its recommendation got (one line), and whether it runs as requested for want of history
    advice: str = _f(TEXT, default="", optional=True)
    learning: bool = _f(Bool(), default=False, optional=True)


@_record()
class GpuView(_Record):
    index: int = _f(COUNT)
    utilization: float = _f(SHARE)  # last 10 s, as the node reported it
    guaranteed: tuple = _f(ListOf(JOB_ID, 64))  # job ids holding a guaranteed share of this GPU
    opportunistic: tuple = _f(ListOf(JOB_ID, 64))  # job ids running opportunistically on it


@_record()
class NodeView(_Record):
    node_id: str = _f(NAME)
    host: str = _f(NAME)
    up: bool = _f(Bool())
    gpu_model: str = _f(NAME)
    gpus: int = _f(COUNT)
    gpus_allocated: int = _f(COUNT)  # GPUs holding a guaranteed worker
    gpus_shared: int = _f(COUNT)  # GPUs holding an opportunistic worker
    utilization: float = _f(SHARE)  # mean over the node's GPUs, last 10 s
    workers: int = _f(COUNT)
    gpu_views: tuple = _f(ListOf(Nested(GpuView), 64), default=())
    switch: str = _f(NAME, default="", optional=True)  # network labels the scheduler places by ("": none)
    rack: str = _f(NAME, default="", optional=True)


@_record()
class LogRef(_Record):
    """One worker's log, as its node read it: the end of the file (``truncated`` when earlier output
    was left out), or ``error`` (the node is down, did not answer, or has no such log)."""

    rank: int = _f(COUNT)
    node_id: str = _f(NAME)
    path: str = _f(TEXT, default="")  # unused: the scheduler sends no paths (kept for the wire)
    text: str = _f(LOG_TEXT, default="")
    truncated: bool = _f(Bool(), default=False)
    error: str = _f(TEXT, default="")



# ---------------------------------------------------------------- client <-> scheduler


@_record("submit")
class Submit(Message):
    """``request_id``: minted by the client once per submission and repeated by its retries; the
    scheduler creates one job per (user, request id) and answers a repeat with that job's id. ""
    (none): every Submit is a new job."""

    request: JobRequest = _f(Nested(JobRequest))
    request_id: str = _f(NAME, default="")


@_record("submitted")
class Submitted(Message):
    job_id: str = _f(JOB_ID)


@_record("jobs_request")
class JobsRequest(Message):
    job_id: str | None = _f(Opt(JOB_ID), default=None)  # one job, or all
    active_only: bool = _f(Bool(), default=False)  # pending, placing and running only
    offset: int = _f(COUNT, default=0)
    limit: int = _f(Num(int, 1, MAX_PAGE), default=MAX_PAGE)


@_record("jobs_reply")
class JobsReply(Message):
    jobs: tuple = _f(ListOf(Nested(JobView), MAX_PAGE))
    total: int = _f(COUNT)  # jobs matching the request (all pages)
    queued: tuple = _f(MapOf(NAME, COUNT), default=())  # queue -> pending jobs


@_record("nodes_request")
class NodesRequest(Message):
    pass


@_record("nodes_reply")
class NodesReply(Message):
    nodes: tuple = _f(ListOf(Nested(NodeView)))
    scheduler_epoch: int = _f(COUNT)


@_record("cancel")
class Cancel(Message):
    job_id: str = _f(JOB_ID)


@_record("ok")
class Ok(Message):
    message: str = _f(TEXT)


@_record("logs_request")
class LogsRequest(Message):
    job_id: str = _f(JOB_ID)
    rank: int | None = _f(Opt(COUNT), default=None)


@_record("logs_reply")
class LogsReply(Message):
    job_id: str = _f(JOB_ID)
    logs: tuple = _f(ListOf(Nested(LogRef)))


@_record()
class FigureView(_Record):
    """One recommended figure: ``value`` (bytes for gpu_mem, a share, a GPU count, or the predicted seconds per
    iteration on the type ``label`` for gpu_type, 0 when no run reported one), the history ``level`` behind it and
    how many ended runs (``history``)."""

    value: float = _f(SECONDS)
    level: str = _f(NAME)
    history: int = _f(COUNT)
    label: str = _f(NAME, default="")


@_record()
class RecommendationView(_Record):
    """What the scheduler recommends for a job (``cluster.predict.recommend``): the job's fingerprints and what
    stood for its script (``identity``: content, module, code, path, program), each figure or, in ``why_not``,
    why it has none."""

    exact: str = _f(NAME)
    family: str = _f(NAME)
    identity: str = _f(NAME)
    gpu_mem: FigureView | None = _f(Opt(Nested(FigureView)), default=None)
    sm_share: FigureView | None = _f(Opt(Nested(FigureView)), default=None)
    gpus: FigureView | None = _f(Opt(Nested(FigureView)), default=None)
    gpu_type: FigureView | None = _f(Opt(Nested(FigureView)), default=None)
    run_time: PredictionView | None = _f(Opt(Nested(PredictionView)), default=None)
    why_not: tuple = _f(MapOf(Str(choices=FIGURES), TEXT, len(FIGURES)), default=())


@_record("recommend_request")
class RecommendRequest(Message):
    """A recommendation for job ``job_id`` (as it was submitted), or for a command not submitted (``command``,
    fingerprinted as a submit would be: ``script_hash``, the user of the key, or without keys the ``user`` the
    client states, as ``JobRequest.user``), of ``workers`` x ``gpus``."""

    job_id: str | None = _f(Opt(JOB_ID), default=None)
    command: tuple = _f(ListOf(TEXT, 256), default=())
    script_hash: str = _f(Str(64), default="")
    workers: int = _f(Num(int, 1, MAX_WORKERS), default=1)
    gpus: int = _f(Num(int, 0, 64), default=1)
    user: str = _f(NAME, default="", optional=True)

    def _check(self) -> None:
        _check_hash("RecommendRequest", self.script_hash)
        if (self.job_id is None) == (not self.command):
            raise ProtocolError(INVALID, "RecommendRequest: give a job id or a command, one of them")


@_record("recommend_reply")
class RecommendReply(Message):
    recommendation: RecommendationView = _f(Nested(RecommendationView))


CLIENT_TO_SCHEDULER = (Submit, JobsRequest, NodesRequest, Cancel, LogsRequest, RecommendRequest)
SCHEDULER_TO_CLIENT = (Submitted, JobsReply, NodesReply, Ok, LogsReply, RecommendReply)
