"""``predictor`` (seed 000, issue 25): run-time prediction from the jobs' own history, pure. Before
a job starts, p50 and p90 of its run time from the first key level with history (exact fingerprint
with the same GPUs, exact, family, user + GPUs, user, GPU count, all jobs); after start, the
remaining time from progress reports. ``backfill`` plans on it.

Wraps ``cluster.predict.RunTimePredictor`` (see it for the estimator): before start, p50 and p90
from the first key level with history, from the exact fingerprint with the same GPUs down to the
family, then the ``near`` jobs of the same user and GPU count submitted nearest to it (0: none),
then user + GPUs, the user, the GPU count, all jobs; after start, the remaining time from progress
reports (the iterations left times the recent mean step, plus the end offset learnt from finished
jobs), or from the run-time distribution conditioned on the time already run. A job's key: its
``fingerprint`` (else ``user/name`` when it has a name), ``family``, ``user``, total GPUs and GPU
model. It learns each ended job's running time (start to end, scheduler clock) and the running
jobs (censored), so in a replay its predictions use only what had happened by then.

Each job's prediction at submit is kept; at its successful end (prediction, actual) goes to
``errors`` (p50, p90, actual seconds, level) for ``accuracy()``. Other plugins call
``predict(spec, now)`` (p50 or None), ``quantiles(spec, now)`` (a ``Prediction`` or None),
``expected_end(job, q, now)`` and ``progress(...)``; ``take_moved()`` drains the jobs whose
projected end a progress report moved. ``default_s`` (0: unknown) is the p50 and p90 before any
history."""

from __future__ import annotations

from cluster.events import FAILED, SUCCEEDED, JobProgressed
from cluster.jobs import Job
from cluster.params import Param
from cluster.points import SUCCESS, Plugin, Status, register
from cluster.predict.history import Exit, HistoryRecord, JobKey
from cluster.predict.predictor import Prediction, RunTimePredictor
from cluster.spec import JobSpec


def job_key(spec: JobSpec) -> JobKey:
    exact = spec.fingerprint or (f"{spec.user}/{spec.name}" if spec.name else "")
    return JobKey(exact, spec.family, spec.user, spec.total_gpus, spec.gpu_model)


@register
class Predictor(Plugin):
    name = "predictor"
    PARAMS = {
        "history": Param(50, "int", lambda v: v >= 1, "an integer >= 1"),
        "decay": Param(1.0, "float", lambda v: 0 < v <= 1, "a number in (0, 1]"),
        "trust": Param(3, "int", lambda v: v >= 1, "an integer >= 1"),
        "censor_running": Param(True, "bool"),  # the running jobs count (censored) in the estimate
        "near": Param(5, "int", lambda v: v >= 0, "an integer >= 0 (0: off)"),  # jobs submitted nearest: a level
        "default_s": Param(0.0, "float", lambda v: v >= 0, "seconds >= 0 (0: unknown)"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self.model = RunTimePredictor(self.p["history"], self.p["decay"], self.p["trust"],
                                      self.p["censor_running"], self.p["near"])
        self._at_submit: dict[str, Prediction | None] = {}
        self._moved: dict[str, float] = {}  # job id -> new projected end (seconds, scheduler clock)
        self.errors: list[tuple[float, float, float, str]] = []  # (p50, p90, actual, level) per finished job
        self.uncovered = 0  # finished jobs that had no prediction at submit

    def quantiles(self, spec: JobSpec, now: float) -> Prediction | None:
        """p50/p90 run time of a job not yet started (seconds), the level and history count behind it."""
        pred = self.model.predict(job_key(spec), now, spec.submit_time)
        if pred is None and self.p["default_s"]:
            return Prediction(self.p["default_s"], self.p["default_s"], "default", 0)
        return pred

    def predict(self, spec: JobSpec, now: float | None = None) -> float | None:
        """Predicted run time (p50) in seconds, or None when unknown."""
        pred = self.quantiles(spec, spec.submit_time if now is None else now)
        return None if pred is None else pred.p50

    def expected_end(self, job: Job, q: str, now: float) -> float | None:
        """Expected end (scheduler clock) of a running job at quantile ``q`` ("p50" | "p90"), None: unknown."""
        rem = self.model.remaining(job.job_id, job_key(job.spec), now)
        if rem is None:
            return None
        return now + (rem.p90 if q == "p90" else rem.p50)

    def progress(self, job: Job, done: int, total: int, step_p50_s: float, now: float,
                 step_p90_s: float | None = None, step_mean_s: float | None = None) -> bool:
        """A running job's progress report (iterations done of total, recent seconds per iteration: median,
        p90, mean); its new projected end (p90) is queued for ``take_moved``. False when the report was
        unusable."""
        if not self.model.progress(job.job_id, done, total, step_p50_s, now, step_p90_s, step_mean_s):
            return False
        end = self.expected_end(job, "p90", now)
        if end is not None:
            self._moved[job.job_id] = end
        return True

    def on_progress(self, job: Job, progress: JobProgressed, now: float) -> bool:
        """The core's ``JobProgressed``: ``progress()`` as of when the node reported it."""
        return self.progress(job, progress.done, progress.total, progress.step_p50_s, now - progress.age_s,
                             progress.step_p90_s, progress.step_mean_s)

    def on_history(self, records: list[HistoryRecord]) -> None:
        """The journal's history (a restart): every ended job's run time, as if it had ended here."""
        for rec in records:
            self.model.finished(rec)

    def take_moved(self) -> dict[str, float]:
        """Job id -> projected end moved by progress since the last call (then forgotten)."""
        out, self._moved = self._moved, {}
        return out

    def pre_enqueue(self, job: Job) -> Status:
        self._at_submit.setdefault(job.job_id, self.quantiles(job.spec, job.spec.submit_time))
        return SUCCESS

    def on_running(self, job: Job, now: float) -> None:
        start = job.running_since if job.running_since is not None else now
        self.model.started(job.job_id, job_key(job.spec), start, job.spec.submit_time)

    def on_ended(self, job: Job, now: float) -> None:
        pred = self._at_submit.pop(job.job_id, None)
        self._moved.pop(job.job_id, None)
        start = job.running_since
        if start is None or now < start:
            self.model.forget(job.job_id)
            return
        key = job_key(job.spec)
        state = Exit.SUCCEEDED if job.state == SUCCEEDED else Exit.FAILED if job.state == FAILED else Exit.KILLED
        submit = min(job.spec.submit_time, start)
        self.model.finished(HistoryRecord(job.job_id, key.exact, key.family, key.user, key.gpus, "",
                                          now - start, state, submit, now, gpu_model=key.gpu_type))
        if state != Exit.SUCCEEDED or now <= start:
            return
        if pred is None:
            self.uncovered += 1
        else:
            self.errors.append((pred.p50, pred.p90, now - start, pred.level))

    def accuracy(self) -> dict:
        """Prediction error over finished jobs (their prediction at submit): see ``accuracy``."""
        return accuracy(self.errors, self.uncovered)


def accuracy(errors: list[tuple[float, float, float, str]], uncovered: int = 0) -> dict:
    """Median absolute percentage error of the p50, share within 2x, share under-predicted (p50 <
    actual), share of actuals above the p90, and coverage (jobs) by key level, over ``errors``
    (p50, p90, actual seconds, level); ``uncovered`` jobs had no prediction."""
    errs = [e for e in errors if e[2] > 0]
    n = len(errs)
    levels: dict[str, int] = {}
    for e in errs:
        levels[e[3]] = levels.get(e[3], 0) + 1
    out: dict = {"predictions": n, "uncovered": uncovered, "by_level": dict(sorted(levels.items(), key=lambda kv: -kv[1]))}
    if not n:
        return out
    ape = sorted(abs(p - a) / a for p, _, a, _ in errs)
    mid = n // 2
    out.update({
        "median_abs_pct_error": ape[mid] if n % 2 else (ape[mid - 1] + ape[mid]) / 2,
        "within_2x": sum(1 for p, _, a, _ in errs if p > 0 and max(p / a, a / p) <= 2) / n,
        "under_predicted": sum(1 for p, _, a, _ in errs if p < a) / n,
        "above_p90": sum(1 for _, q, a, _ in errs if a > q) / n,
    })
    return out
