"""Reader of the generic job CSV (format ``csv``), for traces made by hand or converted by a script.

Required columns: ``submit_time`` (s, >= 0, kept as given), ``duration`` (s, >= 0; an empty cell
means unknown and is allowed only with ``allow_no_duration=True``), ``num_gpus``.
Optional columns (an empty cell takes the default): ``job_id`` (default ``job-LINE``; unique),
``workers``, ``gpu_milli`` (share of each GPU, 1..1000, default 1000), ``gpu_mem`` (per GPU: a
size such as ``8GiB``, a bare number is bytes), ``cpu_milli``, ``mem_mib`` (per worker),
``gpu_model`` (one model or ``A|B``), ``priority`` (guaranteed | opportunistic), ``queue``
(default ``"default"``), ``user``, ``name``, ``estimate_s``, ``group`` (the job's exact fingerprint,
e.g. a hash of script and arguments: jobs of one group ran the same command; the predictor's most
specific key), ``family`` (a family fingerprint: a sweep). Other columns are ignored and listed
in ``ignored_columns``. Names are case-insensitive.

``num_gpus`` is the job's TOTAL number of GPUs (as in Philly): with ``workers`` w, each worker
gets ``num_gpus / w`` GPUs and w must divide it ("inconsistent workers" otherwise); without
``workers`` the gang is split as Philly's is (``split_gang(num_gpus, node_gpus)``). A fractional
share (``gpu_milli`` < 1000) needs exactly one GPU per worker; ``num_gpus`` 0 is a CPU-only job.

Bad-row reasons: wrong field count, bad <column>, negative duration, no duration, duplicate job_id,
inconsistent workers, fractional share on several GPUs, gpu_milli without gpus, bad spec.
"""

from __future__ import annotations

from cluster.spec import MILLI, JobSpec
from cluster.traces.common import (
    BadRow,
    TraceResult,
    check_node_gpus,
    normalize_models,
    read_job_table,
    split_gang,
    to_int,
    to_seconds,
    to_size,
)
from colocate.base.vocab import JOB_CLASSES, JobClass

REQUIRED = ("submit_time", "duration", "num_gpus")
OPTIONAL = ("job_id", "workers", "gpu_milli", "gpu_mem", "cpu_milli", "mem_mib", "gpu_model", "priority",
            "queue", "user", "name", "estimate_s", "group", "family")


def read_csv_jobs(path, *, node_gpus: int = 8, allow_no_duration: bool = False, limit: int | None = None,
                  max_problems: int | None = None) -> TraceResult:
    """Read a generic job CSV; see the module docstring for columns and rules."""
    check_node_gpus(node_gpus)
    return read_job_table(str(path), "csv", "a generic job CSV", REQUIRED, OPTIONAL,
                          lambda c, line: _job(c, line, node_gpus, allow_no_duration), limit, max_problems)


def _job(c: dict[str, str], line: int, node_gpus: int, allow_no_duration: bool) -> tuple[JobSpec, float | None]:
    """One row's JobSpec and duration; raises BadRow (or SpecError)."""
    submit = to_seconds(c["submit_time"], "submit_time", 0.0)
    duration = None
    if c["duration"]:
        duration = to_seconds(c["duration"], "duration")
        if duration < 0:
            raise BadRow("negative duration", c["duration"])
    elif not allow_no_duration:
        raise BadRow("no duration", "empty duration")
    n = to_int(c["num_gpus"], "num_gpus")
    milli = to_int(c["gpu_milli"], "gpu_milli", 1) if c.get("gpu_milli") else MILLI
    if milli > MILLI:
        raise BadRow("bad gpu_milli", repr(c["gpu_milli"]))
    if c.get("workers"):
        workers = to_int(c["workers"], "workers", 1)
        if n % workers:
            raise BadRow("inconsistent workers", f"num_gpus {n} (total) is not a multiple of workers {workers}")
        gpus = n // workers
    else:
        workers, gpus = split_gang(n, node_gpus)
    if milli < MILLI:
        if n == 0:
            raise BadRow("gpu_milli without gpus", f"gpu_milli {milli} with num_gpus 0")
        if gpus != 1:
            raise BadRow("fractional share on several GPUs",
                         f"gpu_milli {milli} needs one GPU per worker, got {gpus} (num_gpus is the total)")
    gpu_mem = to_size(c["gpu_mem"], "gpu_mem") if c.get("gpu_mem") else 0
    priority = c.get("priority", "").lower() or JobClass.GUARANTEED
    if priority not in JOB_CLASSES:
        raise BadRow("bad priority", repr(c["priority"]))
    priority = JobClass(priority)
    estimate = to_seconds(c["estimate_s"], "estimate_s") if c.get("estimate_s") else None
    if estimate is not None and estimate <= 0:
        raise BadRow("bad estimate_s", repr(c["estimate_s"]))
    spec = JobSpec(
        job_id=c.get("job_id") or f"job-{line}", submit_time=submit, workers=workers, gpus=gpus,
        gpu_milli=milli, gpu_mem=gpu_mem,
        cpu_milli=to_int(c["cpu_milli"], "cpu_milli") if c.get("cpu_milli") else 0,
        mem_mib=to_int(c["mem_mib"], "mem_mib") if c.get("mem_mib") else 0,
        gpu_model=normalize_models(c.get("gpu_model", "")), klass=priority,
        queue=c.get("queue") or "default", user=c.get("user", ""), name=c.get("name", ""), estimate_s=estimate,
        fingerprint=c.get("group", ""), family=c.get("family", ""))
    return spec, duration
