"""Run-time prediction from history (issue 25): causal accuracy, and backfill on the predictions.

Part 1, prediction. Each trace is replayed causally with no queueing (a job starts at its submit and
ends at submit + duration): at each submit the predictor is asked first, then told the job started;
at each end it learns the run time. So a prediction sees only the jobs that finished before that
submit, and the time run so far by those still running. Predictors: ``history-mean`` (the plugin
before issue 25: mean of the last 20 run times by user+name, then user, then GPU count, then all)
and ``km`` (``cluster.predict.RunTimePredictor`` with the plugin's defaults: window 50, no recency
decay, trust 3; the sensitivity rows show other settings). Figures on the p50: median absolute
percentage error, share within 2x, share under-predicted; the share of run times above the p90;
coverage (jobs with a prediction; a job without one counts as a miss, ratio inf). "with history" =
jobs whose exact fingerprint (PAI's group) had a finished job before. Two reference rows on the PAI
sample are not predictors: ``hindsight`` picks, per job and after the fact, the best of the causal
candidates a level-based predictor could give (per key level: the median, the last, the median of
the last 3 and the longest of its finished jobs, 2x and 10x the longest time run by its running
jobs): what any rule choosing among them could at best reach; ``group_dur`` is the trace's own
column, computed over the whole trace, future included (a leaky ceiling, never an input).

Part 2, backfill. ``colocate simulate``'s runner on each trace and cluster shape: ``gang-binpack``
(FIFO, the baseline), ``backfill`` on the predictor (the preset's defaults, and the variants
listed; progress reports at the simulator's defaults unless a variant says otherwise) and ``backfill`` with the
true run times (``--estimates oracle``, no progress reports: they would only add cycles); the figure is
backfill's mean-JCT gain over FIFO as a share of the oracle's gain. A weeks-long replay under
overload (Philly) is chaotic: a small change of one decision moves the mean JCT by several percent,
so each setting runs on three cluster sizes around the one the target names.

    python benchmarks/prediction.py                     # PAI sample + Philly: ~1.5 h on 2 cores
    python benchmarks/prediction.py --philly-sizes 64x8 # only the target size on Philly
    python benchmarks/prediction.py --no-philly-sim     # skip the Philly simulations (the slow part)
    python benchmarks/prediction.py --no-write          # print only
    python benchmarks/prediction.py --no-pai-sim --philly-sizes 64x8 --variants progress --section prediction-philly
"""

from __future__ import annotations

import argparse
import csv
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

from cluster.config import parse_config, preset
from cluster.plugins.predictor import job_key
from cluster.predict.history import Exit, HistoryRecord, JobKey, levels
from cluster.predict.predictor import RunTimePredictor
from cluster.sim.colocation import ColocationModel, LucidTable
from cluster.sim.records import SimConfig
from cluster.sim.runner import run_policy
from cluster.sim.workload import load_workload
from cluster.traces import load_trace

SHARED = C.ROOT.parent / "shared" / "traces"
if not SHARED.exists():
    SHARED = Path("/work/shared/traces")
PAI = SHARED / "alibaba-pai-v2020" / "pai_job_sample_day0.csv"
PHILLY = SHARED / "philly-pollux" / "philly.csv"
BACKFILL = ["fifo", "gang", "binpack", "backfill", "predictor"]
# (label, [plugin.X] tables on top of the backfill preset); the first is the preset itself
VARIANTS = [
    ("default", {}),
    ("no progress reports (--known-total 0)", {"sim": {"known_total": 0.0}}),
    ("every job's total known (--known-total 1)", {"sim": {"known_total": 1.0}}),
    ("overdue = now (before issue 25's fix)", {"backfill": {"overdue": "now"}}),
    ("quantile = p50", {"backfill": {"quantile": "p50"}}),
    ("running jobs left out", {"predictor": {"censor_running": False}}),
    ("order = queue (classic EASY; its oracle too)", {"backfill": {"order": "queue"}}),
]


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
        got = self.p.predict(job_key(spec), now, spec.submit_time)
        return None if got is None else (got.p50, got.p90, got.level)

    def started(self, spec, now):
        self.p.started(spec.job_id, job_key(spec), now, spec.submit_time)

    def finished(self, spec, wall):
        k: JobKey = job_key(spec)
        self.p.finished(HistoryRecord(spec.job_id, k.exact, k.family, k.user, k.gpus, k.gpu_type, wall,
                                      Exit.SUCCEEDED, spec.submit_time, spec.submit_time + wall))


class Hindsight:
    """Not a predictor: per job, the causal candidate nearest the actual run time (module docstring)."""

    def __init__(self) -> None:
        self.fin: dict[tuple, list[float]] = {}
        self.run: dict[tuple, dict[str, float]] = {}
        self.actual: dict[str, float] = {}

    def candidates(self, spec, now) -> list[float]:
        out: list[float] = []
        for _, lk in levels(job_key(spec)):
            f = self.fin.get(lk)
            if f:
                out += [statistics.median(f), f[-1], statistics.median(f[-3:]), max(f)]
            r = [now - s for s in self.run.get(lk, {}).values() if now > s]
            if r:
                out += [2 * max(r), 10 * max(r)]
        return out

    def predict(self, spec, now):
        a = self.actual[spec.job_id]
        c = [x for x in self.candidates(spec, now) if x > 0]
        if not c or a <= 0:
            return None
        best = min(c, key=lambda x: abs(math.log(x / a)))
        return best, best, "hindsight"

    def started(self, spec, now):
        for _, lk in levels(job_key(spec)):
            self.run.setdefault(lk, {})[spec.job_id] = now

    def finished(self, spec, wall):
        for _, lk in levels(job_key(spec)):
            self.run.get(lk, {}).pop(spec.job_id, None)
            self.fin.setdefault(lk, []).append(wall)


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


def accuracy_rows(name: str, jobs, sensitivity: bool = True, hindsight: bool = False,
                  leaky: list | None = None) -> list[list[str]]:
    rows = []
    variants = [("history-mean (former)", HistoryMean), ("km (default)", KM),
                ("km, running jobs left out", lambda: KM(running=False)), ("km, no near level", lambda: KM(near=0))]
    if sensitivity:
        variants += [("km, trust 1", lambda: KM(trust=1)), ("km, decay 0.9", lambda: KM(decay=0.9)),
                     ("km, window 20", lambda: KM(window=20)), ("km, window 100", lambda: KM(window=100))]
    if hindsight:
        def best():
            h = Hindsight()
            h.actual = {s.job_id: d for s, d in jobs}
            return h
        variants.append(("hindsight (a bound, not a predictor)", best))
    for label, make in variants:
        res = replay(jobs, make())
        for subset, sel in (("all", res), ("with history", [r for r in res if r[2]])):
            rows += _row(name, label, subset, sel)
    if leaky is not None:
        had = history_flags(jobs)
        res = [(None if g is None else (g, g, "leaky"), d, had[s.job_id]) for (s, d), g in zip(jobs, leaky)]
        for subset, sel in (("all", res), ("with history", [r for r in res if r[2]])):
            rows += _row(name, "group_dur column (leaky ceiling)", subset, sel)
    return rows


def history_flags(jobs) -> dict[str, bool]:
    """Job id -> whether its exact fingerprint had a finished job before its submit."""
    ends = sorted((s.submit_time + d, job_key(s).exact) for s, d in jobs)
    out = {}
    for s, _ in jobs:
        exact = job_key(s).exact
        out[s.job_id] = bool(exact) and any(e <= s.submit_time and x == exact for e, x in ends)
    return out


def _row(name, label, subset, sel) -> list[list[str]]:
    f = figures(sel)
    if not f["jobs"]:
        return []
    return [[name, label, subset, str(f["jobs"]), pct(f["covered"]), pct(f["mdape"]), pct(f["within_2x"]),
             pct(f["under"]), pct(f["above_p90"])]]


def load(path: Path, fmt: str | None = None):
    res = load_trace(str(path), fmt, node_gpus=8)
    return [(j.spec, j.duration_s) for j in res.jobs if j.duration_s is not None]


def leaky_group_dur(path: Path, jobs) -> list[float | None]:
    """The file's ``group_dur`` per job of ``jobs`` (by job id), for the leaky-ceiling row only."""
    with open(path, newline="") as f:
        col = {r["job_id"]: r.get("group_dur") for r in csv.DictReader(f)}
    out: list[float | None] = []
    for s, _ in jobs:
        try:
            out.append(float(col.get(s.job_id) or "nan"))
        except ValueError:
            out.append(None)
    return [v if v is not None and math.isfinite(v) and v > 0 else None for v in out]


def mean_jct(trace: Path, cluster: str, tables: dict | None, estimates: str = "predicted",
             plugins: list[str] | None = None, progress=None, prepare=None,
             backfill: str = "backfill") -> tuple[float, dict]:
    """Mean JCT (s) and the predictor's accuracy of one simulated run. ``tables``: [plugin.X] tables, and
    ``sim``: ``SimConfig`` fields (the simulator's defaults otherwise: progress reports on). ``prepare``: a
    function of the loaded workload that returns the one to run (None: as loaded). ``backfill``: the plugin
    that takes backfill's place in the preset (without ``plugins``)."""
    tables = dict(tables or {})
    sim = SimConfig(**tables.pop("sim", {}))
    if plugins is None:
        raw = {"plugins": [backfill if p == "backfill" else p for p in BACKFILL], "plugin": tables}
        cfg = parse_config(raw, "backfill")
    else:
        cfg = parse_config({"plugins": plugins}, "gang-binpack")
    wl = load_workload(str(trace), cluster=cluster, estimates=estimates)
    if prepare is not None:
        wl = prepare(wl)
    _, _, summary = run_policy(wl, cfg.name, cfg, ColocationModel(LucidTable.empty(), "adaptive"), sim,
                               progress=progress)
    return summary["mean_jct_s"], summary.get("predictor") or {}


def share_of_gain(fifo: float, backfill: float, oracle: float) -> float:
    """Backfill's mean-JCT gain over FIFO as a share of the oracle's (nan when the oracle gains nothing)."""
    return (fifo - backfill) / (fifo - oracle) if fifo != oracle else math.nan


def backfill_rows(name: str, trace: Path, sizes: list[str], variants, con) -> list[list[str]]:
    """One row per cluster size and backfill setting; a progress bar per simulation on the console (a replay of
    Philly's 82,247 jobs with backfill takes minutes)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    rows: list[list[str]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs ended"),
                  TimeElapsedColumn(), console=con, transient=True) as bar:

        def run(what: str, *args, **kw):
            task = bar.add_task(f"{name} {cluster}: {what}", total=None)
            try:
                return mean_jct(*args, **kw, progress=lambda _, done, total: bar.update(task, completed=done,
                                                                                       total=total))
            finally:
                bar.remove_task(task)

        for cluster in sizes:
            fifo, _ = run("FIFO", trace, cluster, None, plugins=list(preset("gang-binpack").plugins))
            oracles: dict[str | None, float] = {}
            for label, tables in variants:
                # the oracle: the same backfill order on the true run times (no progress report adds to what
                # they know); the other settings only matter for estimates it does not use
                order = tables.get("backfill", {}).get("order")
                if order not in oracles:
                    t: dict = {"sim": {"progress_s": 0.0}}
                    if order is not None:
                        t["backfill"] = {"order": order}
                    oracles[order], _ = run(f"backfill (oracle{'' if order is None else ', order = ' + order})",
                                            trace, cluster, t, "oracle")
                orac = oracles[order]
                bf, acc = run(f"backfill ({label})", trace, cluster, tables)
                share = share_of_gain(fifo, bf, orac)
                rows.append([name, cluster, label, f"{fifo / 3600:.2f} h", f"{bf / 3600:.2f} h",
                             f"{orac / 3600:.2f} h", f"{share:.1%}", pct(acc.get("median_abs_pct_error")),
                             pct(acc.get("within_2x")), f"{os.getloadavg()[0]:.2f}"])
                bar.console.print(" | ".join(rows[-1]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pai", default=str(PAI))
    ap.add_argument("--philly", default=str(PHILLY))
    ap.add_argument("--pai-sizes", default="3x8,4x8,5x8,6x8", help="cluster shapes for the PAI backfill runs")
    ap.add_argument("--philly-sizes", default="56x8,64x8,72x8", help="cluster shapes for the Philly backfill runs")
    ap.add_argument("--variants", default="all", choices=("all", "default", "progress", "order"),
                    help="which backfill settings to run: all, the default only, the default and the two "
                         "--known-total settings (progress), or the default and queue-order backfill (order)")
    ap.add_argument("--no-philly-sim", action="store_true", help="skip the Philly simulations")
    ap.add_argument("--no-pai-sim", action="store_true", help="skip the PAI sample's simulations")
    ap.add_argument("--section", default="prediction", type=C.section_name, help="the RESULTS.md section to write (default prediction)")
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
    acc = (accuracy_rows("PAI sample", pai, hindsight=True, leaky=leaky_group_dur(Path(args.pai), pai))
           + accuracy_rows("Philly", philly, sensitivity=False))
    acc_load = os.getloadavg()[0]
    acc_headers = ["trace", "predictor", "subset", "n", "covered", "median APE", "within 2x", "under-predicted",
                   "above p90"]
    con.print(C.rich_table(f"causal prediction (load {acc_load:.2f})", acc_headers, acc,
                           left=("trace", "predictor", "subset")))
    variants = {"all": VARIANTS, "default": VARIANTS[:1], "progress": VARIANTS[:3],
                "order": [VARIANTS[0], VARIANTS[-1]]}[args.variants]
    bf_headers = ["trace", "cluster", "backfill setting", "FIFO mean JCT", "backfill (predicted)",
                  "backfill (oracle)", "share of oracle's gain", "predictor median APE (sim)", "within 2x (sim)",
                  "load"]
    bf: list[list[str]] = []
    runs = [] if args.no_pai_sim else [("PAI sample", Path(args.pai), args.pai_sizes.split(","))]
    if not args.no_philly_sim:
        runs.append(("Philly", Path(args.philly), args.philly_sizes.split(",")))
    for name, trace, sizes in [(None, None, None), *runs]:
        if name is not None:
            bf += backfill_rows(name, trace, sizes, variants, con)
            con.print(C.rich_table("backfill on the predictions", bf_headers, bf, left=("trace", "backfill setting")))
        wall = time.perf_counter() - t0
        body = "\n".join([
            "## Run-time prediction from history (issue 25)", "",
            f"`{C.invocation()}`", "", *C.machine_lines(info),
            f"- load average (1 min) after the accuracy replays: {acc_load:.2f}; wall {wall:.0f} s so far", "",
            "Causal replay, no queueing (a job's prediction sees only jobs finished before its submit, and the",
            "time run so far by the jobs still running); figures on the p50 at submit:", "",
            C.markdown_table(acc_headers, acc), "",
            "Backfill (FIFO = gang-binpack; backfill reserves on the predictor; oracle = true run times; the",
            "predictor's figures here are at each job's submit in the simulated run, with queueing):", "",
            C.markdown_table(bf_headers, bf) if bf else "(not run yet)",
        ])
        if not args.no_write:
            C.update_results(args.section, body)
            print(f"recorded in {C.RESULTS}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
