"""What a node tells the scheduler of each worker's progress: a summary of the ``BatchReport``s it received
(pure: no clock, no I/O; the node's core keeps the per-report totals, ``colocate.node.state.RegisteredWorker``).

Per report the core does O(1) work (``note``: counters and peaks); the quantiles are computed only when a
status is built (``summarise``, about once a second, over the worker's last ``RECENT`` reports), so
summarising adds nothing per mini-batch. Units: seconds and bytes.

``step_host_s`` is the host part of a step (from its start to its first device work: ``device_start_s``).
The step-time window leaves out the job's first mini-batch (``seq`` 0) once a later one is there: it carries
the job's start-up on the device (first allocations, the feature read, lazy initialisation), 2-3x a step in
the examples, and would inflate the mean the remaining time is projected with.

Every figure is finite, whatever a job reports: the protocol bounds a report's seconds to ``P.MAX_REPORT_S``, the
seconds figures of a summary (quantiles and means of those) are kept within [0, ``P.MAX_REPORT_S``], and
``busy_fraction`` within [0, 1] (0 until the reports total ``MIN_MEASURED_S`` of wall time).
"""

from __future__ import annotations

from colocate import protocol as P
from colocate.node.state import MIN_MEASURED_S


def note(worker, m: P.BatchReport) -> None:
    """Count report ``m`` of ``worker`` (a ``RegisteredWorker``) into its totals and peaks."""
    worker.iterations_done = max(worker.iterations_done, m.seq + 1)
    worker.busy_total_s += m.busy_s
    worker.wall_total_s += m.duration_s
    worker.mem_reserved_peak = max(worker.mem_reserved_peak, m.mem_reserved_peak, m.mem_reserved)
    worker.mem_allocated_peak = max(worker.mem_allocated_peak, m.mem_allocated_peak)


def quantile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ascending ``sorted_values``, linearly interpolated; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarise(worker, now: float, with_features: bool = False) -> P.JobProgress:
    """``worker``'s progress at node time ``now``; its features only ``with_features`` (and once known)."""
    window = [r for r in worker.recent if r.seq > 0] or list(worker.recent)
    steps = sorted(r.duration_s for r in window)
    host = sum(min(r.device_start_s, r.duration_s) for r in window) / len(window) if window else 0.0
    busy = worker.busy_total_s / worker.wall_total_s if worker.wall_total_s >= MIN_MEASURED_S else 0.0
    features = worker.features if with_features else None
    total = worker.features.total_iterations if worker.features is not None else None
    since = max(0.0, now - worker.last_report_at) if worker.last_report_at is not None else 0.0
    return P.JobProgress(
        job_id=worker.job, rank=worker.rank or 0, iterations=worker.iterations_done,
        step_p50_s=_seconds(quantile(steps, 0.5)), step_p90_s=_seconds(quantile(steps, 0.9)), window=len(steps),
        step_mean_s=_seconds(sum(steps) / len(steps) if steps else 0.0), step_host_s=_seconds(host),
        mem_reserved_peak=worker.mem_reserved_peak, mem_allocated_peak=worker.mem_allocated_peak,
        busy_fraction=min(1.0, max(0.0, busy)), total_iterations=total, since_report_s=since, features=features)


def _seconds(value: float) -> float:
    """``value`` (a quantile or mean of reported seconds) within [0, ``P.MAX_REPORT_S``]: what one report may state,
    so rounding can never carry it out (nor an overflow to inf, nor a nan, into a ``JobProgress``)."""
    return value if 0.0 <= value <= P.MAX_REPORT_S else (0.0 if value < 0.0 else P.MAX_REPORT_S)
