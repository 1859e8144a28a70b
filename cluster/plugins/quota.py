"""``quota``: per-tenant GPU quotas (tenant = ``spec.queue``, or ``spec.user`` with
``tenant = "user"``), in GPUs, from ``quotas``; tenants not listed get ``default_quota`` or, when
it is -1, are rejected at submit. Usage counts guaranteed placements (milli) from their reserve (in the
cycle) until every slot is released. A job starts within its tenant's quota, or beyond it by borrowing idle
quota (``borrow``: others' unused quota and the GPUs no quota covers) while the total usage stays within the total
quota or, where the quotas cover fewer GPUs than the cluster has, within the cluster. When a job
within its own quota is blocked, ``reclaim`` preempts placements of tenants over their quota,
youngest first, until the GPUs they hold plus the free ones cover the job (counted in GPUs, not
by topology); a tenant is not reclaimed below its quota by more than one placement. Until the
reclaiming job is placed (or ends) nobody borrows, so the capacity it waits for stays free."""

from __future__ import annotations

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.points import SUCCESS, Code, Plugin, PostFilterResult, Status, fails_job, register, unschedulable
from cluster.spec import MILLI, JobSpec, Placement
from cluster.statement import Statement
from colocate.base.vocab import JobClass


@register
class Quota(Plugin):
    name = "quota"
    serves = frozenset((JobClass.GUARANTEED,))
    PARAMS = {
        "quotas": Param({}, "dict[str,int]", lambda d: all(v >= 0 for v in d.values()), "GPUs >= 0 per tenant"),
        "tenant": Param("queue", "str", choices=("queue", "user")),
        "default_quota": Param(-1, "int", lambda v: v >= -1, "GPUs for unlisted tenants, -1: reject them"),
        "borrow": Param(True, "bool"),
        "reclaim": Param(True, "bool"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self.quota: dict[str, int] = {t: g * MILLI for t, g in params["quotas"].items()}
        self.used: dict[str, int] = dict.fromkeys(self.quota, 0)
        self.total_quota = sum(self.quota.values())
        self.total_used = 0
        self._held: dict[str, tuple[str, int, float]] = {}  # pid -> (tenant, milli, start)
        self._by_tenant: dict[str, dict[str, None]] = {}  # tenant -> pids, oldest first
        self._reclaiming: dict[str, None] = {}  # jobs that preempted borrowers, until placed/ended

    def tenant(self, spec: JobSpec) -> str:
        return spec.user if self.p["tenant"] == "user" else spec.queue

    def _known(self, t: str) -> bool:
        if t in self.quota:
            return True
        d = self.p["default_quota"]
        if d < 0:
            return False
        self.quota[t] = d * MILLI
        self.used[t] = 0
        self.total_quota += d * MILLI
        return True

    def pre_enqueue(self, job: Job) -> Status:
        t = self.tenant(job.spec)
        if not self._known(t):
            known = ", ".join(sorted(self.quota)) or "none"
            return fails_job(self.name, f"unknown {self.p['tenant']} {t!r} (quotas for: {known})")
        need = job.spec.total_milli
        if not self.p["borrow"] and job.spec.klass == JobClass.GUARANTEED and need > self.quota[t]:
            return fails_job(self.name, f"needs {need / MILLI:g} GPUs, quota of {t!r} is {self.quota[t] / MILLI:g}")
        return SUCCESS

    def cache_key(self, job: Job) -> tuple:
        return (self.tenant(job.spec),)  # the pre-filter reads the tenant, not only the shape

    def pre_filter(self, req: Request) -> Status:
        t = self.tenant(req.spec)
        if not self._known(t):
            return fails_job(self.name, f"unknown {self.p['tenant']} {t!r}")
        need = req.spec.total_milli
        if self.used[t] + need <= self.quota[t]:
            return SUCCESS
        if self.p["borrow"]:
            if self._reclaiming:
                return unschedulable(self.name, f"{t!r} at its quota; no borrowing while a queue reclaims")
            if self.total_used + need <= self._borrowable():
                return SUCCESS
            return unschedulable(self.name, f"{t!r} over its quota and no idle quota to borrow")
        if need > self.quota[t]:
            return fails_job(self.name, f"needs {need / MILLI:g} GPUs, quota of {t!r} is {self.quota[t] / MILLI:g}")
        return unschedulable(self.name, f"{t!r} at its quota")

    def _borrowable(self) -> int:
        """What the tenants may use together when borrowing, in milli-GPUs: the total quota, or the cluster's GPUs
        where the quotas cover fewer (the GPUs no quota covers are idle quota too: without them a lone tenant,
        or a trace without users, could never use more than its quota on an empty cluster, and a job above it
        waited for ever)."""
        return max(self.total_quota, self.fw.state.capacity() * MILLI)

    def _add(self, job: Job, pid: str, now: float) -> None:
        if pid in self._held:
            return
        t = self.tenant(job.spec)
        self._known(t)
        m = job.spec.total_milli
        self._held[pid] = (t, m, now)
        self._by_tenant.setdefault(t, {})[pid] = None
        self.used[t] += m
        self.total_used += m

    def reserve(self, req: Request, stmt: Statement) -> Status:
        self._add(req.job, req.pid, req.now)  # counted at once: later jobs of this cycle see it
        self._reclaiming.pop(req.job.job_id, None)
        return SUCCESS

    def on_ended(self, job: Job, now: float) -> None:
        self._reclaiming.pop(job.job_id, None)

    def unreserve(self, req: Request, stmt: Statement) -> None:
        self._remove(req.pid)

    def on_placed(self, job: Job, placement: Placement, now: float) -> None:
        if placement.klass == JobClass.GUARANTEED:  # a placement restored after a restart (a new one was counted
            self._add(job, placement.placement_id, now)  # at its reserve: _add counts a placement once)

    def on_promoted(self, job: Job, placement: Placement, now: float) -> None:
        self._add(job, placement.placement_id, now)

    def on_released(self, job: Job, placement: Placement, now: float) -> None:
        self._remove(placement.placement_id)

    def _remove(self, pid: str) -> None:
        h = self._held.pop(pid, None)
        if h is not None:
            t, m, _ = h
            del self._by_tenant[t][pid]
            self.used[t] -= m
            self.total_used -= m

    def post_filter(self, req: Request, status: Status) -> PostFilterResult | None:
        if not self.p["reclaim"] or status.code != Code.UNSCHEDULABLE:
            return None
        t = self.tenant(req.spec)
        need = req.spec.total_milli
        if t not in self.quota or self.used[t] + need > self.quota[t]:
            return None  # not entitled: nothing to reclaim for it
        short = need - self.fw.state.free_gpus(req.model) * MILLI
        if short <= 0:
            return None
        stopping = self.fw.stopping
        cands = []
        for o, pids in self._by_tenant.items():
            over = self.used[o] - self.quota[o]
            if o == t or over <= 0:
                continue
            for pid in reversed(pids):  # youngest first
                if over <= 0:
                    break
                if pid in stopping:
                    continue
                _, m, start = self._held[pid]
                cands.append((-start, pid, m))
                over -= m
        cands.sort()
        victims, freed = [], 0
        for _, pid, m in cands:
            victims.append(pid)
            freed += m
            if freed >= short:
                self._reclaiming[req.job.job_id] = None
                return PostFilterResult(SUCCESS, tuple(victims), reason=f"preempted: queue {t!r} reclaims its quota")
        return None
