"""What a policy plugin sees: the extension points, the closed status set, the ``Plugin`` base and the
registry. ``cluster.framework`` runs the cycle over them.

Modelled on the Kubernetes scheduling framework (queue sort, pre-filter, filter, score,
reserve/unreserve, permit, post-filter) and Volcano's Statement. A plugin subclasses ``Plugin``
and overrides only the points it needs; the framework collects, per point and per placement
class (``serves``), the bound methods of the plugins that override it, in config order.

Points (``req`` is the reused ``cluster.jobs.Request`` of the attempt):
  pre_enqueue(job) -> Status           at submit; FAILS_JOB rejects the job (unknown queue)
  queue_of(spec) -> str                queue-sort point, exactly one plugin: the job's queue
  sort_key(job) -> tuple               ... and its order there (the framework appends job.seq)
  queue_order(queue, jobs) -> iterable this cycle's order of examination of one queue's pending
                                       jobs (``jobs`` in sort-key order, read-only); the first
                                       plugin implementing it, else the sort-key order. It must
                                       yield only jobs of ``jobs``, each at most once; jobs it
                                       leaves out are not examined this cycle. Blocking rules
                                       (on_blocked, backfill) apply in the order it gives. For
                                       policies that choose the next job per cycle (a plan made
                                       in cycle_start, e.g. the genetic placement), since the
                                       sort key is fixed when a job is queued
  cycle_start(now)                     once per cycle before any job (plan, reset caches)
  pre_filter(req) -> Status            whole-job checks; must depend only on the request's
                                       shape, queue, the state and the plugins' cache_key
                                       (failures are cached per cycle); every one runs, an
                                       FAILS_JOB wins
  cache_key(job) -> tuple              what else a plugin's pre_filter/filter read of the job
                                       (e.g. its tenant): part of the failure cache's key
  node_order(req) -> iterable          candidate nodes in the plugin's preferred order, from
                                       the state's indexes; exactly one plugin per class placed
  filter(req, node) -> Status          per candidate node (same caching rule as pre_filter)
  score(req, node) -> number           higher is better; the framework maps each plugin's scores
                                       over the feasible nodes onto 0..MAX_NODE_SCORE (min-max),
                                       then weights them by the plugin's ``weight``, so weights of
                                       different plugins compare
  pick_gpus(req, node) -> tuple|None   which GPUs on the chosen node; exactly one plugin per
                                       class placed (``check_plugins``, at config load)
  reserve(req, stmt) -> Status / unreserve(req, stmt)   after every worker is placed
  permit(req, stmt) -> Status          last word before commit (gang: all ranks placed)
  post_filter(req, status) -> PostFilterResult|None     for a queue's blocked head: victims
                                       to stop (preemption, quota reclaim) or a retry class
  on_blocked(req, status) -> int       a queue's head is blocked: how many later jobs of the
                                       queue may still be examined (0: the queue waits)
  backfill_order(req, jobs) -> list   the jobs behind a blocked head that may still be examined
                                       (``jobs``: the next ``on_blocked`` budget of them, in queue
                                       order), in the order to examine them; the first plugin of
                                       the head's class implementing it, else queue order. It must
                                       return a permutation of ``jobs`` (e.g. shortest predicted
                                       first, EASY++'s SJBF)
  backfill_admit(req) -> Status        for a job behind a blocked head: may it start without
                                       delaying the head's reservation
  cycle_end(now) -> iterable[action]   after every queue (promotion upgrades)
  on_placed/on_running/on_released/on_ended/on_promoted   lifecycle notices from the core
  on_progress(job, progress, now) -> bool   a running job's progress (``cluster.events.JobProgressed``);
                                       True when it moved an estimate a later cycle may act on
  on_history(records)                  what ended jobs taught (``HistoryRecord``s, oldest first), once, on a
                                       fresh core before its jobs are restored (a restart forgets nothing)
Every status is one of ``Code``: SUCCESS, UNSCHEDULABLE (not now, for want of capacity), HELD
(not now, by policy), UNPLACEABLE (no known node could ever hold it: the framework sets the job
aside, out of its queue, until the known nodes change and one could), FAILS_JOB (never: the
job fails), ERROR (a plugin raised inside the attempt: the attempt is undone, the job is passed
over this cycle without blocking its queue, and the status says which plugin and what).


Exceptions: a plugin that raises in an attempt's points (pre_filter through permit) becomes an
ERROR status; the open statement is discarded and the reserve plugins' unreserve run, so the
state is exactly as before the attempt. An exception anywhere else in a cycle (cycle_start,
queue_order, post_filter, on_blocked, backfill_order, backfill_admit, cycle_end; a BaseException anywhere)
propagates to the caller with no statement open; the caller must then rebuild the core from its
journal (its plugins' memory may be half-updated).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.spec import JobSpec, Placement
from cluster.state import ClusterState, NodeState
from cluster.statement import Statement
from colocate.base.frozen import quick_init
from colocate.base.vocab import JobClass

CLASSES = frozenset((JobClass.GUARANTEED, JobClass.OPPORTUNISTIC))


class Code(enum.IntEnum):
    """The closed set of outcomes a plugin point (or the framework) gives for one job's attempt."""

    SUCCESS = 0
    UNSCHEDULABLE = 1  # not now, for want of capacity: retry later; post-filter remedies may act
    FAILS_JOB = 2  # never under this policy: the job fails
    HELD = 3  # not now, by a policy's hold (not for want of capacity): no post-filter acts on it
    UNPLACEABLE = 4  # no node known to the cluster could ever hold it: set aside until one joins
    ERROR = 5  # a plugin raised: the attempt is undone, the job stays pending and is passed over


MAX_NODE_SCORE = 100  # every score plugin's scores are normalized to 0..MAX_NODE_SCORE before weighting


@quick_init
@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    plugin: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    @property
    def held(self) -> bool:
        """Not now by policy, or by a plugin's error: no remedy for want of capacity acts on it."""
        return self.code == Code.HELD or self.code == Code.ERROR

    def __str__(self) -> str:
        return f"{self.plugin}: {self.reason}" if self.plugin else self.reason or self.code.name.lower()


SUCCESS = Status(Code.SUCCESS)


def unschedulable(plugin: str, reason: str) -> Status:
    return Status(Code.UNSCHEDULABLE, plugin, reason)


def fails_job(plugin: str, reason: str) -> Status:
    return Status(Code.FAILS_JOB, plugin, reason)


def held(plugin: str, reason: str) -> Status:
    """Not now, by policy (e.g. the queues wait for a starving job): preemption and other post-filter
    remedies for want of capacity must not act for a job held so."""
    return Status(Code.HELD, plugin, reason)


def error(plugin: str, exc: BaseException) -> Status:
    """A plugin's internal error as a status: one line naming the plugin and the exception."""
    text = " ".join(str(exc).split())[:200]
    return Status(Code.ERROR, plugin, f"internal error: {type(exc).__name__}" + (f": {text}" if text else ""))


class PluginError(ValueError):
    """A plugin broke the framework's contract (e.g. a score that is not a finite number)."""

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(message)
        self.plugin = plugin


@dataclass(slots=True)
class PostFilterResult:
    status: Status
    victims: tuple[str, ...] = ()  # placement ids to stop so the job fits later
    nodes: tuple[str, ...] = ()  # the nodes the job is planned on: held from opportunistic work meanwhile
    reason: str = "preempted"
    retry_as: str | None = None  # try the job again at once in this class


@quick_init
@dataclass(frozen=True, slots=True)
class Preempt:
    """Action: stop placement ``pid`` and requeue its job (``by`` is the job it makes room for)."""

    pid: str
    reason: str
    by: str


@quick_init
@dataclass(frozen=True, slots=True)
class Upgrade:
    """Action: run opportunistic placement ``pid`` on as guaranteed (AntMan promotion)."""

    pid: str


Action = Preempt | Upgrade  # what a cycle asks the core to do beside placing (``Cycle.actions``): a closed union


POINTS = ("pre_enqueue", "queue_of", "sort_key", "queue_order", "cycle_start", "pre_filter", "cache_key",
          "node_order", "filter", "score", "pick_gpus", "reserve", "unreserve", "permit", "post_filter", "on_blocked",
          "backfill_order", "backfill_admit", "cycle_end", "on_placed", "on_running", "on_released", "on_ended",
          "on_promoted", "on_progress", "on_history")
PER_CLASS = ("pre_filter", "node_order", "filter", "score", "pick_gpus", "reserve", "unreserve",
             "permit", "post_filter", "on_blocked", "backfill_order", "backfill_admit")

REGISTRY: dict[str, type[Plugin]] = {}


def check_plugins(classes: list[type[Plugin]]) -> None:
    """The framework's closed shape, checked when a config loads: exactly one queue-sort plugin, and
    per placement class either exactly one node-order and one GPU-pick plugin (the class is placed)
    or neither (jobs of that class are refused at submit; guaranteed jobs must be placed). Raises
    ValueError with one line naming the class and the plugins."""
    def impl(point: str, klass: str | None = None) -> list[str]:
        return [c.name for c in classes if getattr(c, point) is not getattr(Plugin, point)
                and (klass is None or klass in c.serves)]

    sorters = impl("queue_of")
    if len(sorters) != 1:
        raise ValueError(f"plugins: exactly one queue-sort plugin (fifo or multi_queue) is needed, "
                         f"got {', '.join(sorters) or 'none'}")
    for klass in sorted(CLASSES):
        orders, picks = impl("node_order", klass), impl("pick_gpus", klass)
        if not orders and not picks and klass != JobClass.GUARANTEED:
            continue
        for point, got in (("node-order", orders), ("GPU-pick", picks)):
            if len(got) != 1:
                known = ", ".join(sorted(c.name for c in REGISTRY.values() if klass in c.serves
                                         and c.node_order is not Plugin.node_order))
                raise ValueError(f"plugins: {klass} jobs need exactly one {point} plugin (one of {known}), "
                                 f"got {', '.join(got) or 'none'}")


def register(cls: type[Plugin]) -> type[Plugin]:
    """Class decorator: make a plugin selectable by its ``name`` in the config."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"plugin name {cls.name!r} empty or taken")
    REGISTRY[cls.name] = cls
    return cls


class Handle(Protocol):
    """What a plugin sees of the framework that runs it (``cluster.framework.Framework`` is one): read it,
    never rebind it; the cluster's state is changed only through a point's ``Statement``."""

    @property
    def state(self) -> ClusterState: ...

    @property
    def rng(self) -> random.Random: ...  # the scheduler's injected randomness

    @property
    def jobs(self) -> Mapping[str, Job]: ...  # job id -> job, every job known

    @property
    def queues(self) -> Mapping[str, list[Job]]: ...  # queue -> its pending jobs

    @property
    def blocked(self) -> Mapping[str, tuple[str, Status]]: ...  # queue -> (blocked head's job id, why), last cycle

    @property
    def reserved_nodes(self) -> Mapping[str, int]: ...  # node id -> plans that reserve it

    @property
    def stopping(self) -> Mapping[str, Any]: ...  # placement id -> its stop, while its workers stop

    def plugin(self, name: str) -> Plugin | None: ...  # the configured plugin of that name

    def node_order_for(self, klass: str) -> Callable[[Request], Iterable[NodeState]] | None: ...


class Plugin:
    """Base of every policy plugin. Subclasses set ``name``, ``PARAMS`` and ``serves``, and
    override points (see the module docstring). ``self.fw`` is the framework's ``Handle``, set by ``bind``;
    ``self.p`` the validated parameters. Plugins hold no clock and no global random: time is
    ``req.now``/``now``, randomness ``self.fw.rng``."""

    name: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}
    serves: ClassVar[frozenset[str]] = CLASSES  # placement classes the per-class points apply to

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.fw: Handle = None  # type: ignore[assignment]

    def bind(self, fw: Handle) -> None:
        self.fw = fw

    # extension points: the base versions are never called (the framework skips them)
    def pre_enqueue(self, job: Job) -> Status: return SUCCESS
    def queue_of(self, spec: JobSpec) -> str: return "default"
    def sort_key(self, job: Job) -> tuple: return ()
    def queue_order(self, queue: str, jobs: list[Job]) -> Iterable[Job]: return jobs
    def cycle_start(self, now: float) -> None: return None
    def pre_filter(self, req: Request) -> Status: return SUCCESS
    def cache_key(self, job: Job) -> tuple: return ()
    def node_order(self, req: Request) -> Iterable[NodeState]: return ()
    def filter(self, req: Request, node: NodeState) -> Status: return SUCCESS
    def score(self, req: Request, node: NodeState) -> float: return 0.0
    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None: return None
    def reserve(self, req: Request, stmt: Statement) -> Status: return SUCCESS
    def unreserve(self, req: Request, stmt: Statement) -> None: return None
    def permit(self, req: Request, stmt: Statement) -> Status: return SUCCESS
    def post_filter(self, req: Request, status: Status) -> PostFilterResult | None: return None
    def on_blocked(self, req: Request, status: Status) -> int: return 0
    def backfill_order(self, req: Request, jobs: list[Job]) -> list[Job]: return jobs
    def backfill_admit(self, req: Request) -> Status: return SUCCESS
    def cycle_end(self, now: float) -> Iterable[Preempt | Upgrade]: return ()
    def on_placed(self, job: Job, placement: Placement, now: float) -> None: return None
    def on_running(self, job: Job, now: float) -> None: return None
    def on_released(self, job: Job, placement: Placement, now: float) -> None: return None
    def on_ended(self, job: Job, now: float) -> None: return None
    def on_promoted(self, job: Job, placement: Placement, now: float) -> None: return None
    def on_progress(self, job: Job, progress: Any, now: float) -> bool: return False
    def on_history(self, records: list) -> None: return None

    # a hint, not a point: whether ``node_order(req)`` yields nodes in non-increasing order of this plugin's
    # ``score(req, node)``. Where this plugin is the class's only scorer and says yes, the framework skips the
    # ranking (it would keep the order) and takes the first feasible node the GPU pick accepts
    def order_ranked(self, req: Request) -> bool: return False

    # a hint, not a point: when the earliest hold this plugin has set lapses (None: it holds nothing), i.e. when it
    # may decide with no event what it could not before. ``SchedulerCore.timers_due`` is true from then on, and an
    # owner that sends ticks only when they can matter (the simulator) sends one then
    def wake_at(self) -> float | None: return None

    def implements(self, point: str) -> bool:
        return getattr(type(self), point) is not getattr(Plugin, point)


def _raiser(exc: BaseException) -> str:
    """The plugin at fault: the one a ``PluginError`` names, else the innermost plugin whose method is
    on ``exc``'s traceback ("framework" if none)."""
    name = getattr(exc, "plugin", None) or "framework"
    if isinstance(exc, PluginError):
        return name
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, Plugin):
            name = owner.name
        tb = tb.tb_next
    return name
