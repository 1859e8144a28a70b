"""Turning a node's ``--record`` log (``colocate.record``) into co-location figures (pure).

Every figure is computed over one window of the node's clock: from the guaranteed job's first
report plus a warm-up to its last report. A batch counts in the window when the node received
its report (``node_t``) inside it, with its busy time.

* throughput: batches per second of the job in the window;
* device utilization: busy seconds of all jobs in the window / window length;
* idle share used: opportunistic busy seconds / the idle device time the
  guaranteed job leaves when alone (window x (1 - its solo utilization)).
"""

from __future__ import annotations

from colocate.record import Batch
from colocate.vocab import Priority


def window(batches: list[Batch], warmup_s: float) -> tuple[float, float]:
    g = [b.node_t for b in batches if b.priority == Priority.GUARANTEED]
    src = g or [b.node_t for b in batches]
    if not src:
        return 0.0, 0.0
    return min(src) + warmup_s, max(src)


def job_figures(batches: list[Batch], t0: float, t1: float) -> dict:
    """Per job: batches, throughput (it/s) and busy seconds inside [t0, t1]."""
    span = max(1e-9, t1 - t0)
    out: dict[str, dict] = {}
    for b in batches:
        if not (t0 < b.node_t <= t1):
            continue
        f = out.setdefault(b.job_id, {"priority": b.priority, "batches": 0, "busy_s": 0.0})
        f["batches"] += 1
        f["busy_s"] += b.busy_s
    for f in out.values():
        f["throughput"] = f["batches"] / span
        f["utilization"] = f["busy_s"] / span
    return out


def timeline(batches: list[Batch], t0: float, t1: float, bin_s: float = 0.5) -> dict:
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
