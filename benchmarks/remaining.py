"""Remaining time after 10% of a job's iterations, with a known total, on real runs of the examples (issue 25).

A real ``colocate scheduler`` and one ``colocate node --scheduler`` (one simulated GPU) run on this
machine. Each example (``train_cnn``, ``train_transformer``, ``train_recsys``) runs 5 times with varied
arguments (batch size, sequence length and vocabulary where the script has them, host time per
iteration, iterations), one job at a time, submitted with its total (``iterations=N``, as
``colocate submit --iterations N`` does). The benchmark polls ``status JOB`` every 0.1 s and keeps each
new progress summary the node sent (iterations done, step p50/p90 over the node's window, total).

One ``RunTimePredictor`` is fed as the scheduler's is, in time order, with the runs' fingerprints as
keys (``cluster.predict.fingerprint``; the 5 runs of an example are one family): each job's start, each
summary at the time it was first seen less the node's ``since_report_s``, each end. At the first summary
showing at least ``--at`` (10%) of the iterations done, the prediction is ``remaining(now)``: (total -
done) x the window's mean step time, less the time since the summary, plus the end offset learnt from
the earlier runs (how far past the projection of their last summary they ended: the interpreter's
exit). It is compared with the actual remaining time: the job's end as the scheduler journaled it (its
worker exited: the GPU is free) less the time of the prediction. Columns: the prediction, the actual,
the error (|predicted - actual| / actual), and the split of the actual time between the remaining
iterations (to the last mini-batch, from the node's ``--record``) and the exit tail (last mini-batch to
the end as journaled); "step drift" is the mean step of the iterations after the prediction over the
window's mean at it (what no projection from the first 10% can know: on a shared machine, mostly other
users' processes taking the simulated GPU's core).

    python benchmarks/remaining.py                 # 15 runs, about 6 min on 2 shared cores
    python benchmarks/remaining.py --examples cnn --runs 2 --no-write
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C
import _live_runs as L

SECTION = "remaining"

# per example: 5 argument sets (script arguments, iterations): batch size, size, host time and length varied
ARGS = {
    "cnn": [(["--batch-size", "32", "--host-ms", "10"], 300),
            (["--batch-size", "16", "--host-ms", "5"], 400),
            (["--batch-size", "64", "--host-ms", "10"], 200),
            (["--batch-size", "48", "--host-ms", "20"], 250),
            (["--batch-size", "8", "--host-ms", "0"], 500)],
    "transformer": [(["--batch-size", "8", "--seq-len", "32", "--vocab", "1000", "--host-ms", "10"], 300),
                    (["--batch-size", "4", "--seq-len", "64", "--vocab", "1000", "--host-ms", "5"], 300),
                    (["--batch-size", "16", "--seq-len", "16", "--vocab", "2000", "--host-ms", "10"], 300),
                    (["--batch-size", "8", "--seq-len", "48", "--vocab", "500", "--host-ms", "20"], 250),
                    (["--batch-size", "12", "--seq-len", "32", "--vocab", "4000", "--host-ms", "0"], 300)],
    "recsys": [(["--batch-size", "256", "--host-ms", "10"], 300),
               (["--batch-size", "128", "--host-ms", "5"], 400),
               (["--batch-size", "512", "--host-ms", "10"], 250),
               (["--batch-size", "1024", "--host-ms", "20"], 150),
               (["--batch-size", "64", "--host-ms", "0"], 500)],
}


def job_key(name: str, script_args: list[str], iters: int):
    """The job's key as the scheduler forms it: exact and family fingerprints of user, script and arguments."""
    import getpass

    from cluster.predict.fingerprint import fingerprints, script_hash
    from cluster.predict.history import JobKey

    user = getpass.getuser()
    exact, family = fingerprints(user, script_hash(C.example_path(name).read_bytes()),
                                 ["--iters", str(iters), "--log-every", "0", *script_args])
    return JobKey(exact, family, user, 1, "colocate-sim")


class Learner:
    """One ``RunTimePredictor`` fed as the scheduler's would be, in time order: a job's start, each progress
    summary as it was seen (its time less the node's ``since_report_s``), its end. A prediction at a summary
    sees only what came before it: earlier jobs' ends (their end offsets) and this job's summaries."""

    def __init__(self) -> None:
        from cluster.predict.predictor import RunTimePredictor

        self.model = RunTimePredictor()

    def feed(self, seen, job_id: str) -> None:
        p = seen.progress
        if p.total_iterations:
            self.model.progress(job_id, p.iterations, p.total_iterations, p.step_p50_s, seen.at - p.since_report_s,
                                p.step_p90_s, p.step_mean_s or None)

    def run(self, run, key, at_fraction: float):
        """Feed ``run`` whole; the prediction made at its first summary with >= ``at_fraction`` of the total
        done, as (seen, Prediction), or None."""
        from cluster.predict.history import Exit, HistoryRecord

        self.model.started(run.job_id, key, run.started_at)
        got = None
        for s in run.seen:
            self.feed(s, run.job_id)
            p = s.progress
            if got is None and p.total_iterations and p.iterations >= at_fraction * p.total_iterations:
                pred = self.model.remaining(run.job_id, key, s.at)
                if pred is not None and pred.level == "progress":
                    got = (s, pred)
        exit_ = Exit.SUCCEEDED if run.state == "succeeded" else Exit.FAILED
        self.model.finished(HistoryRecord(run.job_id, key.exact, key.family, key.user, key.gpus, key.gpu_type,
                                          run.ended_at - run.started_at, exit_, run.submitted_at, run.ended_at))
        return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", nargs="+", default=list(ARGS), choices=list(ARGS))
    p.add_argument("--runs", type=int, default=5, help="argument sets per example, 1..5 (default 5)")
    p.add_argument("--at", type=float, default=0.10, help="predict at this share of the iterations (default 0.10)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    p.add_argument("--log-level", default="warning", help="the daemons' log level")
    args = p.parse_args(argv)
    if not 1 <= args.runs <= 5:
        p.error("--runs must be 1..5")


    console = C.console()
    info = C.machine_info()
    rows, loads, results = [], [], []  # results: (example, {estimator: error})
    t_start = time.time()
    learner = Learner()
    with L.Cluster("1", log_level=args.log_level, record=True) as cluster:
        for name in args.examples:
            for script_args, iters in ARGS[name][:args.runs]:
                cmd = [sys.executable, str(C.example_path(name)), "--iters", str(iters), "--log-every", "0",
                       *script_args]
                run = cluster.run_job(cmd, iterations=iters, name=f"train_{name}.py")
                loads.append(os.getloadavg()[0])
                key = job_key(name, script_args, iters)
                offset = learner.model.end_offset(key)  # what the earlier runs taught, before this one's end
                got = learner.run(run, key, args.at)
                if run.state != "succeeded" or got is None or run.ended_at is None:
                    raise SystemExit(f"{name} {' '.join(script_args)}: {run.state}, exit {run.exit_code}, "
                                     f"{len(run.seen)} summaries: no prediction (logs in {cluster.tmp})")
                seen, pred = got
                pr = seen.progress
                actual = run.ended_at - seen.at
                left, since = pr.total_iterations - pr.iterations, pr.since_report_s
                estimates = {"shipped": pred.p50,  # left x mean + the learnt offset
                             "mean, no offset": max(0.0, left * (pr.step_mean_s or pr.step_p50_s) - since),
                             "p50, no offset (former)": max(0.0, left * pr.step_p50_s - since)}
                errs = {k: abs(v - actual) / actual for k, v in estimates.items()}
                results.append((name, errs))
                durations = cluster.durations(run.job_id)
                after = durations[pr.iterations:]
                drift = statistics.mean(after) / pr.step_mean_s if after and pr.step_mean_s else float("nan")
                last_batch = cluster.last_report_wall(run.job_id)
                rows.append([f"train_{name}", " ".join(script_args).replace("--", ""), str(iters),
                             f"{pr.iterations} ({pr.iterations / iters:.0%})", f"{pr.window}",
                             f"{pr.step_p50_s * 1e3:.1f}", f"{pr.step_mean_s * 1e3:.1f}", f"{offset:.2f}",
                             f"{pred.p50:.2f}", f"{pred.p90:.2f}", f"{actual:.2f}", f"{errs['shipped']:.1%}",
                             f"{last_batch - seen.at:.2f}" if last_batch else "?",
                             f"{run.ended_at - last_batch:.2f}" if last_batch else "?", f"{drift:.2f}",
                             f"{loads[-1]:.2f}"])
                console.print(f"{name} {' '.join(script_args)} x{iters}: predicted {pred.p50:.2f} s, "
                              f"actual {actual:.2f} s, error {errs['shipped']:.1%}")

    headers = ["example", "arguments", "iterations", "done at prediction", "window", "step p50 ms", "step mean ms",
               "end offset s", "predicted p50 s", "predicted p90 s", "actual s", "error", "to last batch s",
               "exit tail s", "step drift", "load"]
    estimators = list(results[0][1])
    summary = []
    for ex in [*args.examples, None]:
        errs = [e for n, e in results if ex is None or n == ex]
        summary.append([f"train_{ex}" if ex else "all", str(len(errs)),
                        *(f"{statistics.median(e[k] for e in errs):.1%}" for k in estimators),
                        f"{max(e['shipped'] for e in errs):.1%}"])
    s_headers = ["example", "runs", *(f"median APE: {k}" for k in estimators), "max (shipped)"]
    console.print(C.rich_table(f"remaining time at >= {args.at:.0%} of the iterations", headers, rows,
                               left=("example", "arguments")))
    console.print(C.rich_table("median absolute percentage error", s_headers, summary, left=("example",)))
    if args.no_write:
        return 0
    body = "\n".join([
        "## Remaining time after 10% of the iterations, known total: real runs of the examples (issue 25)", "",
        f"`{C.invocation()}`", "", *C.machine_lines(info),
        f"- load average (1 min) after each run: median {statistics.median(loads):.2f}, max {max(loads):.2f}; "
        f"wall {time.time() - t_start:.0f} s",
        "- a real `colocate scheduler` and one `colocate node --scheduler` (one simulated GPU); one job at a "
        "time, submitted with its total; the summary is the node's (`colocate status JOB`), the prediction "
        "`RunTimePredictor.remaining` fed causally (earlier runs' ends, this run's summaries); actual = the "
        "job's journaled end - the time of the prediction; step drift = mean step after the prediction / "
        "the window's mean at it", "",
        C.markdown_table(headers, rows), "",
        "Median absolute percentage error of the shipped estimator and, on the same summaries, of the "
        "projection without the learnt end offset and of the former one (p50 step, no offset):", "",
        C.markdown_table(s_headers, summary),
    ])
    C.update_results(SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
