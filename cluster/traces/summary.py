"""Facts about a read trace or node list, for docs and sanity checks (pure functions).

``summarize_jobs(result) -> dict`` and ``summarize_nodes(result) -> dict`` return plain values
(counts, histograms as sorted lists of pairs) so that equal inputs give equal output.
``python -m cluster.traces PATH...`` prints them.
"""

from __future__ import annotations

from collections import Counter

from cluster.spec import MILLI
from cluster.traces.common import NodeResult, TraceResult


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summarize_jobs(result: TraceResult) -> dict:
    """Counts, GPU-size and gang histograms, fractional share, time range, durations."""
    jobs = result.jobs
    specs = [j.spec for j in jobs]
    durations = sorted(j.duration_s for j in jobs if j.duration_s is not None)
    gpu_jobs = [s for s in specs if s.gpus]
    fractional = sum(1 for s in specs if s.gpu_milli < MILLI)
    return {
        "path": result.path,
        "format": result.format,
        "rows": result.rows,
        "jobs": len(jobs),
        "skipped": dict(sorted(result.skipped.items())),
        "beyond_limit": result.beyond_limit,
        "total_gpus_hist": sorted(Counter(s.total_gpus for s in specs).items()),
        "gangs_hist": sorted(Counter((s.workers, s.gpus) for s in specs if s.workers > 1).items()),
        "cpu_only": len(specs) - len(gpu_jobs),
        "fractional": fractional,
        "fractional_of_gpu_jobs": round(fractional / len(gpu_jobs), 4) if gpu_jobs else 0.0,
        "priorities": dict(sorted(Counter(s.klass for s in specs).items())),
        "queues": len({s.queue for s in specs}),
        "model_constraints": sum(1 for s in specs if s.gpu_model),
        "first_submit_s": specs[0].submit_time if specs else None,
        "last_submit_s": specs[-1].submit_time if specs else None,
        "no_duration": len(jobs) - len(durations),
        "duration_median_s": _quantile(durations, 0.5),
        "duration_p90_s": _quantile(durations, 0.9),
        "duration_max_s": durations[-1] if durations else None,
        "ignored_columns": list(result.ignored_columns),
    }


def summarize_nodes(result: NodeResult) -> dict:
    """Node and GPU counts, (gpus, model) histogram, CPU-only machines."""
    nodes = result.nodes
    return {
        "path": result.path,
        "format": result.format,
        "rows": result.rows,
        "nodes": len(nodes),
        "skipped": dict(sorted(result.skipped.items())),
        "gpus": sum(n.gpus for n in nodes),
        "cpu_only": sum(1 for n in nodes if n.gpus == 0),
        "shapes": sorted(Counter((n.gpus, n.gpu_model) for n in nodes).items(), key=lambda kv: (-kv[1], kv[0])),
    }
