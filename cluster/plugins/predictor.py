"""``predictor`` (seed 000): run-time prediction from history, pure. A job's run time is the mean
of the last ``history`` run times of, in this order, the same user and name, the same user, the
same total GPU count, all jobs; ``default_s`` (0: unknown) before any history. It learns from
succeeded jobs (running start to end, scheduler clock) and records its own error for jobs it
predicted at start, so ``accuracy()`` can be reported. Other plugins call ``predict(spec)``."""

from __future__ import annotations

from collections import deque

from cluster.events import SUCCEEDED
from cluster.jobs import Job
from cluster.params import Param
from cluster.points import Plugin, register
from cluster.spec import JobSpec


class _Window:
    __slots__ = ("vals", "total")

    def __init__(self, n: int) -> None:
        self.vals: deque[float] = deque(maxlen=n)
        self.total = 0.0

    def add(self, v: float) -> None:
        if len(self.vals) == self.vals.maxlen:
            self.total -= self.vals[0]
        self.vals.append(v)
        self.total += v

    def mean(self) -> float:
        return self.total / len(self.vals)


@register
class Predictor(Plugin):
    name = "predictor"
    PARAMS = {
        "history": Param(20, "int", lambda v: v >= 1, "an integer >= 1"),
        "default_s": Param(0.0, "float", lambda v: v >= 0, "seconds >= 0 (0: unknown)"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._h: dict[tuple, _Window] = {}
        self._pred: dict[str, float] = {}
        self.errors: list[tuple[float, float]] = []  # (predicted, actual) per finished job

    @staticmethod
    def _keys(spec: JobSpec) -> list[tuple]:
        keys: list[tuple] = []
        if spec.user and spec.name:
            keys.append(("user+name", spec.user, spec.name))
        if spec.user:
            keys.append(("user", spec.user))
        keys.append(("gpus", spec.total_gpus))
        keys.append(("all",))
        return keys

    def predict(self, spec: JobSpec) -> float | None:
        """Predicted run time in seconds, or None when unknown."""
        for key in self._keys(spec):
            w = self._h.get(key)
            if w is not None:
                return w.mean()
        return self.p["default_s"] or None

    def learn(self, spec: JobSpec, run_s: float) -> None:
        for key in self._keys(spec):
            w = self._h.get(key)
            if w is None:
                w = self._h[key] = _Window(self.p["history"])
            w.add(run_s)

    def on_running(self, job: Job, now: float) -> None:
        pred = self.predict(job.spec)
        if pred is not None:
            self._pred[job.job_id] = pred

    def on_ended(self, job: Job, now: float) -> None:
        pred = self._pred.pop(job.job_id, None)
        if job.state != SUCCEEDED or job.running_since is None:
            return
        actual = now - job.running_since
        if actual <= 0:
            return
        if pred is not None:
            self.errors.append((pred, actual))
        self.learn(job.spec, actual)

    def accuracy(self) -> dict:
        """Prediction error over finished jobs that had a prediction at start."""
        n = len(self.errors)
        if not n:
            return {"predictions": 0, "mean_abs_error_s": None, "mean_abs_pct_error": None, "within_25pct": None}
        abs_err = [abs(p - a) for p, a in self.errors]
        pct = [e / a for e, (_, a) in zip(abs_err, self.errors)]
        return {
            "predictions": n,
            "mean_abs_error_s": sum(abs_err) / n,
            "mean_abs_pct_error": sum(pct) / n,
            "within_25pct": sum(1 for x in pct if x <= 0.25) / n,
        }
