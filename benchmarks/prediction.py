"""Run-time prediction from history (issue 25): causal accuracy, and backfill on the predictions.

Part 1, prediction. Each trace is replayed causally with no queueing (a job starts at its submit and
ends at submit + duration): at each submit the predictor is asked first, then told the job started;
at each end it learns the run time. So a prediction sees only the jobs that finished before that
submit, and the time run so far by those still running. Predictors: ``history-mean`` (the former
plugin: mean of the last 20 run times by user+name, then user, then GPU count, then all) and
``km`` (``cluster.predict.RunTimePredictor`` with the plugin's defaults: window 50, no recency
decay, trust 3; chosen before measuring, the sensitivity rows show other settings). Figures on the
p50: median absolute percentage error, share within 2x, share under-predicted; the share of run
times above the p90; coverage (jobs with a prediction; a job without one counts as a miss, ratio
inf). "with history" = jobs whose exact fingerprint (PAI's group) had a finished job before.

Part 2, backfill. ``colocate simulate``'s runner on each trace: ``gang-binpack`` (FIFO, the
baseline), ``backfill`` on the predictor (p90 reservations) and ``backfill`` with the true run
times (``--estimates oracle``); the figure is backfill's mean-JCT gain over FIFO as a share of the
oracle's gain.

    python benchmarks/prediction.py                     # PAI sample + Philly (64x8): ~15-30 min on 2 cores
    python benchmarks/prediction.py --no-philly-sim     # skip the Philly simulations (the slow part)
    python benchmarks/prediction.py --no-write          # print only
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C

from cluster.plugins.predictor import job_key
from cluster.predict.history import Exit, HistoryRecord, JobKey
from cluster.predict.predictor import RunTimePredictor
from cluster.sim.runner import SimOptions, simulate
from cluster.traces import load_trace

SHARED = C.ROOT.parent / "shared" / "traces"
if not SHARED.exists():
    SHARED = Path("/work/shared/traces")
PAI = SHARED / "alibaba-pai-v2020" / "pai_job_sample_day0.csv"
PHILLY = SHARED / "philly-pollux" / "philly.csv"


class HistoryMean:
    """The former plugin: mean of the last ``n`` run times of the first key with history."""

    def __init__(self, n: int = 20) -> None:
        self.n, self.h = n, {}

    @staticmethod
    def _keys(spec):
        keys = []
        if spec.user and spec.name:
            keys.append(("user+name", spec.user, spec.name))
        if spec.user:
            keys.append(("user", spec.user))
        return [*keys, ("gpus", spec.total_gpus), ("all",)]

    def predict(self, spec, now):
        for k in self._keys(spec):
            w = self.h.get(k)
            if w:
                m = sum(w) / len(w)
                return m, m, k[0]
        return None

    def started(self, spec, now):
        pass

    def finished(self, spec, wall):
        for k in self._keys(spec):
            self.h.setdefault(k, deque(maxlen=self.n)).append(wall)


class KM:
    def __init__(self, **kw) -> None:
        self.p = RunTimePredictor(**kw)

    def predict(self, spec, now):
        got = self.p.predict(job_key(spec), now)
        return None if got is None else (got.p50, got.p90, got.level)

    def started(self, spec, now):
        self.p.started(spec.job_id, job_key(spec), now)

    def finished(self, spec, wall):
        k: JobKey = job_key(spec)
        self.p.finished(HistoryRecord(spec.job_id, k.exact, k.family, k.user, k.gpus, k.gpu_type, wall,
                                      Exit.SUCCEEDED, spec.submit_time, spec.submit_time + wall))


def replay(jobs, predictor) -> list[tuple]:
    """(prediction or None, actual, had exact history) per job, causally (module docstring)."""
    events = []
    for spec, dur in jobs:
        events.append((spec.submit_time, 1, spec.job_id, spec, dur))
        events.append((spec.submit_time + dur, 0, spec.job_id, spec, dur))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    seen: set[str] = set()
    out = []
    for t, kind, _, spec, dur in events:
        exact = job_key(spec).exact
        if kind == 0:
            predictor.finished(spec, dur)
            if exact:
                seen.add(exact)
        else:
            out.append((predictor.predict(spec, t), dur, bool(exact) and exact in seen))
            predictor.started(spec, t)
    return out


def figures(res) -> dict:
    xs = [(p, a) for p, a, _ in res if a > 0]
    n = len(xs)
    if not n:
        return {"jobs": 0}
    cov = [(p, a) for p, a in xs if p is not None]
    ape = [abs(p[0] - a) / a if p is not None else math.inf for p, a in xs]
    return {
        "jobs": n, "covered": len(cov) / n,
        "mdape": statistics.median(ape),
        "within_2x": sum(1 for p, a in cov if p[0] > 0 and max(p[0] / a, a / p[0]) <= 2) / n,
        "under": sum(1 for p, a in cov if p[0] < a) / max(1, len(cov)),
        "above_p90": sum(1 for p, a in cov if a > p[1]) / max(1, len(cov)),
    }


def pct(v):
    return "-" if v is None else f"{v:.0%}"


def accuracy_rows(name: str, jobs, sensitivity: bool = True) -> list[list[str]]:
    rows = []
    variants = [("history-mean (former)", lambda: HistoryMean()), ("km (default)", lambda: KM()),
                ("km, no running jobs", None)]
    if sensitivity:
        variants += [("km, trust 1", lambda: KM(trust=1)), ("km, decay 0.9", lambda: KM(decay=0.9)),
                     ("km, window 20", lambda: KM(window=20))]
    for label, make in variants:
        if make is None:
            res = replay_without_running(jobs)
        else:
            res = replay(jobs, make())
        for subset, sel in (("all", res), ("with history", [r for r in res if r[2]])):
            f = figures(sel)
            if not f["jobs"]:
                continue
            rows.append([name, label, subset, str(f["jobs"]), pct(f["covered"]), pct(f["mdape"]),
                         pct(f["within_2x"]), pct(f["under"]), pct(f["above_p90"])])
    return rows


def replay_without_running(jobs):
    class NoRun(KM):
        def started(self, spec, now):
            pass
    return replay(jobs, NoRun())


def load(path: Path, fmt: str | None = None):
    res = load_trace(str(path), fmt, node_gpus=8)
    return [(j.spec, j.duration_s) for j in res.jobs if j.duration_s is not None]


def backfill_rows(name: str, trace: Path, cluster: str) -> list[list[str]]:
    pred = simulate(SimOptions(str(trace), ["gang-binpack", "backfill"], cluster=cluster, plots=False))
    orac = simulate(SimOptions(str(trace), ["backfill"], cluster=cluster, estimates="oracle", plots=False))
    fifo, bf, ob = pred[0]["mean_jct_s"], pred[1]["mean_jct_s"], orac[0]["mean_jct_s"]
    share = (fifo - bf) / (fifo - ob) if fifo != ob else math.nan
    acc = pred[1].get("predictor") or {}
    load = os.getloadavg()[0]
    return [[name, cluster, f"{fifo / 3600:.2f} h", f"{bf / 3600:.2f} h", f"{ob / 3600:.2f} h", f"{share:.1%}",
             pct(acc.get("median_abs_pct_error")), pct(acc.get("within_2x")), f"{load:.2f}"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pai", default=str(PAI))
    ap.add_argument("--philly", default=str(PHILLY))
    ap.add_argument("--pai-cluster", default="4x8", help="cluster shape for the PAI backfill runs (default 4x8)")
    ap.add_argument("--philly-cluster", default="64x8", help="cluster shape for the Philly backfill runs (default 64x8)")
    ap.add_argument("--no-philly-sim", action="store_true", help="skip the Philly simulations")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()
    for p in (args.pai, args.philly):
        if not Path(p).is_file():
            print(f"prediction: {p}: no such file", file=sys.stderr)
            return 2
    info = C.machine_info()
    t0 = time.perf_counter()
    con = C.console()
    pai, philly = load(Path(args.pai), "pai2020"), load(Path(args.philly), "philly")
    acc = accuracy_rows("PAI sample", pai) + accuracy_rows("Philly", philly, sensitivity=False)
    acc_load = os.getloadavg()[0]
    acc_headers = ["trace", "predictor", "subset", "n", "covered", "median APE", "within 2x", "under-predicted",
                   "above p90"]
    con.print(C.rich_table(f"causal prediction (load {acc_load:.2f})", acc_headers, acc,
                           left=("trace", "predictor", "subset")))
    bf_headers = ["trace", "cluster", "FIFO mean JCT", "backfill (predicted)", "backfill (oracle)",
                  "share of oracle's gain", "predictor median APE (sim)", "within 2x (sim)", "load"]
    bf: list[list[str]] = []
    runs = [("PAI sample", Path(args.pai), args.pai_cluster)]
    if not args.no_philly_sim:
        runs.append(("Philly", Path(args.philly), args.philly_cluster))
    for name, trace, cluster in [(None, None, None), *runs]:
        if name is not None:
            bf += backfill_rows(name, trace, cluster)
            con.print(C.rich_table("backfill on the predictions", bf_headers, bf, left=("trace",)))
        wall = time.perf_counter() - t0
        body = "\n".join([
            "## Run-time prediction from history (issue 25)", "",
            f"`{C.invocation()}`", "", *C.machine_lines(info),
            f"- load average (1 min) after the accuracy replays: {acc_load:.2f}; wall {wall:.0f} s so far", "",
            "Causal replay, no queueing (a job's prediction sees only jobs finished before its submit, and the",
            "time run so far by the jobs still running); figures on the p50 at submit:", "",
            C.markdown_table(acc_headers, acc), "",
            "Backfill (FIFO = gang-binpack; backfill reserves on the predictor's p90; oracle = true run times):", "",
            C.markdown_table(bf_headers, bf) if bf else "(not run yet)",
        ])
        if not args.no_write:
            C.update_results("prediction", body)
            print(f"recorded in {C.RESULTS}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
