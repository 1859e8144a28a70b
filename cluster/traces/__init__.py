"""Trace readers: real cluster traces and cluster shapes as the scheduler's own input records.

Jobs: ``load_trace(path, format=None, **options) -> TraceResult`` with ``jobs`` a list of
``TraceJob(spec: JobSpec, duration_s: float | None, line: int)`` sorted by submit time.
Formats: ``philly`` (``read_philly``), ``alibaba2023`` (``read_alibaba_pods``), ``csv``
(``read_csv_jobs``), ``pai2020`` (``read_pai_jobs``); ``detect_format`` guesses one from the header.
Nodes: ``load_nodes(path, format=None)`` -> ``NodeResult``; ``parse_shape("64x8")``.
Placement plugins test GPU-model constraints with ``model_allows(constraint, model)``.
The formats, the mapping rules and the bad-row accounting are described in docs/traces.md.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.traces.alibaba import read_alibaba_pods
from cluster.traces.common import (
    JOB_FORMATS,
    MAX_PROBLEMS,
    NODE_FORMATS,
    NodeResult,
    TraceJob,
    TraceResult,
    allowed_models,
    detect_format,
    detect_node_format,
    model_allows,
    split_gang,
)
from cluster.traces.csvjobs import read_csv_jobs
from cluster.traces.nodes import load_nodes, parse_shape
from cluster.traces.pai import read_pai_jobs
from cluster.traces.philly import read_philly

READERS: dict[str, Callable[..., TraceResult]] = {"philly": read_philly, "alibaba2023": read_alibaba_pods, "csv": read_csv_jobs,
                                              "pai2020": read_pai_jobs}


def load_trace(path, format: str | None = None, **options) -> TraceResult:
    """Read a job trace in ``format`` (guessed from the header when None) with that reader's
    keyword ``options`` (e.g. ``limit``, ``node_gpus``, ``allow_no_duration``)."""
    fmt = format or detect_format(path)
    reader = READERS.get(fmt)
    if reader is None:
        raise ValueError(f"unknown trace format {fmt!r}: use one of {', '.join(READERS)}")
    return reader(path, **options)


__all__ = [
    "JOB_FORMATS", "MAX_PROBLEMS", "NODE_FORMATS", "READERS", "NodeResult", "TraceJob", "TraceResult",
    "allowed_models", "detect_format", "detect_node_format", "load_nodes", "load_trace", "model_allows",
    "parse_shape", "read_alibaba_pods", "read_csv_jobs", "read_pai_jobs", "read_philly", "split_gang",
]
