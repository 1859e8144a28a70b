"""Results of one simulated policy: per-job rows and the summary figures.

Definitions (times in seconds of simulated time):
  * queue delay: first start (the placement decision) minus submission; ``wait_s`` adds every
    later period pending (after a preemption or requeue);
  * JCT: end minus submission, for jobs that succeeded; failed, cancelled and unfinished jobs
    (no duration, or still waiting at the end) are counted apart and left out of JCT figures;
  * dropped: jobs the policy ended without ever starting them (e.g. a worker larger than any node),
    counted in ``dropped`` and explained in ``dropped_reasons`` ({the core's reason: jobs});
  * failed: ``failed`` counts every job that ended failed, the dropped ones among them; the others
    (placed at least once, e.g. workers that did not start within the core's ``start_timeout_s``)
    are explained in ``failed_reasons`` ({the core's reason: jobs}), so ``dropped_reasons`` and
    ``failed_reasons`` never count a job twice;
  * makespan: the last job end; averages over time run from 0 to the simulation's end (the last
    real event);
  * ``gpu_allocation_rate``: time-averaged share of GPUs held by guaranteed placements (their
    milli-GPUs / 1000; opportunistic workers take no share, as the scheduler counts them);
    ``gpu_occupancy``: share of GPUs with at least one running worker of any class;
    ``gpu_utilization``: time-averaged modelled busy fraction of all GPUs (co-location model);
    the model conserves work (a job keeps a GPU busy ``busy x duration`` seconds in all), so over
    the whole run these differ between policies only through the run's length: ``*_loaded``
    averages only over the time some job was pending (``loaded_s``), where policies differ;
  * percentiles: linear interpolation between order statistics.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from cluster.events import SUCCEEDED
from colocate.base.vocab import TERMINAL, JobClass, JobState

CSV_FIELDS = ("job_id", "class", "ran_as", "queue", "workers", "gpus", "gpu_milli", "submit_s", "start_s", "end_s",
              "queue_delay_s", "wait_s", "jct_s", "run_s", "duration_s", "slowdown", "starts", "requeues",
              "preemptions", "state", "lucid_config", "reason")
FLOAT_FIELDS = frozenset(("submit_s", "start_s", "end_s", "queue_delay_s", "wait_s", "jct_s", "run_s", "duration_s",
                          "slowdown"))  # seconds or ratios, float or None: the only cells ``write_jobs_csv`` formats


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of ``values`` (sorted or not); None when empty."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def job_rows(sim) -> list[dict]:
    """One dict per job (CSV_FIELDS), in submission order."""
    table = sim.model.table
    rows = []
    for j in sim.jobs:
        s = j.spec
        done = j.state == SUCCEEDED
        jct = j.end - j.submit if done else None
        q = j.first_start - j.submit if j.first_start is not None else None
        wait = j.wait + ((sim.t - j.pending_since) if j.state == JobState.PENDING else 0.0)
        rows.append({
            "job_id": j.job_id, "class": j.label, "ran_as": j.klass if j.starts else "", "queue": j.queue,
            "workers": s.workers, "gpus": s.total_gpus, "gpu_milli": s.gpu_milli, "submit_s": j.submit,
            "start_s": j.first_start, "end_s": j.end, "queue_delay_s": q, "wait_s": wait, "jct_s": jct,
            "run_s": j.run_s, "duration_s": j.duration,
            "slowdown": (j.run_s / j.duration if done and j.duration else None),
            "starts": j.starts, "requeues": j.requeues, "preemptions": j.preemptions, "state": j.state or "unsubmitted",
            "lucid_config": "/".join(table.configs[j.cfg]) if j.cfg >= 0 else "",
            "reason": j.reason,
        })
    return rows


def _figures(rows: list[dict]) -> dict:
    done = [r for r in rows if r["state"] == SUCCEEDED]
    jct = [r["jct_s"] for r in done]
    q = [r["queue_delay_s"] for r in rows if r["queue_delay_s"] is not None]
    slow = [r["slowdown"] for r in done if r["slowdown"] is not None]
    return {
        "jobs": len(rows), JobState.SUCCEEDED: len(done),
        JobState.FAILED: sum(1 for r in rows if r["state"] == JobState.FAILED),
        "unfinished": sum(1 for r in rows if r["state"] not in TERMINAL),
        "never_started": sum(1 for r in rows if r["start_s"] is None),
        "dropped": sum(1 for r in rows if _dropped(r)),
        "mean_jct_s": _mean(jct), "p50_jct_s": percentile(jct, 50), "p99_jct_s": percentile(jct, 99),
        "mean_queue_s": _mean(q), "p50_queue_s": percentile(q, 50), "p99_queue_s": percentile(q, 99),
        "mean_slowdown": _mean(slow),
        "preemptions": sum(r["preemptions"] for r in rows),
    }


def _dropped(row: dict) -> bool:
    """A job the policy ended without ever starting it (e.g. no node could ever hold one of its workers)."""
    return row["start_s"] is None and row["state"] in TERMINAL and row["state"] != SUCCEEDED


def dropped_reasons(rows: list[dict]) -> dict[str, int]:
    """Why jobs were dropped: {reason: jobs}, most frequent first."""
    return _reasons(r for r in rows if _dropped(r))


def failed_reasons(rows: list[dict]) -> dict[str, int]:
    """Why jobs that were placed failed: {reason: jobs} over the failed jobs not dropped (those are in
    ``dropped_reasons``), most frequent first; the counts add up to the failed jobs that were placed."""
    return _reasons(r for r in rows if r["state"] == JobState.FAILED and not _dropped(r))


def _reasons(rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        why = r["reason"] or "no reason given"
        out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def predictor_accuracy(core) -> dict | None:
    """Accuracy of the ``predictor`` plugin's predictions made at each job's submit, over the jobs that
    succeeded (None when the policy has no predictor): ``cluster.plugins.predictor.accuracy``'s
    figures (median absolute percentage error of the p50, share within 2x, share under-predicted,
    share above the p90, coverage by key level) plus the mean absolute percentage error and the
    median ratio predicted/actual."""
    pred = core.fw.plugin("predictor")
    if pred is None:
        return None
    out = pred.accuracy()
    errs = [(p, a) for p, _, a, _ in pred.errors if a > 0]
    if errs:
        out["mean_abs_pct_error"] = _mean([abs(p - a) / a for p, a in errs])
        out["median_ratio_pred_over_actual"] = percentile([p / a for p, a in errs], 50)
    return out


def summarize(sim, policy: str, rows: list[dict] | None = None, skipped: dict | None = None,
              load_wall_s: float | None = None, skipped_nodes: dict | None = None) -> dict:
    """The summary object of one policy run (``summary.json`` holds a list of these). ``skipped``: bad trace
    rows by reason (``skipped_rows``); ``skipped_nodes``: bad rows of the node list by reason
    (``skipped_node_rows``; empty for a ``--cluster`` shape)."""
    rows = rows if rows is not None else job_rows(sim)
    end = sim.t
    cap = sim.capacity
    denom = cap * end if cap and end > 0 else 0.0
    out: dict[str, Any] = {"policy": policy}  # a JSON object: figures, counts and nested tables
    out.update(_figures(rows))
    out.update({
        "makespan_s": sim.makespan,
        "sim_end_s": end,
        "gpus": cap,
        "gpu_allocation_rate": sim.acc_alloc / 1000 / denom if denom else None,
        "gpu_occupancy": sim.acc_occ / denom if denom else None,
        "gpu_utilization": sim.acc_busy / denom if denom else None,
        "loaded_s": sim.loaded_s,
        "gpu_occupancy_loaded": sim.acc_occ_loaded / (cap * sim.loaded_s) if cap and sim.loaded_s else None,
        "gpu_utilization_loaded": sim.acc_busy_loaded / (cap * sim.loaded_s) if cap and sim.loaded_s else None,
        "skipped_rows": dict(sorted((skipped or {}).items())),
        "skipped_node_rows": dict(sorted((skipped_nodes or {}).items())),
        "dropped_reasons": dropped_reasons(rows),
        "failed_reasons": failed_reasons(rows),
        "sim_wall_s": round(sim.wall_s, 3),
        "load_wall_s": None if load_wall_s is None else round(load_wall_s, 3),
        "jobs_per_s": round(len(rows) / sim.wall_s) if sim.wall_s > 0 else None,
        "batches": sim.batches, "ticks": sim.ticks_sent, "node_reports": sim.reports_sent,
        "progress_reports": sim.progress_sent,
        "core": {k: v for k, v in sim.core.stats.items() if v},
        "gang_spread": gang_spread(sim),
    })
    labels = {r["class"] for r in rows}
    if JobClass.OPPORTUNISTIC in labels:
        out["by_class"] = {k: _figures([r for r in rows if r["class"] == k]) for k in sorted(labels)}
        for k, v in out["by_class"].items():
            v["gpu_seconds_run"] = sum(r["run_s"] * (r["gpus"] or 0) for r in rows if r["class"] == k)
    acc = predictor_accuracy(sim.core)
    if acc is not None:
        out["predictor"] = acc
    return out


def write_jobs_csv(rows: list[dict], path: Path) -> None:
    """``rows`` (``job_rows``) as CSV, columns ``CSV_FIELDS``: None empty, floats with at most 3
    decimals (integral ones without), infinity ``inf``."""
    fmt = _fmt
    floats = [i for i, k in enumerate(CSV_FIELDS) if k in FLOAT_FIELDS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            cells = [r[k] for k in CSV_FIELDS]
            for i in floats:
                cells[i] = fmt(cells[i])
            w.writerow(cells)


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if v.is_integer():
            return str(int(v))
        if math.isinf(v):
            return "inf"
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return v


def gang_spread(sim) -> dict[str, Any]:
    """Over the jobs of more than one GPU that were placed: how many, and the mean nodes and switches their
    latest placement spans (``SimJob.span``: switches by the nodes' labels). Switches are not known (None) when
    no node has a switch label."""
    spans = [j.span for j in sim.jobs if j.spec.total_gpus > 1 and j.span[0]]
    n = len(spans)
    known = n and any(s.switch for s in sim.node_specs)
    return {"jobs": n, "mean_nodes": sum(s[0] for s in spans) / n if n else None,
            "mean_switches": sum(s[1] for s in spans) / n if known else None,
            "one_switch_share": sum(1 for s in spans if s[1] == 1) / n if known else None}
