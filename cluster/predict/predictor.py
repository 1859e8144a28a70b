"""``RunTimePredictor``: a job's run time before it starts (p50, p90) and its remaining time after.

Before start (``predict``): the first level of ``history.levels(key)`` with at least one finished
job gives the estimate. Its observations are the last ``window`` finished run times at that level
(the k-th most recent weighted ``decay ** k``) and the last ``window`` jobs of that level started
and still running (no more, so that a backlog of long runners does not swamp the finished; none
with ``running=False``): one with a
progress report contributes its projected run time as if finished, one without contributes the
time it has run so far, censored (``estimate.km_quantiles``). The p50 and p90 are the Kaplan-Meier
quantiles. Where the level has fewer than ``trust`` finished jobs, each quantile is shrunk toward
the next broader level's with more finished jobs, in log space: ``log q = (n log q_level + (trust - n) log q_broader) / trust``.
A quantile beyond every finished observation (too many long runners) is taken as the largest
observation. None when no level has a finished job.

After start (``remaining``): with a progress report, (total - done) x the reported time per
iteration (the recent mean where the report has one, else the median: (total - done) steps take
their count times the mean; p90: x the reported p90 step time, else the same), less the time since
the report, plus the level's end offset; without one, the p50/p90 of the run time conditioned on
the time already run, minus that time.

End offset: what the projection from a job's last progress report missed of its actual end (its
exit: the interpreter's and the framework's teardown, a final checkpoint or evaluation; seconds,
signed). A succeeded job whose last report had at least ``TAIL_FROM`` of its iterations done teaches
it, at every level of its key; the offset of a prediction is the median of the last ``window`` at
the first level with one (0 where none has). The projected run time of a running job counts it too.

Pure and deterministic: every time is an argument (seconds, the caller's clock); the learner
sees only what it is told (``finished`` for the ended jobs, ``started``/``progress`` for running
ones), so a replay that tells it events in time order predicts causally."""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from cluster.predict.estimate import km_quantiles
from cluster.predict.history import Exit, HistoryRecord, JobKey, levels

TAIL_FROM = 0.9  # a finished job teaches its end offset only if its last report had this share of its iterations


class Prediction(NamedTuple):
    p50: float  # seconds
    p90: float
    level: str  # the level of history.LEVELS it came from ("progress" after a progress report)
    n: int  # finished jobs at that level behind it (iterations done, after a progress report)


class _Running:
    __slots__ = ("keys", "start", "done", "total", "step", "step_p90", "at")

    def __init__(self, keys: list[tuple], start: float) -> None:
        self.keys, self.start = keys, start
        self.done = self.total = 0
        self.step = self.step_p90 = self.at = 0.0  # seconds per iteration the projection uses (mean, else p50)

    def end(self) -> float | None:
        """Projected end (the caller's clock) from the last progress report, no offset; None without one."""
        if not self.total or not self.step:
            return None
        return self.at + max(0, self.total - self.done) * self.step


class RunTimePredictor:
    def __init__(self, window: int = 50, decay: float = 1.0, trust: int = 3, running: bool = True) -> None:
        if window < 1 or not (0.0 < decay <= 1.0) or trust < 1:
            raise ValueError("window must be >= 1, decay in (0, 1], trust >= 1")
        self.window, self.decay, self.trust, self.running = window, decay, trust, running
        self._fin: dict[tuple, deque[float]] = {}
        self._tail: dict[tuple, deque[float]] = {}  # end offsets (module docstring) by lookup key
        self._run: dict[tuple, dict[str, _Running]] = {}
        self._jobs: dict[str, _Running] = {}
        self._cache: dict[JobKey, Prediction | None] = {}  # predictions at _cache_now, since the last change
        self._cache_now = math.nan

    # learning
    def finished(self, record: HistoryRecord) -> None:
        """A job ended: it stops counting as running; a succeeded one's wall time becomes history, and the
        offset of its end from the projection of its last progress report, where that report was late enough
        (``TAIL_FROM``), its level's end offset."""
        r = self._jobs.get(record.job_id)
        projected = r.end() if r is not None and r.done >= TAIL_FROM * r.total else None
        self.forget(record.job_id)
        self._cache.clear()
        if record.exit != Exit.SUCCEEDED or record.wall_s <= 0:
            return
        for _, lk in levels(record.key):
            _push(self._fin, lk, record.wall_s, self.window)
            if projected is not None:
                _push(self._tail, lk, record.end_s - projected, self.window)

    def started(self, job_id: str, key: JobKey, now: float) -> None:
        """A job started running at ``now`` (idempotent: a second call keeps the first start)."""
        if job_id in self._jobs:
            return
        self._cache.clear()
        r = _Running([lk for _, lk in levels(key)], now)
        self._jobs[job_id] = r
        for lk in r.keys:
            self._run.setdefault(lk, {})[job_id] = r

    def progress(self, job_id: str, done: int, total: int, step_p50_s: float, now: float,
                 step_p90_s: float | None = None, step_mean_s: float | None = None) -> bool:
        """A running job's progress at ``now`` (when the report was made): ``done`` of ``total`` iterations,
        recent seconds per iteration (median, p90, mean; the mean is what the projection uses where given).
        False (ignored) for a job not running or a report without a usable total or step time."""
        r = self._jobs.get(job_id)
        if r is None or total <= 0 or done < 0 or not _seconds(step_p50_s):
            return False
        self._cache.clear()
        step = step_mean_s if step_mean_s is not None and _seconds(step_mean_s) else step_p50_s
        r.done, r.total, r.step, r.at = done, total, step, now
        r.step_p90 = max(step, step_p90_s) if step_p90_s is not None and _seconds(step_p90_s) else step
        return True

    def forget(self, job_id: str) -> None:
        """The job no longer runs and teaches nothing (e.g. ended before it started); idempotent."""
        r = self._jobs.pop(job_id, None)
        if r is not None:
            self._cache.clear()
            for lk in r.keys:
                run = self._run.get(lk)
                if run is not None:
                    run.pop(job_id, None)
                    if not run:
                        del self._run[lk]

    # prediction
    def _obs(self, lk: tuple, now: float) -> list[tuple[float, float, bool]]:
        fin = self._fin[lk]
        w = 1.0
        obs: list[tuple[float, float, bool]] = []
        for v in reversed(fin):
            obs.append((v, w, True))
            w *= self.decay
        running = self._run.get(lk) if self.running else None
        for r in list(running.values())[-self.window:] if running else ():
            end = r.end()
            if end is not None:
                obs.append((end + self._offset(r.keys) - r.start, 1.0, True))
            elif now > r.start:
                obs.append((now - r.start, 1.0, False))
        return obs

    def _level(self, lk: tuple, now: float, after: float = 0.0) -> tuple[float, float] | None:
        obs = self._obs(lk, now)
        q50, q90 = km_quantiles(obs, (0.5, 0.9), after)
        top = max((t for t, _, _ in obs), default=0.0)
        if top <= after:
            return None
        p50 = q50 if q50 is not None else top
        p90 = q90 if q90 is not None else top
        return p50, max(p50, p90)

    def predict(self, key: JobKey, now: float) -> Prediction | None:
        """p50/p90 run time of a job with ``key`` submitted (or waiting) at ``now``; module docstring.
        Cached until the next change or another ``now`` (a scheduling cycle asks for many jobs at once)."""
        if now != self._cache_now:
            self._cache.clear()
            self._cache_now = now
        if key in self._cache:
            return self._cache[key]
        pred = self._cache[key] = self._predict(key, now)
        return pred

    def _predict(self, key: JobKey, now: float) -> Prediction | None:
        found = [(name, lk) for name, lk in levels(key) if lk in self._fin]
        if not found:
            return None
        name, lk = found[0]
        est = self._level(lk, now)
        if est is None:
            return None
        n = len(self._fin[lk])
        p50, p90 = est
        wider = next((b for _, b in found[1:] if len(self._fin[b]) > n), None)
        if n < self.trust and wider is not None:
            broad = self._level(wider, now)
            if broad is not None:
                a = n / self.trust
                p50 = math.exp(a * math.log(p50) + (1 - a) * math.log(broad[0]))
                p90 = max(p50, math.exp(a * math.log(p90) + (1 - a) * math.log(broad[1])))
        return Prediction(p50, p90, name, n)

    def remaining(self, job_id: str, key: JobKey, now: float) -> Prediction | None:
        """p50/p90 seconds left of a running job at ``now``; None when not running or nothing is known."""
        r = self._jobs.get(job_id)
        if r is None:
            return None
        if r.total and r.step:
            left = max(0, r.total - r.done)
            since = max(0.0, now - r.at)
            off = self._offset(r.keys)
            return Prediction(max(0.0, left * r.step - since + off), max(0.0, left * r.step_p90 - since + off),
                              "progress", r.done)
        ran = max(0.0, now - r.start)
        for name, lk in levels(key):
            if lk not in self._fin:
                continue
            est = self._level(lk, now, after=ran)
            if est is not None:
                return Prediction(est[0] - ran, est[1] - ran, name, len(self._fin[lk]))
        return None

    def end_offset(self, key: JobKey) -> float:
        """Seconds a job with ``key`` is expected to run past the projection of its last progress report
        (the end offset of the module docstring; 0.0 where nothing was learnt)."""
        return self._offset([lk for _, lk in levels(key)])

    def _offset(self, lookup_keys: list[tuple]) -> float:
        """The end offset (module docstring) at the first of ``lookup_keys`` with one; 0.0 where none has."""
        for lk in lookup_keys:
            d = self._tail.get(lk)
            if d:
                return _median(d)
        return 0.0


def _push(table: dict[tuple, deque[float]], lk: tuple, value: float, window: int) -> None:
    d = table.get(lk)
    if d is None:
        d = table[lk] = deque(maxlen=window)
    d.append(value)


def _median(values) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _seconds(v: float) -> bool:
    return v > 0 and math.isfinite(v)
