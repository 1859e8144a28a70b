"""The scheduling framework: the cycle that runs the plugins' extension points (``cluster.points``:
the points, the closed status set, the ``Plugin`` base, the registry and the ``Handle`` a plugin sees of
the framework; plugins import that module, never this one).

Modelled on the Kubernetes scheduling framework and Volcano's Statement: the framework collects, per
point and per placement class (``serves``), the bound methods of the plugins that override it, in
config order, and places a job whole in a tentative statement, committed or discarded.

Preemption: victims a post-filter names keep their slots until the core releases them; the
job they make room for is "nominated" meanwhile (no new victims for it), and in the first cycle
after its last victim is released it is tried before every queue.

Cost per job is independent of cluster size and queue length: candidates come from indexes,
filtering stops after ``feasible_nodes`` feasible nodes (or ``max_nodes_examined`` candidates),
a shape that failed pre-filter/filter in a queue this cycle is not tried again there, and a
blocked queue stops (or examines at most the budget ``on_blocked`` returned).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any

from cluster.capacity import never_fits
from cluster.framework_lifecycle import Lifecycle
from cluster.jobs import Job, Request
from cluster.points import (
    CLASSES,
    PER_CLASS,
    POINTS,
    SUCCESS,
    Action,
    Code,
    Plugin,
    Preempt,
    Status,
    _raiser,
    check_plugins,
    error,
    fails_job,
)
from cluster.selection import Selector
from cluster.spec import Placement
from cluster.state import ClusterState
from cluster.statement import Statement
from colocate.base.vocab import JobState


@dataclass(slots=True)
class Cycle:
    """What one cycle decided, for the core to act on."""

    placed: list = field(default_factory=list)  # [(job, placement)]: slots held, out of the queue
    failed: list = field(default_factory=list)  # [(job, FAILS_JOB status)]: out of the queue, to fail
    actions: list[Action] = field(default_factory=list)
    aside: list = field(default_factory=list)  # [(job, UNPLACEABLE status)]: newly set aside, still pending
    returned: list = field(default_factory=list)  # [job]: set-aside jobs back in their queues
    errors: list = field(default_factory=list)  # [(job, ERROR status)]: passed over this cycle, still queued


_key = attrgetter("key")


class Framework(Lifecycle):
    """Runs the cycle over the plugins. Owned by ``SchedulerCore``, which keeps ``jobs``,
    ``holders`` (placement id -> job, for every placement still holding resources) and feeds
    the lifecycle notices (``cluster.framework_lifecycle``, a base class); plugins read those and ``state``."""

    def __init__(self, plugins: list[Plugin], sched: dict[str, Any], state: ClusterState, rng) -> None:
        self.state = state
        self.rng = rng
        self.plugins = plugins
        self.by_name = {p.name: p for p in plugins}
        self.feasible_nodes = sched["feasible_nodes"]
        self.max_examined = sched["max_nodes_examined"]
        self.refuse_unplaceable = sched.get("refuse_unplaceable", True)
        self.jobs: dict[str, Job] = {}
        self.holders: dict[str, Job] = {}
        self.stopping: dict[str, Any] = {}  # placement id -> stop record, kept by the core
        self.queues: dict[str, list[Job]] = {}
        self.nominated: dict[str, set[str]] = {}  # job id -> victim placement ids still stopping
        self.victim_of: dict[str, str] = {}
        # job id -> nodes its preemption plan uses ("nominated nodes", as in Kubernetes): until its claim is
        # served, no new opportunistic worker goes there, or it would take the capacity being freed and the
        # claim would fail and preempt again, without end
        self.reserved: dict[str, tuple[str, ...]] = {}
        self.reserved_nodes: dict[str, int] = {}  # node id -> plans that reserve it
        self.blocked: dict[str, tuple[str, Status]] = {}  # queue -> (job id, why), last cycle
        self.now = 0.0
        self.cycles = 0
        self.attempts = 0
        self._req = Request()
        self._stmt = Statement(state)
        self._claims: list[str] = []  # jobs whose victims are all gone, tried first next cycle
        self._reserving = False  # the current attempt reached its reserve point
        self.aside: dict[str, tuple[Job, Status]] = {}  # job id -> (job, UNPLACEABLE why): out of its queue
        self._aside_version = -1  # the known nodes' version when the set-aside jobs were last judged
        self._never: dict[tuple, str | None] = {}  # never_fits per (class, request shape), ...
        self._never_version = -1  # ... for this version of the known nodes
        check_plugins([type(p) for p in plugins])
        for p in plugins:
            p.bind(self)
        sorter = next(p for p in plugins if p.implements("queue_of"))
        self.queue_of = sorter.queue_of
        self.sort_key = sorter.sort_key
        self.pt: dict[str, Any] = {}
        for point in POINTS:
            impl = [p for p in plugins if p.implements(point)]
            if point in PER_CLASS:
                self.pt[point] = {k: [getattr(p, point) for p in impl if k in p.serves] for k in CLASSES}
            else:
                self.pt[point] = [getattr(p, point) for p in impl]
        scorers: dict[str, list[tuple[Callable, float]]] = {
            k: [(score, score.__self__.p.get("weight", 1)) for score in self.pt["score"][k]]
            for k in CLASSES}  # (bound score method, its plugin's weight)
        self._order = {k: (v[0] if v else None) for k, v in self.pt["node_order"].items()}
        # a class with a node order has its one GPU pick (checked when the config loads), and its selector
        self._selectors: dict[str, Selector] = {}
        for k, order in self._order.items():
            if order is None or not self.pt["pick_gpus"][k]:
                continue
            # the order plugin's ``order_ranked`` when that plugin is the class's only scorer: where it says yes,
            # ranking the feasible nodes would keep their order, so the first feasible node the pick takes wins
            owner: Plugin | None = getattr(order, "__self__", None)
            only = len(scorers[k]) == 1 and getattr(scorers[k][0][0], "__self__", None) is owner
            ranked = owner.order_ranked if owner is not None and only else None
            self._selectors[k] = Selector(self.pt["filter"][k], scorers[k], self.pt["pick_gpus"][k][0],
                                          self.feasible_nodes, self.max_examined, ranked)
        self._queue_order = self.pt["queue_order"][0] if self.pt["queue_order"] else None
        self.wakers = [p.wake_at for p in plugins if p.implements("wake_at")]  # plugins whose holds lapse in time
        self._cache_keys = self.pt["cache_key"]

    def plugin(self, name: str) -> Plugin | None:
        return self.by_name.get(name)

    def node_order_for(self, klass: str):
        """The node_order point serving ``klass`` (None when no plugin places that class)."""
        return self._order.get(klass)

    def places(self, klass: str) -> bool:
        """Whether some plugin places workers of this class."""
        return self._order.get(klass) is not None

    # ------------------------------------------------------------------ queues

    def enqueue(self, job: Job) -> None:
        """Put a pending job in its queue (``job.queue``), in sort-key order."""
        if not job.key:
            job.key = tuple(self.sort_key(job)) + (job.seq,)
        insort(self.queues.setdefault(job.queue, []), job, key=_key)

    def dequeue(self, job: Job) -> bool:
        """Take a pending job out of its queue, or out of the set-aside jobs; whether it was in either."""
        if self.aside.pop(job.job_id, None) is not None:
            return True
        lst = self.queues.get(job.queue)
        if not lst:
            return False
        i = bisect_left(lst, job.key, key=_key)
        if i < len(lst) and lst[i] is job:
            del lst[i]
            if not lst:
                del self.queues[job.queue]
            return True
        return False

    def pending(self) -> int:
        """Pending jobs: queued or set aside."""
        return sum(len(q) for q in self.queues.values()) + len(self.aside)

    # ------------------------------------------------------------------ cycle

    def idle(self) -> bool:
        """Whether a cycle now would decide nothing and change nothing but its counters: no job is pending
        (queued, set aside, or claiming the capacity its victims freed) and no plugin has a cycle hook."""
        return not (self.queues or self.aside or self._claims or self.pt["cycle_start"] or self.pt["cycle_end"])

    def skip_cycle(self, now: float) -> None:
        """Count a cycle that ``idle`` says would decide nothing, as if it ran (``blocked`` empties)."""
        self.now = now
        self.cycles += 1
        if self.blocked:
            self.blocked = {}

    def run_cycle(self, now: float) -> Cycle:
        """One scheduling cycle (see ``Cycle`` for what it returns). Placed slots are already held
        in the state; the caller moves the jobs' states and removes nothing from the queues (the
        cycle did). An exception leaves no statement open (module docstring: Exceptions)."""
        self.now = now
        self.cycles += 1
        out = Cycle()
        try:
            for f in self.pt["cycle_start"]:
                f(now)
            self.blocked = {}
            if self.aside and self._aside_version != self.state.shapes_version:
                self._return_aside(out)
            if self._claims:
                self._serve_claims(now, out)
            heads = sorted((lst[0].key, name) for name, lst in self.queues.items() if lst)
            for _, name in heads:
                self._walk(name, now, out)
            for f in self.pt["cycle_end"]:
                out.actions.extend(f(now) or ())
        except BaseException:
            if self._stmt.allocs:  # never reached while _schedule keeps its promise; a guard for the rest
                self._stmt.discard()
            raise
        return out

    # ------------------------------------------------------------------ set aside

    def never_fits(self, job: Job) -> str | None:
        """Why no node known to the cluster could ever hold ``job`` (``cluster.capacity``), or None.
        Cached per request shape until the known nodes change."""
        state = self.state
        if self._never_version != state.shapes_version:
            self._never.clear()
            self._never_version = state.shapes_version
        key = (job.spec.klass, job.rshape)
        if key in self._never:
            return self._never[key]
        why = self._never[key] = never_fits(state.shapes, job.spec, job.spec.klass)
        return why

    def _set_aside(self, job: Job, st: Status, out: Cycle) -> None:
        self.aside[job.job_id] = (job, st)
        self._aside_version = self.state.shapes_version
        out.aside.append((job, st))

    def _return_aside(self, out: Cycle) -> None:
        """The known nodes changed: jobs set aside that some node could now hold go back to their
        queues, at the place their sort key gives (arrival order among equals)."""
        self._aside_version = self.state.shapes_version
        back = [job for job, _ in self.aside.values() if self.never_fits(job) is None]
        for job in sorted(back, key=attrgetter("seq")):
            del self.aside[job.job_id]
            self.enqueue(job)
            out.returned.append(job)

    # ------------------------------------------------------------------ walking the queues

    def _serve_claims(self, now: float, out: Cycle) -> None:
        """Jobs whose preemption victims are all gone are tried first, so the capacity freed
        for them is not taken by a job ahead of them (their victims included)."""
        claims, self._claims = self._claims, []
        req = self._req
        for job_id in claims:
            self._unreserve(job_id)  # served now, placed or not: a failed claim may plan again later
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.PENDING or not self.dequeue(job):
                continue
            self.attempts += 1
            _, placement, _ = self._schedule(req.setup(job, job.spec.klass, now))
            if placement is not None:
                out.placed.append((job, placement))
            else:
                self.enqueue(job)

    def _walk(self, qname: str, now: float, out: Cycle) -> None:
        lst = self.queues[qname]
        tried: dict[tuple, Status] = {}
        removed: list[Job] = []
        budget = -1  # -1: no blocked head yet; else jobs left to examine
        req = self._req
        admit = self.pt["backfill_admit"]
        order = iter(lst if self._queue_order is None else self._queue_order(qname, lst))
        while (job := next(order, None)) is not None:  # a loop over ``order``, which a blocked head may reorder
            if budget >= 0:
                if budget == 0:
                    break
                budget -= 1
            klass = job.spec.klass
            ready = False  # req set up for this job (only where a point will read it: a cached shape skips it)
            if budget >= 0 and admit[klass]:
                req.setup(job, klass, now)
                ready = True
                st = self._first_failure(admit[klass], req)
                if st is not None:
                    continue
            shape: tuple = (klass, job.rshape)
            if self._cache_keys:
                shape += tuple(f(job) for f in self._cache_keys)
            st = tried.get(shape)
            if st is None:
                if not ready:
                    req.setup(job, klass, now)
                    ready = True
                self.attempts += 1
                st, placement, cacheable = self._schedule(req)
                if placement is not None:
                    out.placed.append((job, placement))
                    removed.append(job)
                    continue
                if st.code == Code.FAILS_JOB:
                    out.failed.append((job, st))
                    removed.append(job)
                    continue
                if st.code == Code.ERROR:  # passed over: a plugin's bug never blocks the queue
                    out.errors.append((job, st))
                    continue
                why = self.never_fits(job)
                if why is not None:
                    st = Status(Code.UNPLACEABLE, "framework", why)
                    cacheable = True
                if cacheable:
                    tried[shape] = st
            if st.code == Code.UNPLACEABLE:  # no known node could hold it: out of the queue, never blocking it
                self._set_aside(job, st, out)
                removed.append(job)
                continue
            if budget < 0:  # the queue's head is blocked
                if not ready:
                    req.setup(job, klass, now)
                self.blocked[qname] = (job.job_id, st)
                placement = self._post_filter(req, st, out.actions)
                if placement is not None:
                    out.placed.append((job, placement))
                    removed.append(job)
                    continue
                req.setup(job, klass, now)
                budget, order = self._behind_head(req, st, order)
                if budget <= 0:
                    break
        if removed:
            self._remove(qname, lst, removed)

    def _behind_head(self, req: Request, st: Status, order: Iterator[Job]) -> tuple[int, Iterator[Job]]:
        """For a blocked head (``req``, its status ``st``): how many later jobs may still be examined (the
        on_blocked plugins' largest budget), and the rest of ``order`` to examine them from: the next
        ``budget`` jobs in the first backfill_order plugin's order, else ``order`` itself."""
        budget = max((f(req, st) for f in self.pt["on_blocked"][req.klass]), default=0)
        reorder = self.pt["backfill_order"][req.klass]
        if budget > 0 and reorder:
            order = iter(reorder[0](req, list(islice(order, budget))))
        return budget, order

    def _remove(self, qname: str, lst: list[Job], removed: list[Job]) -> None:
        """Take the jobs a walk placed, failed or set aside out of queue ``qname`` (its list ``lst``)."""
        k = len(removed)
        if all(a is b for a, b in zip(removed, lst)):
            del lst[:k]
        else:
            gone = set(map(id, removed))
            lst[:] = [j for j in lst if id(j) not in gone]
        if not lst:
            del self.queues[qname]

    def pre_enqueue(self, job: Job) -> Status | None:
        """Why ``job`` is refused at submit (FAILS_JOB), else None: the first pre-enqueue plugin's
        refusal, else, with ``scheduler.refuse_unplaceable``, a request no known node could ever hold
        (``never_fits``; with no node known yet it cannot be judged and is accepted)."""
        st = self._first_failure(self.pt["pre_enqueue"], job)
        if st is None and self.refuse_unplaceable:
            why = self.never_fits(job)
            if why is not None:
                st = fails_job("framework", why)
        return st

    @staticmethod
    def _first_failure(fns: list, *args) -> Status | None:
        for f in fns:
            st = f(*args)
            if st is not SUCCESS and st.code != Code.SUCCESS:
                return st
        return None

    def _schedule(self, req: Request) -> tuple[Status, Placement | None, bool]:
        """Place every worker of ``req`` or none. Returns (status, placement, cacheable). A plugin
        that raises (an unreserve included) gives an ERROR status naming it, with the statement
        discarded and, once reserve was reached, every reserve plugin's unreserve run once; a
        BaseException (or an unreserve raising while a raising attempt is undone) propagates with
        no statement open."""
        stmt = self._stmt
        self._reserving = False
        try:
            return self._attempt(req)
        except Exception as exc:
            st = error(_raiser(exc), exc)
            if self._reserving:  # reserve was called: every reserve plugin's unreserve runs, as for a refusal
                self._undo(req, stmt, st)
            return st, None, False
        finally:
            if stmt.allocs:
                stmt.discard()

    def _attempt(self, req: Request) -> tuple[Status, Placement | None, bool]:
        klass = req.klass
        first = None
        for f in self.pt["pre_filter"][klass]:
            st = f(req)
            if st is not SUCCESS and st.code != Code.SUCCESS:
                if st.code == Code.FAILS_JOB:
                    return st, None, True
                first = first or st
        if first is not None:
            return first, None, True
        order = self._order[klass]
        if order is None:
            return fails_job("framework", f"no plugin places {klass} jobs"), None, True
        stmt = self._stmt.begin(req.pid, klass)
        select = self._selectors[klass].select
        now = req.now
        for rank in range(req.workers):
            req.rank = rank
            req.remaining = req.workers - rank
            got = select(req, order)
            if got.__class__ is Status:
                stmt.discard()
                return got, None, True
            node, gpus = got  # type: ignore[misc]  # not a Status (the class test above is the hot path's)
            stmt.allocate(rank, node, gpus, req.milli, req.mem, req.cpu, req.host_mem, now)
            req.gang_nodes[node] = None
        self._reserving = True
        for f in self.pt["reserve"][klass]:
            st = f(req, stmt)
            if st is not SUCCESS and st.code != Code.SUCCESS:
                return self._undo(req, stmt, st), None, False
        st = self._first_failure(self.pt["permit"][klass], req, stmt)
        if st is not None:
            return self._undo(req, stmt, st), None, False
        return SUCCESS, stmt.commit(req.job.job_id), False

    def _undo(self, req: Request, stmt: Statement, st: Status) -> Status:
        self._reserving = False  # unreserve runs once per attempt, even if it raises
        try:
            for f in reversed(self.pt["unreserve"][req.klass]):
                f(req, stmt)
        finally:
            stmt.discard()
        return st

    def _post_filter(self, req: Request, st: Status, actions: list[Action]) -> Placement | None:
        job = req.job
        if st.held or self.nominated.get(job.job_id):
            return None  # held by policy, or victims chosen earlier are still stopping
        for f in self.pt["post_filter"][req.klass]:
            res = f(req, st)
            if res is None or res.status.code != Code.SUCCESS:
                continue
            if res.retry_as:
                if not self.places(res.retry_as):
                    continue
                req.setup(job, res.retry_as, req.now)
                st2, placement, _ = self._schedule(req)
                if placement is not None:
                    return placement
                continue
            if res.victims:
                self.nominated[job.job_id] = set(res.victims)
                self._reserve(job.job_id, res.nodes)
                for v in res.victims:
                    self.victim_of[v] = job.job_id
                    actions.append(Preempt(v, res.reason, job.job_id))
                return None
        return None

    def _reserve(self, job_id: str, nodes: tuple[str, ...]) -> None:
        self._unreserve(job_id)
        if nodes:
            self.reserved[job_id] = nodes
            for n in nodes:
                self.reserved_nodes[n] = self.reserved_nodes.get(n, 0) + 1

    def _unreserve(self, job_id: str) -> None:
        for n in self.reserved.pop(job_id, ()):
            left = self.reserved_nodes[n] - 1
            if left:
                self.reserved_nodes[n] = left
            else:
                del self.reserved_nodes[n]
