"""Node policies: given one GPU's jobs and ``now``, the limits each job should have.

A policy is a class with ``plan(gpu, jobs, cfg, now) -> {job_id: Want}``; it may
keep its own per-GPU state in ``gpu.policy`` (a record of its own type) and label jobs through
``Want.slo_state``. Policies never read a clock and never do I/O; NodeCore
applies operator overrides on top and sends what changed. Chosen by name from
configuration (``NodeConfig.policy``), never by branching on the name.

* ``exclusive``: opportunistic jobs wait (share 0) while a guaranteed job runs;
* ``pack``: everyone unthrottled and uncapped (Gandiva-style packing);
* ``static``: a fixed split of compute and memory (MPS-like);
* ``adaptive``: colocate's policy (AntMan-style), see ``Adaptive``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from colocate.base.vocab import NodePolicy, Phase, SloState
from colocate.node.config import POLICY_NAMES, NodeConfig
from colocate.node.state import GuaranteedSide, LocalGpu, RegisteredWorker, host_served


@dataclass(frozen=True)
class Want:
    mem_cap: int
    sm_share: float
    gate: bool = False
    slo_state: SloState | None = None  # the job's new label; None: it keeps the one it has
    # the job holds memory the guaranteed job needs and cannot give it back (paused for memory while the GPU is
    # full): the node stops it, if it is a placement's worker, once this has held for ``reclaim_after_s``
    reclaim: bool = False


PlanJob = RegisteredWorker | GuaranteedSide  # what a policy plans for: a worker, or a GPU's partitions as one


class Policy(Protocol):
    def plan(self, gpu: LocalGpu, jobs: Sequence[PlanJob], cfg: NodeConfig, now: float) -> dict[str, Want]: ...


def _split(jobs: Sequence[PlanJob]) -> tuple[PlanJob | None, list[PlanJob]]:
    g = next((j for j in jobs if j.guaranteed), None)
    return g, [j for j in jobs if not j.guaranteed]


def _g_cap(g: PlanJob, total: int) -> int:
    return min(g.mem_request, total) if g.mem_request else total


def water_fill(budget: float, demands: list[float], floor: float) -> list[float]:
    """Split ``budget`` so each gets at least ``floor`` (budget allowing), then by
    max-min fairness up to its demand; what no one demands is shared equally."""
    n = len(demands)
    if n == 0:
        return []
    if budget <= floor * n:
        return [budget / n] * n
    shares = [floor] * n
    left = budget - floor * n
    open_ = [i for i in range(n) if demands[i] > shares[i]]
    while left > 1e-9 and open_:
        each = left / len(open_)
        still = []
        for i in open_:
            give = min(each, demands[i] - shares[i])
            shares[i] += give
            left -= give
            if demands[i] - shares[i] > 1e-9:
                still.append(i)
        open_ = still
    if left > 1e-9:
        shares = [s + left / n for s in shares]
    return [min(1.0, s) for s in shares]


class Exclusive:
    def plan(self, gpu: LocalGpu, jobs: Sequence[PlanJob], cfg: NodeConfig, now: float) -> dict[str, Want]:
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        if g:
            out[g.job_id] = Want(_g_cap(g, total), 1.0, False, SloState.EXCLUSIVE)
        for j in opps:
            out[j.job_id] = Want(total - (_g_cap(g, total) if g else 0), 0.0 if g else 1.0 / len(opps), False,
                                 SloState.WAITING if g else SloState.RUNNING)
        return out


class Pack:
    def plan(self, gpu: LocalGpu, jobs: Sequence[PlanJob], cfg: NodeConfig, now: float) -> dict[str, Want]:
        return {j.job_id: Want(gpu.spec.mem_total, 1.0, False, SloState.PACKED) for j in jobs}


class Static:
    def plan(self, gpu: LocalGpu, jobs: Sequence[PlanJob], cfg: NodeConfig, now: float) -> dict[str, Want]:
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        opp_share, opp_mem = 1.0, total
        if g:
            out[g.job_id] = Want(int(total * cfg.static_mem_fraction), cfg.static_share, False, SloState.STATIC)
            opp_share, opp_mem = 1.0 - cfg.static_share, int(total * (1.0 - cfg.static_mem_fraction))
        for j in opps:
            out[j.job_id] = Want(opp_mem // len(opps), opp_share / len(opps), False, SloState.STATIC)
        return out


@dataclass(slots=True)
class AdaptiveState:
    """``Adaptive``'s state for one GPU (``LocalGpu.policy``), about one guaranteed job: made afresh when another
    guaranteed job is the GPU's, dropped when none is. Durations are seconds of the job's batches, times the
    node's ``now``, iterations the guaranteed job's batch count."""

    job: str  # the guaranteed job these figures are about
    budget: float  # AIMD's opportunistic compute budget, a share in [opp_min_share, 1]
    trend: int = 1  # AIMD's last step: 1 growing, 0 holding, -1 backing off
    breaks: int = 0  # SLO breaks in a row, each within pause_recur_windows of the last resume
    profiling: bool = False  # opportunistic jobs are held while the guaranteed job's solo batches are profiled
    why: Phase = Phase.BASELINE  # the hold's reason: a first or periodic baseline, or a pause after a break
    need: int = 0  # solo batches this profile takes
    quiet: bool = False  # every opportunistic job has confirmed its pause: the profile counts batches
    since: float = 0.0  # when the hold began
    from_iter: int = 0  # the first batch of the profile
    baseline: float = 0.0  # the solo median batch time the SLO is measured against
    baseline_at: float = 0.0  # when the baseline was profiled
    next_iter: int = 0  # the batch that ends the current decision window
    resumed: int = 0  # the batch count when opportunistic jobs last resumed
    seen: int = 0  # the batch count at the last plan
    ok: bool = True  # the last window (or profile) met the SLO
    broken: float = 0.0  # the median of the window that broke the SLO (pause-or-full)
    after_break: int | None = None  # the resume that ended the last break's pause (None: no break yet)
    over: int = 0  # AIMD windows over the SLO in a row
    seeded: bool = False  # the budget was set from the opportunistic jobs' recommended shares (at the first baseline)


class Adaptive:
    """AntMan-style co-location guarded by the guaranteed job's SLO (its solo mini-batch time x
    ``1 + slo_slowdown``). Two controls for the opportunistic compute share, chosen per job:

    * **pause-or-full**, for a job that yields by device priority (``RegisteredWorker.priority_yield``) and is
      not under memory pressure: share 1 while the guaranteed job meets its SLO (its device priority
      keeps it out of the guaranteed job's way), 0 on a break. A fractional share would make it wake
      at every boundary and take the core despite its priority, which measurably hurts more than
      running freely. After every guaranteed batch, once ``window_batches`` batches have run since
      the last resume, the median of the last ``window_batches`` is compared with the SLO: a break
      pauses every opportunistic job at once (so it is caught within one window of its start) and
      the pause is a fresh solo profile whose median becomes the new baseline (catching drift in
      the guaranteed job's own work); ``pause_batches`` batches long, times ``pause_growth`` for
      each break within ``pause_recur_windows`` windows of the last resume, at most
      ``pause_max_batches`` (a pause whose solo batches are as slow as the broken window found drift,
      not interference: it does not count). A window faster than the baseline by more than twice the
      margin becomes the baseline (the job's own work shrank; alone it is at least that fast, so no
      pause is needed to learn it).
    * **AIMD**, for the others (yielding without priority, or served from host memory over their
      cap, whose bus traffic no priority orders): the budget starts, once the first baseline is measured, at the
      jobs' recommended shares (the scheduler's ``StartPlacement.start_share``), else at ``opp_start_share``; every
      ``window_batches`` guaranteed batches, while the median stays within ``slo_grow_fraction`` of
      the margin it grows by ``opp_share_step``; in the rest it holds; beyond it for
      ``slo_patience_windows`` windows in a row, or beyond twice the margin at once, it is
      multiplied by ``opp_backoff``. The budget is water-filled over these jobs by measured demand
      (busy fraction, or 1 when a job uses all it is given), each getting at least ``opp_min_share``.

    The first baseline: ``baseline_batches`` guaranteed batches (after ``baseline_warmup_batches``)
    profiled once every opportunistic job has confirmed its pause (a job that has not started device
    work confirms at once: it waits before its first device work); again every ``rebaseline_s``.
    Opportunistic jobs are told to yield (limits ``gate``; how: ``COLOCATE_YIELD_VIA``). Memory: the
    guaranteed job keeps its request; opportunistic caps share what it does not use (its recent
    reserved peak plus a headroom), start at their recommended memory (``StartPlacement.start_mem``) or small
    (``opp_start_mem_fraction`` of what is free), double while they fill their cap, and shrink at once
    when it grows; a job whose live set exceeds its new cap is paused. Without a guaranteed job (or
    while it idles) opportunistic jobs get the whole GPU. Labels (``Want.slo_state``): the guaranteed
    job's ``baseline``/``ok``/``violated``/``idle``; an opportunistic job's ``Phase`` while held
    (``baseline``, ``paused``) or running pause-or-full, else AIMD's ``growing``/``holding``/``backoff``.
    """

    def plan(self, gpu: LocalGpu, jobs: Sequence[PlanJob], cfg: NodeConfig, now: float) -> dict[str, Want]:
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        g_state, budget, hold = self._budget(gpu, g, opps, cfg, now)
        st = gpu.policy
        if g:
            out[g.job_id] = Want(_g_cap(g, total), 1.0, False, g_state)
            recent = list(g.recent)[-8:]
            # what it used on the device, and what it was served from host within its cap (the GPU was full)
            g_used = min(max((r.mem_reserved + host_served(r) for r in recent), default=0), _g_cap(g, total))
            avail = max(0, total - g_used - cfg.mem_headroom_bytes)
        else:
            avail = max(0, total - cfg.mem_headroom_bytes)
        if not opps:
            return out
        fair = avail // len(opps)
        idle_g = g is None or g_state == SloState.IDLE
        aimd = [j for j in opps if not _pause_or_full(j)]
        shares = dict(zip((j.job_id for j in aimd),
                          water_fill(budget, [self._demand(j) for j in aimd], cfg.opp_min_share)))
        trend = st.trend if isinstance(st, AdaptiveState) else 1
        short = g is not None and _short_of_memory(g, total)
        for j in opps:
            cap = fair if g is None else self._opp_cap(j, fair, avail, cfg)
            state: SloState
            if idle_g:
                share, state = shares.get(j.job_id, 1.0), SloState.FULL
            elif hold is not None:
                share, state = 0.0, SloState(hold)
            elif j.job_id not in shares:
                share, state = 1.0, SloState.RUNNING
            else:
                share = shares[j.job_id]
                state = SloState.GROWING if trend > 0 else SloState.HOLDING if trend == 0 else SloState.BACKOFF
            last = j.last
            reclaim = False
            if last is not None and last.mem_floor > cap:
                share, state, reclaim = 0.0, SloState.PAUSED_MEM, short
            out[j.job_id] = Want(cap, share, cfg.gate and g is not None, state, reclaim)
        return out

    # -- compute -----------------------------------------------------------------
    def _budget(self, gpu: LocalGpu, g: PlanJob | None, opps: list[PlanJob], cfg: NodeConfig,
                now: float) -> tuple[SloState | None, float, Phase | None]:
        """(guaranteed job's label, AIMD budget, hold): ``hold`` is the ``Phase`` every opportunistic
        job waits in (share 0), or None when they run. Keeps ``gpu.policy`` (an ``AdaptiveState``)."""
        if g is None:
            gpu.policy = None
            return None, 1.0, None
        st = gpu.policy
        if not isinstance(st, AdaptiveState) or st.job != g.job_id:
            st = gpu.policy = AdaptiveState(job=g.job_id, budget=cfg.opp_start_share)
            _hold(st, now, Phase.BASELINE, cfg.baseline_batches)
        last_t = g.last_report_at if g.last_report_at is not None else g.registered_at
        if now - last_t > cfg.guaranteed_idle_s or (g.override_share == 0.0):
            return SloState.IDLE, 1.0, None
        if st.profiling:
            # profile only while every opportunistic job has confirmed its pause (at a boundary, or at
            # once before its first device work); one that joins meanwhile restarts the count
            paused = all(j.limits.sm_share == 0.0 and j.applied_seq >= j.limits.seq for j in opps)
            if not (paused or now - st.since > cfg.baseline_quiet_timeout_s):
                st.quiet = False
                return SloState.BASELINE, 0.0, st.why
            if not st.quiet:
                st.quiet, st.from_iter = True, max(g.iterations + 1, cfg.baseline_warmup_batches)
            if g.iterations - st.from_iter < st.need:
                return SloState.BASELINE, 0.0, st.why
            reps = list(g.recent)[-st.need:]
            st.profiling, st.baseline, st.baseline_at = False, statistics.median(r.duration_s for r in reps), now
            if not st.seeded:  # the first budget, when the opportunistic jobs first run beside this guaranteed one
                st.budget, st.seeded = _start_budget(opps, cfg), True
            st.next_iter, st.resumed, st.seen, st.ok = g.iterations + cfg.window_batches, g.iterations, g.iterations, True
            if st.why == Phase.PAUSED and st.baseline * (1.0 + cfg.slo_slowdown) < st.broken:
                st.after_break = g.iterations  # alone it met the SLO: the opportunistic work broke it
            elif st.why == Phase.PAUSED:  # as slow alone: the job's own work drifted, not a break to grow on
                st.breaks = max(0, st.breaks - 1)
        if cfg.rebaseline_s and now - st.baseline_at > cfg.rebaseline_s:
            _hold(st, now, Phase.BASELINE, cfg.baseline_batches)
            return SloState.BASELINE, 0.0, Phase.BASELINE
        if g.iterations != st.seen:
            st.seen = g.iterations
            if any(_pause_or_full(j) for j in opps) and self._break(st, g, cfg, now):
                return SloState.VIOLATED, st.budget, Phase.PAUSED
        if g.iterations >= st.next_iter:
            self._window(st, g, opps, cfg, now)
            if st.profiling:
                return SloState.BASELINE, 0.0, st.why
        return (SloState.OK if st.ok else SloState.VIOLATED), st.budget, None

    @staticmethod
    def _break(st: AdaptiveState, g: PlanJob, cfg: NodeConfig, now: float) -> bool:
        """Pause-or-full: the last ``window_batches`` guaranteed batches (all since the last resume)
        broke the SLO: pause for a fresh baseline, longer when breaks recur. True when it paused."""
        win = cfg.window_batches
        since = g.iterations - st.resumed
        if since < win:
            return False
        median = statistics.median(r.duration_s for r in list(g.recent)[-win:])
        if median <= st.baseline * (1.0 + cfg.slo_slowdown):
            return False
        after = st.after_break  # the resume that ended the last break's pause
        recur = after is not None and g.iterations - after < cfg.pause_recur_windows * win
        st.breaks = st.breaks + 1 if recur else 0
        need = min(cfg.pause_max_batches, round(cfg.pause_batches * cfg.pause_growth ** st.breaks))
        st.ok, st.trend, st.budget, st.broken = False, -1, max(cfg.opp_min_share, st.budget * cfg.opp_backoff), median
        _hold(st, now, Phase.PAUSED, need)
        return True

    @staticmethod
    def _window(st: AdaptiveState, g: PlanJob, opps: list[PlanJob], cfg: NodeConfig, now: float) -> None:
        """One decision window: AIMD on the budget; with pause-or-full jobs, a window faster than the
        baseline by more than twice the margin becomes the baseline (the guaranteed job's own work shrank)."""
        window = statistics.median(r.duration_s for r in list(g.recent)[-cfg.window_batches:])
        st.next_iter = g.iterations + cfg.window_batches
        if any(_pause_or_full(j) for j in opps) and window < st.baseline * (1.0 - 2 * cfg.slo_slowdown):
            # the job's own work shrank: beside the opportunistic work it runs faster than its old solo
            # time, so alone it would be at least as fast: this window is the new baseline, no pause
            st.baseline = window
            return
        ok = window <= st.baseline * (1.0 + cfg.slo_slowdown)
        st.over = 0 if ok else st.over + 1
        if window <= st.baseline * (1.0 + cfg.slo_slowdown * cfg.slo_grow_fraction):
            st.budget = min(1.0, st.budget + cfg.opp_share_step)
            st.trend = 1
        elif ok:  # inside the SLO but close to it: hold
            st.trend = 0
        elif st.over >= cfg.slo_patience_windows or window > st.baseline * (1.0 + 2 * cfg.slo_slowdown):
            st.budget = max(cfg.opp_min_share, st.budget * cfg.opp_backoff)
            st.trend = -1
        else:  # one window over the SLO by less than twice its margin: hold, it may be noise
            st.trend = 0
        st.ok = ok

    @staticmethod
    def _demand(j) -> float:
        """Share the job would use: its busy fraction, or all it can get when it
        uses (nearly) all it is given."""
        if not j.recent:
            return getattr(j, "start_share", 0.0) or 1.0  # its recommended share, until it reports
        busy = j.busy_fraction(8)
        return 1.0 if busy >= 0.8 * j.limits.sm_share else busy

    # -- memory --------------------------------------------------------------------
    @staticmethod
    def _opp_cap(j, fair: int, avail: int, cfg) -> int:
        first = getattr(j, "start_mem", 0) or int(avail * cfg.opp_start_mem_fraction)  # its recommendation, if any
        cap = j.limits.mem_cap if j.limits.seq > 0 else first
        last = j.last
        if last is not None and (last.mem_reserved >= 0.9 * cap or last.host_bytes > 0 or last.mem_floor > 0):
            cap = max(cap * 2, last.mem_reserved * 2, last.mem_floor + last.host_bytes)
        return max(0, min(cap, fair))


def _short_of_memory(g: PlanJob, total: int) -> bool:
    """The guaranteed job was served from host memory at its last report within its own cap: the GPU was full
    (``colocate.gpus.ledger``), not the job over what it may hold."""
    last = g.last
    if last is None:
        return False
    host = host_served(last)
    return host > 0 and last.mem_reserved + host <= _g_cap(g, total)


def _start_budget(opps: Sequence[PlanJob], cfg: NodeConfig) -> float:
    """AIMD's first budget: the opportunistic jobs' recommended shares where the scheduler gave them (each
    ``RegisteredWorker.start_share``), else ``opp_start_share``; within [opp_min_share, 1]."""
    given = [s for s in (getattr(j, "start_share", 0.0) for j in opps) if s > 0]
    start = sum(given) if given else cfg.opp_start_share
    return min(1.0, max(cfg.opp_min_share, start))


def _pause_or_full(j) -> bool:
    """The job runs pause-or-full: it yields by device priority and is not served from host memory."""
    last = j.last
    return j.priority_yield and not (last is not None and (last.host_bytes > 0 or last.mem_floor > 0))


def _hold(st: AdaptiveState, now: float, why: Phase, need: int) -> None:
    """Hold every opportunistic job (for ``why``) and profile ``need`` guaranteed batches alone."""
    st.profiling, st.why, st.need, st.quiet, st.since = True, why, need, False, now


POLICIES: dict[str, type[Policy]] = {NodePolicy.EXCLUSIVE: Exclusive, NodePolicy.PACK: Pack, NodePolicy.STATIC: Static,
                            NodePolicy.ADAPTIVE: Adaptive}
assert tuple(POLICIES) == POLICY_NAMES, "colocate.node.config.POLICY_NAMES is the one list of names"
