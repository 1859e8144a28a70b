"""Reader of Alibaba PAI 2020 job rows with a script key (format ``pai2020``), as in
``pai_job_duration_estimate_100K.csv`` of alibaba/clusterdata's cluster-trace-gpu-v2020.

Required columns: ``submit_time`` (s, >= 0), ``duration`` (s, >= 0), ``num_gpu`` (GPUs, may be
fractional), ``group`` (hash of the job's script, arguments and data). Optional: ``job_id``
(default ``pai-LINE``; unique), ``user``. Other columns are ignored and listed in
``ignored_columns``; in particular ``user_dur``, ``group_dur`` and ``group_gpu_dur`` are the trace's
own estimates computed over the whole trace, future included, and ``gpu_type`` is a label of the
machine the job ran on, not a constraint (a cluster of another shape could never place it).

Mapping onto ``JobSpec``: ``group`` is both the exact and the family fingerprint (the trace has no
arguments to mask); a fractional ``num_gpu`` < 1 is one GPU at that share (``gpu_milli`` =
round(num_gpu x 1000), at least 1); a larger one is rounded up to whole GPUs and split as Philly's
gangs (``split_gang``). Every job is guaranteed, in queue ``default``.

Bad-row reasons: wrong field count, bad <column>, negative duration, no gpus, duplicate job_id,
bad spec."""

from __future__ import annotations

import math

from cluster.spec import MILLI, JobSpec
from cluster.traces.common import (
    BadRow,
    TraceResult,
    check_node_gpus,
    read_job_table,
    split_gang,
    to_float,
    to_seconds,
)

REQUIRED = ("submit_time", "duration", "num_gpu", "group")
OPTIONAL = ("job_id", "user")


def read_pai_jobs(path, *, node_gpus: int = 8, limit: int | None = None, max_problems: int | None = None) -> TraceResult:
    """Read PAI 2020 job rows; see the module docstring for columns and rules."""
    check_node_gpus(node_gpus)
    return read_job_table(str(path), "pai2020", "a PAI 2020 job table", REQUIRED, OPTIONAL,
                          lambda c, line: _job(c, line, node_gpus), limit, max_problems)


def _job(c: dict[str, str], line: int, node_gpus: int) -> tuple[JobSpec, float]:
    submit = to_seconds(c["submit_time"], "submit_time", 0.0)
    duration = to_seconds(c["duration"], "duration")
    if duration < 0:
        raise BadRow("negative duration", c["duration"])
    n = to_float(c["num_gpu"], "num_gpu")
    if not (n > 0 and math.isfinite(n)):
        raise BadRow("no gpus", repr(c["num_gpu"]))
    if n < 1:
        workers, gpus, milli = 1, 1, max(1, round(n * MILLI))
    else:
        workers, gpus = split_gang(math.ceil(n), node_gpus)
        milli = MILLI
    group = c["group"]
    spec = JobSpec(job_id=c.get("job_id") or f"pai-{line}", submit_time=submit, workers=workers, gpus=gpus,
                   gpu_milli=milli, user=c.get("user", ""), fingerprint=group, family=group)
    return spec, duration
