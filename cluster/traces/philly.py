"""Reader of the Microsoft Philly trace as published with Pollux (``philly.csv``).

Columns: ``timestamp`` (submission, ``YYYY-MM-DD HH:MM:SS``), ``duration`` (s), ``num_gpus``,
``gpu_time`` (= duration x num_gpus, not used), ``cluster`` (virtual cluster id). Rows are not in
time order.

Mapping onto ``JobSpec`` (see docs/traces.md):
  * ``submit_time``: seconds since the earliest submission among the good rows (timestamps are
    read as naive wall-clock times, no time zone, no DST).
  * ``num_gpus`` n is a gang split by ``split_gang(n, node_gpus)``: one worker of n GPUs when
    n <= node_gpus, n / node_gpus workers of node_gpus GPUs when that divides, else n workers of
    one GPU. Whole GPUs only (``gpu_milli`` 1000).
  * ``queue``: the virtual cluster (empty -> ``"default"``); ``user``: the virtual cluster too (a team's
    share: the trace's only tenant, which quotas and run-time prediction key on; empty when the cell is);
    ``name``: empty (the trace has none); ``job_id``: ``philly-LINE``; memory, CPU, model: not stated (0 / "").
  * ``priority``: guaranteed, or opportunistic for a seeded share ``opportunistic_fraction``: one
    ``rng.random()`` per good row in file order, opportunistic when below the fraction (so a
    larger fraction with the same seed marks a superset of jobs, and ``limit`` changes nothing).
  * ``duration_s``: ``duration`` (over 100 years, ``MAX_SECONDS``, is a "bad duration"). Zero-GPU rows are bad
    ("no gpus").

Bad-row reasons: wrong field count, bad timestamp, bad duration, negative duration,
bad num_gpus, no gpus, bad spec.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

from cluster.spec import JobSpec, SpecError
from cluster.traces.common import (
    BadRow,
    RowLog,
    TraceJob,
    TraceResult,
    check_node_gpus,
    columns,
    data_rows,
    finish,
    open_table,
    split_gang,
    to_int,
    to_seconds,
)
from colocate.base.units import parse_fraction
from colocate.base.vocab import JobClass

REQUIRED = ("timestamp", "duration", "num_gpus")
OPTIONAL = ("gpu_time", "cluster")
_EPOCH = datetime(1970, 1, 1)


def _seconds(text: str) -> float:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadRow("bad timestamp", repr(text)) from None
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    return (dt - _EPOCH).total_seconds()


def read_philly(path, *, node_gpus: int = 8, opportunistic_fraction: float = 0.0,
                rng: random.Random | None = None, limit: int | None = None,
                max_problems: int | None = None, queue: str | None = None) -> TraceResult:
    """Read a Philly trace; see the module docstring for the mapping. ``rng`` is required when
    ``opportunistic_fraction > 0``. ``limit`` keeps the first N jobs by submit time. ``queue``: every
    job in that queue instead of its virtual cluster's (the spec is made once, with it)."""
    check_node_gpus(node_gpus)
    fraction = parse_fraction(opportunistic_fraction, "opportunistic_fraction")
    if fraction > 0 and rng is None:
        raise ValueError("opportunistic_fraction > 0 needs an injected random.Random (rng=)")
    path = str(path)
    log = RowLog(path, max_problems)
    result = TraceResult(path, "philly")
    good: list[tuple[int, float, float, int, str, str]] = []  # line, absolute time, duration, gpus, queue, team
    with open_table(path, "a Philly trace") as (reader, names):
        index, result.ignored_columns = columns(path, names, "a Philly trace", REQUIRED, OPTIONAL)
        width = len(names)
        i_ts, i_dur, i_n = index["timestamp"], index["duration"], index["num_gpus"]
        i_q = index.get("cluster")
        for line, row in data_rows(reader, width, result, log):
            try:
                t = _seconds(row[i_ts])
                dur = to_seconds(row[i_dur], "duration")
                if dur < 0:
                    raise BadRow("negative duration", row[i_dur])
                n = to_int(row[i_n], "num_gpus")
                if n == 0:
                    raise BadRow("no gpus", "num_gpus is 0")
            except BadRow as e:
                log.skip(line, e.reason, e.detail)
                continue
            team = row[i_q].strip() if i_q is not None else ""
            good.append((line, t, dur, n, queue or team or "default", team))
    t0 = min((g[1] for g in good), default=0.0)
    jobs: list[TraceJob] = []
    for line, t, dur, n, vc, team in good:
        workers, gpus = split_gang(n, node_gpus)
        priority = JobClass.OPPORTUNISTIC if rng is not None and fraction > 0 and rng.random() < fraction \
            else JobClass.GUARANTEED
        try:
            spec = JobSpec(job_id=f"philly-{line}", submit_time=t - t0, workers=workers, gpus=gpus,
                           klass=priority, queue=vc, user=team)
        except SpecError as e:
            log.skip(line, "bad spec", str(e))
            continue
        jobs.append(TraceJob(spec, dur, line))
    result.skipped, result.problems = log.skipped, log.problems
    return finish(result, jobs, limit)
