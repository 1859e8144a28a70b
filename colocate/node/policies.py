"""Node policies: given one GPU's jobs and ``now``, the limits each job should have.

A policy is a class with ``plan(gpu, jobs, cfg, now) -> {job_id: Want}``; it may
keep its own per-GPU state in ``gpu.policy`` and label jobs through
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
from dataclasses import dataclass
from typing import Any

from colocate.config import POLICY_NAMES
from colocate.vocab import NodePolicy


@dataclass(frozen=True)
class Want:
    mem_cap: int
    sm_share: float
    gate: bool = False
    slo_state: str = ""


def _split(jobs):
    g = next((j for j in jobs if j.guaranteed), None)
    return g, [j for j in jobs if not j.guaranteed]


def _g_cap(g, total: int) -> int:
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
    def plan(self, gpu, jobs, cfg, now):
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        if g:
            out[g.job_id] = Want(_g_cap(g, total), 1.0, False, NodePolicy.EXCLUSIVE)
        for j in opps:
            out[j.job_id] = Want(total - (_g_cap(g, total) if g else 0), 0.0 if g else 1.0 / len(opps), False,
                                 "waiting" if g else "running")
        return out


class Pack:
    def plan(self, gpu, jobs, cfg, now):
        return {j.job_id: Want(gpu.spec.mem_total, 1.0, False, "packed") for j in jobs}


class Static:
    def plan(self, gpu, jobs, cfg, now):
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        opp_share, opp_mem = 1.0, total
        if g:
            out[g.job_id] = Want(int(total * cfg.static_mem_fraction), cfg.static_share, False, NodePolicy.STATIC)
            opp_share, opp_mem = 1.0 - cfg.static_share, int(total * (1.0 - cfg.static_mem_fraction))
        for j in opps:
            out[j.job_id] = Want(opp_mem // len(opps), opp_share / len(opps), False, NodePolicy.STATIC)
        return out


class Adaptive:
    """AntMan-style dynamic scaling with an SLO-guarded AIMD on the opportunistic share.

    Per GPU: when a guaranteed job arrives its solo mini-batch time is measured
    (``baseline_batches`` batches once every opportunistic job has confirmed its
    pause; again every ``rebaseline_s``). Then every ``window_batches`` guaranteed batches, the
    median batch time is compared with ``baseline x (1 + slo_slowdown)``: while
    it stays within ``slo_grow_fraction`` of that margin, the opportunistic budget
    grows by ``opp_share_step``; in the rest of the margin it holds; beyond it for
    ``slo_patience_windows`` windows in a row, or beyond twice the margin at
    once, it is multiplied by ``opp_backoff`` (a single window a little over the
    SLO holds the budget: batch times on a shared machine are noisy). The budget
    is water-filled over the opportunistic jobs by measured demand (busy
    fraction, or 1 when a job uses all it is given), each getting at least
    ``opp_min_share``. Opportunistic jobs are told to yield the device (limits
    ``gate``; each job yields as ``COLOCATE_YIELD_VIA`` says). Memory: the guaranteed job keeps its request;
    opportunistic caps share what the guaranteed job does not use (its recent
    reserved peak plus a headroom), start small, double while they fill their
    cap, and shrink at once when the guaranteed job grows; a job whose live set
    exceeds its new cap is paused. Without a guaranteed job (or while it idles)
    opportunistic jobs get the whole GPU.
    """

    def plan(self, gpu, jobs, cfg, now):
        st = gpu.policy
        g, opps = _split(jobs)
        total = gpu.spec.mem_total
        out = {}
        g_state, budget = self._budget(st, g, opps, cfg, now)
        if g:
            out[g.job_id] = Want(_g_cap(g, total), 1.0, False, g_state)
            recent = list(g.recent)[-8:]
            g_used = max((r.mem_reserved for r in recent), default=0)
            avail = max(0, total - g_used - cfg.mem_headroom_bytes)
        else:
            avail = max(0, total - cfg.mem_headroom_bytes)
        if not opps:
            return out
        fair = avail // len(opps)
        demands = [self._demand(j) for j in opps]
        shares = water_fill(budget, demands, cfg.opp_min_share)
        idle_g = g is None or g_state == "idle"
        for j, share in zip(opps, shares):
            cap = fair if g is None else self._opp_cap(j, fair, avail, cfg)
            last = j.last
            trend = st.get("trend", 1)
            state = "full" if idle_g else ("waiting" if budget == 0 else
                                           ("growing" if trend > 0 else "holding" if trend == 0 else "backoff"))
            if last is not None and last.mem_floor > cap:
                share, state = 0.0, "paused-mem"
            out[j.job_id] = Want(cap, share, cfg.gate and g is not None, state)
        return out

    # -- compute -----------------------------------------------------------------
    def _budget(self, st, g, opps, cfg, now):
        """(guaranteed job's state label, opportunistic budget)."""
        if g is None:
            st.clear()
            return "", 1.0
        if st.get("job") != g.job_id:
            st.clear()
            st.update(job=g.job_id, phase="baseline", quiet=False, since=now, budget=cfg.opp_start_share, trend=1)
        last_t = g.last_report_at if g.last_report_at is not None else g.registered_at
        if now - last_t > cfg.guaranteed_idle_s or (g.override_share == 0.0):
            return "idle", 1.0
        if st["phase"] == "baseline":
            # profile only while every opportunistic job has confirmed its pause at a boundary
            # (one that joins meanwhile restarts the count)
            paused = all(j.limits.sm_share == 0.0 and j.applied_seq >= j.limits.seq for j in opps)
            if not (paused or now - st["since"] > cfg.baseline_quiet_timeout_s):
                st["quiet"] = False
                return "baseline", 0.0
            if not st["quiet"]:
                st.update(quiet=True, from_iter=max(g.iterations + 1, cfg.baseline_warmup_batches))
            # batches counted by this node (a job's own seq may predate this node incarnation)
            if g.iterations - st["from_iter"] < cfg.baseline_batches:
                return "baseline", 0.0
            reps = list(g.recent)[-cfg.baseline_batches:]
            st.update(phase="steady", baseline=statistics.median(r.duration_s for r in reps),
                      baseline_at=now, next_iter=g.iterations + cfg.window_batches)
        if cfg.rebaseline_s and now - st["baseline_at"] > cfg.rebaseline_s:
            st.update(phase="baseline", quiet=False, since=now)
            return "baseline", 0.0
        if g.iterations >= st["next_iter"]:
            window = statistics.median(r.duration_s for r in list(g.recent)[-cfg.window_batches:])
            ok = window <= st["baseline"] * (1.0 + cfg.slo_slowdown)
            st["over"] = 0 if ok else st.get("over", 0) + 1
            if window <= st["baseline"] * (1.0 + cfg.slo_slowdown * cfg.slo_grow_fraction):
                st["budget"] = min(1.0, st["budget"] + cfg.opp_share_step)
                st["trend"] = 1
            elif ok:  # inside the SLO but close to it: hold
                st["trend"] = 0
            elif st["over"] >= cfg.slo_patience_windows or window > st["baseline"] * (1.0 + 2 * cfg.slo_slowdown):
                st["budget"] = max(cfg.opp_min_share, st["budget"] * cfg.opp_backoff)
                st["trend"] = -1
            else:  # one window over the SLO by less than twice its margin: hold, it may be noise
                st["trend"] = 0
            st["ok"] = ok
            st["next_iter"] = g.iterations + cfg.window_batches
        return ("ok" if st.get("ok", True) else "violated"), st["budget"]

    @staticmethod
    def _demand(j) -> float:
        """Share the job would use: its busy fraction, or all it can get when it
        uses (nearly) all it is given."""
        if not j.recent:
            return 1.0
        busy = j.busy_fraction(8)
        return 1.0 if busy >= 0.8 * j.limits.sm_share else busy

    # -- memory --------------------------------------------------------------------
    @staticmethod
    def _opp_cap(j, fair: int, avail: int, cfg) -> int:
        cap = j.limits.mem_cap if j.limits.seq > 0 else int(avail * cfg.opp_start_mem_fraction)
        last = j.last
        if last is not None and (last.mem_reserved >= 0.9 * cap or last.host_bytes > 0 or last.mem_floor > 0):
            cap = max(cap * 2, last.mem_reserved * 2, last.mem_floor + last.host_bytes)
        return max(0, min(cap, fair))


POLICIES: dict[str, Any] = {NodePolicy.EXCLUSIVE: Exclusive, NodePolicy.PACK: Pack, NodePolicy.STATIC: Static,
                            NodePolicy.ADAPTIVE: Adaptive}
assert tuple(POLICIES) == POLICY_NAMES, "colocate.config.POLICY_NAMES is the one list of names"
