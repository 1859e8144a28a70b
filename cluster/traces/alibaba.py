"""Reader of the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023, ``openb_pod_list_*.csv``).

Columns: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` (required), then
``gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`` (the ``multigpu*`` files
stop after ``gpu_milli``).

Mapping onto ``JobSpec`` (one pod = one job of one worker; see docs/traces.md):
  * ``job_id`` and ``name``: the pod name (must be unique and non-empty); ``queue`` "default";
    ``user`` empty (the trace has none).
  * ``gpus`` = ``num_gpu``; ``gpu_milli`` is the share of each GPU: below 1000 only with
    ``num_gpu`` 1 (a fractional GPU); ``num_gpu`` 0 is a CPU-only pod (``gpus`` 0, ``gpu_milli``
    must be 0 in the file; kept unless ``include_cpu_only=False``).
  * ``cpu_milli``, ``mem_mib`` = ``cpu_milli``, ``memory_mib`` per pod.
  * ``gpu_model`` = ``gpu_spec`` normalized (``normalize_models``): one model or several joined
    by ``|``, any of which will do; test nodes with ``common.model_allows``.
  * ``priority``: qos ``BE`` -> opportunistic; ``LS``, ``Burstable``, ``Guaranteed`` -> guaranteed;
    anything else is a bad row; no qos column -> guaranteed.
  * ``submit_time`` = ``creation_time`` as given (s; 0 for all pods when the file has no times).
  * ``duration_s`` = ``deletion_time - scheduled_time``: the run time, without the original
    cluster's queueing wait (the simulator makes its own). A pod never scheduled (``Pending``,
    empty ``scheduled_time``) or without times has no duration: kept with ``None`` only when the
    caller passes ``allow_no_duration=True`` (e.g. FGD-style packing with no departures), else
    counted as "never scheduled" / "no duration". Without ``allow_no_duration`` the three time
    columns are required; when only they are missing, the error says that ``--allow-no-duration``
    (``colocate simulate``'s name for it) reads the file. Times beyond ``MAX_SECONDS`` (100 years)
    are bad rows. ``pod_phase`` is not used (Failed pods ran too).

Bad-row reasons: wrong field count, bad name, duplicate name, bad cpu_milli, bad memory_mib,
bad num_gpu, bad gpu_milli, fractional share on several GPUs, gpu_milli without gpus, cpu-only pod,
bad qos, bad creation_time, bad scheduled_time, bad deletion_time, scheduled before creation,
negative duration, never scheduled, no duration, bad spec.
"""

from __future__ import annotations

from cluster.spec import MILLI, JobSpec, SpecError
from cluster.traces.common import (
    BadRow,
    RowLog,
    TraceJob,
    TraceResult,
    columns,
    data_rows,
    finish,
    normalize_models,
    open_table,
    to_int,
    to_seconds,
)
from colocate.base.vocab import JobClass

REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIMES = ("creation_time", "deletion_time", "scheduled_time")
OPTIONAL = ("gpu_spec", "qos", "pod_phase") + TIMES
QOS = {"BE": JobClass.OPPORTUNISTIC, "LS": JobClass.GUARANTEED, "Burstable": JobClass.GUARANTEED,
       "Guaranteed": JobClass.GUARANTEED}


def read_alibaba_pods(path, *, allow_no_duration: bool = False, include_cpu_only: bool = True,
                      limit: int | None = None, max_problems: int | None = None) -> TraceResult:
    """Read an ``openb_pod_list_*.csv`` file; see the module docstring for the mapping."""
    path = str(path)
    what = "an Alibaba 2023 pod list"
    log = RowLog(path, max_problems)
    result = TraceResult(path, "alibaba2023")
    required = REQUIRED if allow_no_duration else REQUIRED + TIMES
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    with open_table(path, what) as (reader, names):
        # the hint only where it would help: every column but the times is there (the multigpu* files)
        hint = "" if allow_no_duration or not set(REQUIRED) <= set(names) else \
            " (with --allow-no-duration, pods without times are kept and never finish)"
        index, result.ignored_columns = columns(path, names, what, required, OPTIONAL, hint)
        width = len(names)
        i_name, i_cpu, i_mem, i_n, i_milli = (index[c] for c in REQUIRED)
        i_spec, i_qos = index.get("gpu_spec"), index.get("qos")
        i_ct, i_dt, i_st = (index.get(c) for c in TIMES)
        for line, row in data_rows(reader, width, result, log):
            try:
                name = row[i_name].strip()
                if not name:
                    raise BadRow("bad name", "empty")
                if name in seen:
                    raise BadRow("duplicate name", name)
                cpu = to_int(row[i_cpu], "cpu_milli")
                mem = to_int(row[i_mem], "memory_mib")
                n = to_int(row[i_n], "num_gpu")
                milli = to_int(row[i_milli], "gpu_milli")
                if n == 0:
                    if milli != 0:
                        raise BadRow("gpu_milli without gpus", f"gpu_milli {milli} with num_gpu 0")
                    if not include_cpu_only:
                        raise BadRow("cpu-only pod")
                    milli = MILLI
                elif not 1 <= milli <= MILLI:
                    raise BadRow("bad gpu_milli", repr(row[i_milli]))
                elif milli < MILLI and n != 1:
                    raise BadRow("fractional share on several GPUs", f"gpu_milli {milli} x num_gpu {n}")
                model = normalize_models(row[i_spec]) if i_spec is not None else ""
                priority = JobClass.GUARANTEED
                if i_qos is not None:
                    qos = QOS.get(row[i_qos].strip())
                    if qos is None:
                        raise BadRow("bad qos", repr(row[i_qos]))
                    priority = qos
                submit, duration = _times(row, i_ct, i_st, i_dt, allow_no_duration)
                spec = JobSpec(job_id=name, name=name, submit_time=submit, gpus=n, gpu_milli=milli,
                               cpu_milli=cpu, mem_mib=mem, gpu_model=model, klass=priority)
            except BadRow as e:
                log.skip(line, e.reason, e.detail)
                continue
            except SpecError as e:
                log.skip(line, "bad spec", str(e))
                continue
            seen.add(name)
            jobs.append(TraceJob(spec, duration, line))
    result.skipped, result.problems = log.skipped, log.problems
    return finish(result, jobs, limit)


def _times(row: list[str], i_ct, i_st, i_dt, allow_no_duration: bool) -> tuple[float, float | None]:
    """(submit time, duration or None) of one pod row; raises BadRow."""
    if i_ct is None:
        return 0.0, None  # no time columns: only reachable with allow_no_duration
    submit = to_seconds(row[i_ct], "creation_time", 0.0)
    st = row[i_st].strip() if i_st is not None else ""
    dt = row[i_dt].strip() if i_dt is not None else ""
    if not st:
        if allow_no_duration:
            return submit, None
        raise BadRow("never scheduled", "empty scheduled_time")
    scheduled = to_seconds(st, "scheduled_time", 0.0)
    if scheduled < submit:
        raise BadRow("scheduled before creation", f"{scheduled:g} < {submit:g}")
    if not dt:
        if allow_no_duration:
            return submit, None
        raise BadRow("no duration", "empty deletion_time")
    deleted = to_seconds(dt, "deletion_time", 0.0)
    if deleted < scheduled:
        raise BadRow("negative duration", f"deletion_time {deleted:g} < scheduled_time {scheduled:g}")
    return submit, deleted - scheduled
