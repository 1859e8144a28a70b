"""Turning a node's ``--record`` log (``colocate.node.record``) into co-location figures (pure).

Every figure is computed over one window of the node's clock: from the guaranteed job's first
report plus a warm-up to its last report. A batch counts in the window when the node received
its report (``node_t``) inside it, with its busy time.

* throughput: batches per second of the job in the window;
* device utilization: busy seconds of all jobs in the window / window length;
* idle share used: opportunistic busy seconds / the idle device time the
  guaranteed job leaves when alone (window x (1 - its solo utilization));
* phases of the opportunistic job (``phases``): where the window's time went, so that a user sees
  where idle time was lost: ``start-up`` before it reached its first device work, ``baseline`` held
  while the guaranteed job's solo baseline was profiled, ``paused`` (an SLO break, memory, a policy
  that makes it wait), ``running`` (a share above 0).
"""

from __future__ import annotations

from colocate.base.vocab import JobClass, Phase
from colocate.node.record import BatchRecord


def window(batches: list[BatchRecord], warmup_s: float) -> tuple[float, float]:
    g = [b.node_t for b in batches if b.klass == JobClass.GUARANTEED]
    src = g or [b.node_t for b in batches]
    if not src:
        return 0.0, 0.0
    return min(src) + warmup_s, max(src)


def job_figures(batches: list[BatchRecord], t0: float, t1: float) -> dict:
    """Per job: batches, throughput (it/s) and busy seconds inside [t0, t1]."""
    span = max(1e-9, t1 - t0)
    out: dict[str, dict] = {}
    for b in batches:
        if not (t0 < b.node_t <= t1):
            continue
        f = out.setdefault(b.job_id, {"priority": b.klass, "batches": 0, "busy_s": 0.0})
        f["batches"] += 1
        f["busy_s"] += b.busy_s
    for f in out.values():
        f["throughput"] = f["batches"] / span
        f["utilization"] = f["busy_s"] / span
    return out


def timeline(batches: list[BatchRecord], t0: float, t1: float, bin_s: float = 0.5) -> dict:
    """Binned series for plots: utilization and per-job throughput."""
    n = max(1, int((t1 - t0) / bin_s))
    util = [0.0] * n
    tput: dict[str, list[float]] = {}
    for b in batches:
        i = int((b.node_t - t0) / bin_s)
        if 0 <= i < n:
            util[i] += b.busy_s / bin_s
            tput.setdefault(b.job_id, [0.0] * n)[i] += 1.0 / bin_s
    return {"t": [i * bin_s for i in range(n)], "utilization": [min(1.0, u) for u in util], "throughput": tput}


def phases(batches: list[BatchRecord], limits: list[dict], job_id: str, ready_at: float | None, t0: float,
           t1: float) -> dict[str, float]:
    """Seconds of [t0, t1] the job spent in each ``Phase``. ``limits``: the record's ``welcome`` and
    ``limits`` rows (any jobs); ``ready_at``: when the job reached its first device work (its stats
    file; None: the first batch's start, or never). Before it is ready the job is starting, whatever
    its limits (a hold then costs nothing); after, share 0 is ``baseline`` when labelled so, else
    ``paused``, and a share above 0 is ``running``."""
    if ready_at is None:
        first = next((b for b in batches if b.job_id == job_id), None)
        ready_at = first.node_t - first.duration_s if first is not None else float("inf")
    rows = sorted((r["node_t"], r["limits"]["sm_share"], r.get("slo_state", "")) for r in limits
                  if r.get("job_id") == job_id)
    cuts = sorted({t0, t1, *(t for t, _, _ in rows if t0 < t < t1), *([ready_at] if t0 < ready_at < t1 else [])})
    out = dict.fromkeys(Phase, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        last = [(share, label) for t, share, label in rows if t <= a]
        share, label = last[-1] if last else (1.0, "")
        if a < ready_at:
            phase = Phase.STARTUP
        elif share > 0:
            phase = Phase.RUNNING
        else:
            phase = Phase.BASELINE if label == Phase.BASELINE else Phase.PAUSED
        out[phase] += b - a
    return {str(k): v for k, v in out.items()}
