"""``RunTimePredictor``: a job's run time before it starts (p50, p90) and its remaining time after.

History per key level (``history.levels``): the last ``window`` jobs *started* at that level, in
start order, finished or still running, and the last ``window`` that *succeeded* there, each job
counted once. The starts are the Kaplan-Meier cohort: the jobs still running there are censored at
the time they have run, so that a history taken early (when only the short jobs have finished) is
not biased short; the successes keep an estimate when every recent start is still running (a burst
of submissions), and under a backlog, where the last jobs to finish are a fair sample of run times
(as many end per hour as start). (Counting the running jobs without their cohort, e.g. the last
jobs still running, is what to avoid: under a backlog those are the long ones.) A job the
predictor only hears of at its end (e.g. from the journal) is placed by its start, ``end_s -
wall_s``. A finished job is an event at its run time, a running one with a progress report an event
at its projected run time, and one without a report is censored at the time it has run (the k-th
most recent start weighted ``decay ** k``; with ``running=False`` running jobs are left out).

Before start (``predict``): the first level with an event gives the p50 and p90, Kaplan-Meier
quantiles with a heavy tail past the data (``estimate.km_quantiles(tail=True)``: where the running
jobs keep the estimate above 1 - q, a Pareto tail of index 1 past the largest observation). Where
that level has fewer than ``trust`` events, each quantile is shrunk toward the next broader level
with more events, in log space: ``log q = (n log q_level + (trust - n) log q_broader) / trust``;
the exact fingerprint's levels (``EXACT``) are never shrunk: one success of the same command is
the best evidence there is (in the Alibaba PAI 2020 trace a group's run times are close, Weng et
al., NSDI'22), while a user's jobs vary widely. A more specific level with only running jobs is a
floor: its own tail quantiles (the longest time run so far x 2 for the p50, x 10 for the p90)
bound the estimate from below (a new job of a key whose last jobs have all run for hours is not
predicted to take minutes because the user's other jobs did). None when no level has an event.

After start (``remaining``): with a progress report, (total - done) x the reported time per
iteration (the recent mean where the report has one, else the median: (total - done) steps take
their count times the mean; p90: x the reported p90 step time, else the same), less the time since
the report, plus the level's end offset; without one, the p50/p90 of the run time conditioned on
the time already run (first level with an event, tail included: a job past everything seen is
expected to run as long again at its p50, nine times as long at its p90), minus that time.

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
from bisect import insort
from collections import deque
from operator import attrgetter
from typing import NamedTuple

from cluster.predict.estimate import km_quantiles
from cluster.predict.history import Exit, HistoryRecord, JobKey, levels
from cluster.predict.neighbors import Neighbors

QS = (0.5, 0.9)
EXACT = ("exact+gpus", "exact", "near")  # never shrunk: one success of the same command or its sweep is trusted
BROAD = ("user+gpus", "user", "gpus", "all")
NEAR = "near"  # the level of the jobs submitted nearest in time by the same user at the same GPU count


TAIL_FROM = 0.9  # a finished job teaches its end offset only if its last report had this share of its iterations


def near_key(key: JobKey) -> tuple:
    return (key.user, key.gpus)


_ORDER = attrgetter("start", "job_id")  # the cohort order of _Entry.__lt__, as a key


class Prediction(NamedTuple):
    p50: float  # seconds
    p90: float
    level: str  # the level of history.LEVELS it came from ("progress" after a progress report)
    n: int  # events (finished jobs) in that level's cohort behind it (iterations done, after a progress report)


class _Entry:
    """One job of the cohorts: started at ``start``; ``wall`` once it succeeded; progress while it runs."""

    __slots__ = ("job_id", "start", "wall", "keys", "done", "total", "step", "step_p90", "at")

    def __init__(self, job_id: str, start: float, keys: list[tuple]) -> None:
        self.job_id, self.start, self.keys = job_id, start, keys
        self.wall: float | None = None
        self.done = self.total = 0
        self.step = self.step_p90 = self.at = 0.0  # seconds per iteration the projection uses (mean, else p50)

    def __lt__(self, other: _Entry) -> bool:  # cohort order: by start, then id
        return (self.start, self.job_id) < (other.start, other.job_id)

    def end(self) -> float | None:
        """Projected end (the caller's clock) from the last progress report, no offset; None without one."""
        if not self.total or not self.step:
            return None
        return self.at + max(0, self.total - self.done) * self.step


class RunTimePredictor:
    def __init__(self, window: int = 50, decay: float = 1.0, trust: int = 3, running: bool = True,
                 near: int = 5, near_s: float = 3600.0) -> None:
        if window < 1 or not (0.0 < decay <= 1.0) or trust < 1 or near < 0 or near_s < 0:
            raise ValueError("window must be >= 1, decay in (0, 1], trust >= 1, near >= 0, near_s >= 0")
        self.window, self.decay, self.trust, self.running = window, decay, trust, running
        self._near = Neighbors(near, near_s, keep=20 * window)
        self._started: dict[tuple, list[_Entry]] = {}  # level key -> its last `window` starts, in start order
        self._done: dict[tuple, deque[_Entry]] = {}  # level key -> its last `window` successes, in end order
        self._jobs: dict[str, _Entry] = {}  # running jobs
        self._tail: dict[tuple, deque[float]] = {}  # end offsets (module docstring) by level key
        self._ent: dict[tuple, list[_Entry]] = {}  # level key -> _entries(lk), until the level's jobs change
        self._cache: dict[tuple, Prediction | None] = {}  # predictions at _cache_now, since the last change
        # a cohort's [successes, p50/p90 or None, its entries] at _cache_now, by its level key (the near level's: by
        # its entries' identities): one cohort serves many of the jobs a cycle asks for; cleared with _cache
        self._cohort: dict[tuple, list] = {}  # [successes, (p50, p90) | None | _UNSET (not computed yet), entries]
        self._cache_now = math.nan

    # learning
    def finished(self, record: HistoryRecord) -> None:
        """A job ended: it stops counting as running; a succeeded one's wall time becomes history, and the
        offset of its end from the projection of its last progress report, where that report was late enough
        (``TAIL_FROM``), its level's end offset."""
        self._clear()
        ok = record.exit == Exit.SUCCEEDED and record.wall_s > 0
        e = self._jobs.pop(record.job_id, None)
        projected = e.end() if e is not None and e.done >= TAIL_FROM * e.total else None
        if e is None:
            if not ok:
                return
            e = _Entry(record.job_id, record.end_s - record.wall_s, [lk for _, lk in levels(record.key)])
            self._start(e)
            self._near.add(e.job_id, near_key(record.key), min(record.submit_s, e.start), e)
        elif not ok:
            self._drop(e)
            return
        e.wall = record.wall_s
        for lk in e.keys:
            d = self._done.get(lk)
            if d is None:
                d = self._done[lk] = deque(maxlen=self.window)
            d.append(e)
            self._ent.pop(lk, None)
            if projected is not None:
                _push(self._tail, lk, record.end_s - projected, self.window)

    def started(self, job_id: str, key: JobKey, now: float, submit: float | None = None) -> None:
        """A job submitted at ``submit`` (default ``now``) started running at ``now`` (idempotent: a
        second call keeps the first start)."""
        if job_id in self._jobs:
            return
        self._clear()
        e = _Entry(job_id, now, [lk for _, lk in levels(key)])
        self._jobs[job_id] = e
        self._start(e)
        self._near.add(job_id, near_key(key), now if submit is None else min(submit, now), e)

    def progress(self, job_id: str, done: int, total: int, step_p50_s: float, now: float,
                 step_p90_s: float | None = None, step_mean_s: float | None = None) -> bool:
        """A running job's progress at ``now`` (when the report was made): ``done`` of ``total`` iterations,
        recent seconds per iteration (median, p90, mean; the mean is what the projection uses where given).
        False (ignored) for a job not running or a report without a usable total or step time."""
        r = self._jobs.get(job_id)
        if r is None or total <= 0 or done < 0 or not _seconds(step_p50_s):
            return False
        self._clear()
        step = step_mean_s if step_mean_s is not None and _seconds(step_mean_s) else step_p50_s
        r.done, r.total, r.step, r.at = done, total, step, now
        r.step_p90 = max(step, step_p90_s) if step_p90_s is not None and _seconds(step_p90_s) else step
        return True

    def forget(self, job_id: str) -> None:
        """The job no longer runs and teaches nothing (e.g. ended before it started); idempotent."""
        e = self._jobs.pop(job_id, None)
        if e is not None:
            self._clear()
            self._drop(e)

    def _clear(self) -> None:
        self._cache.clear()
        self._cohort.clear()

    def _start(self, e: _Entry) -> None:
        for lk in e.keys:
            self._ent.pop(lk, None)
            c = self._started.get(lk)
            if c is None:
                c = self._started[lk] = []
            if not c or not (e < c[-1]):
                c.append(e)
            else:
                insort(c, e)
            if len(c) > self.window:
                del c[0]

    def _drop(self, e: _Entry) -> None:
        self._near.remove(e.job_id)
        for lk in e.keys:
            self._ent.pop(lk, None)
            c = self._started.get(lk)
            if c is not None and e in c:
                c.remove(e)
                if not c:
                    del self._started[lk]

    # prediction
    def _entries(self, lk: tuple) -> list[_Entry]:
        """A level's jobs: its last starts and its last successes, each once, the most recent start first.
        Kept until a job joins or leaves the level (a progress report or an end changes an entry, not the list)."""
        got = self._ent.get(lk)
        if got is not None:
            return got
        done = self._done.get(lk, ())
        cohort = self._started.get(lk, ())
        if done and cohort:
            seen = set(map(id, cohort))
            got = sorted([*cohort, *(e for e in done if id(e) not in seen)], key=_ORDER, reverse=True)
        else:
            got = sorted(done or cohort, key=_ORDER, reverse=True)
        self._ent[lk] = got
        return got

    def _obs(self, entries: list[_Entry], now: float) -> list[tuple[float, float, bool]]:
        """Observations of ``entries`` (the k-th weighted ``decay ** k``): module docstring."""
        w = 1.0
        obs: list[tuple[float, float, bool]] = []
        for e in entries:
            if e.wall is not None:
                obs.append((e.wall, w, True))
            elif self.running:
                end = e.end()
                if end is not None:
                    obs.append((end + self._offset(e.keys) - e.start, w, True))
                elif now > e.start:
                    obs.append((now - e.start, w, False))
                else:
                    continue
            else:
                continue
            w *= self.decay
        return obs

    def _events(self, entries: list[_Entry]) -> int:
        """Successes among ``entries`` (a running job's progress projection counts as one)."""
        return sum(1 for e in entries if e.wall is not None or (self.running and e.end() is not None))

    def _level(self, entries: list[_Entry], now: float, after: float = 0.0) -> tuple[float, float] | None:
        q50, q90 = km_quantiles(self._obs(entries, now), QS, after, tail=True)
        if q50 is None or q90 is None:
            return None
        return q50, max(q50, q90)

    def _levels(self, key: JobKey, submit: float | None,
                exclude: str = "") -> list[tuple[str, list[_Entry], tuple]]:
        """(level name, its jobs, a key that names that cohort until the next change) from the most specific level
        to the broadest, the levels with no job left out; the jobs submitted nearest to ``submit`` (``NEAR``) come
        after the family."""
        out = []
        near = self._near.nearest(near_key(key), submit, exclude) if submit is not None else []
        for name, lk in levels(key):
            if near and name in BROAD:
                out.append((NEAR, near, (NEAR, *map(id, near))))
                near = []
            if lk in self._started or lk in self._done:
                out.append((name, self._entries(lk), lk))
        return out

    def predict(self, key: JobKey, now: float, submit: float | None = None) -> Prediction | None:
        """p50/p90 run time of a job with ``key`` submitted at ``submit`` (None: no ``NEAR`` level),
        waiting at ``now``; module docstring. Cached until the next change or another ``now`` (a
        scheduling cycle asks for many jobs at once)."""
        if now != self._cache_now:
            self._clear()
            self._cache_now = now
        ck = (key, submit)
        if ck in self._cache:
            return self._cache[ck]
        pred = self._cache[ck] = self._predict(key, now, submit)
        return pred

    def _predict(self, key: JobKey, now: float, submit: float | None) -> Prediction | None:
        """``predict`` uncached; only at ``now == self._cache_now`` (the cohort cache's time)."""
        lvls = self._levels(key, submit)
        cohort = self._cohort
        found = []
        for i, (name, es, ck) in enumerate(lvls):
            got = cohort.get(ck)
            if got is None:
                got = cohort[ck] = [self._events(es), _UNSET, es]
            if got[0]:
                found.append((i, name, got))
        if not found:
            return None
        i, name, first = found[0]
        n, est = first[0], self._level_of(first, now)
        if est is None:
            return None
        p50, p90 = est
        wider = next((w for _, _, w in found[1:] if w[0] > n), None)
        if n < self.trust and wider is not None and name not in EXACT:
            broad = self._level_of(wider, now)
            if broad is not None:
                a = n / self.trust
                p50 = math.exp(a * math.log(p50) + (1 - a) * math.log(broad[0]))
                p90 = math.exp(a * math.log(p90) + (1 - a) * math.log(broad[1]))
        if self.running:
            for _, _, fck in lvls[:i]:  # more specific levels with only running jobs: a floor
                floor = self._level_of(cohort[fck], now)
                if floor is not None:
                    p50, p90 = max(p50, floor[0]), max(p90, floor[1])
        return Prediction(p50, max(p50, p90), name, n)

    def _level_of(self, got: list, now: float) -> tuple[float, float] | None:
        """A cached cohort's ``_level`` at ``now``, computed once."""
        if got[1] is _UNSET:
            got[1] = self._level(got[2], now)
        return got[1]

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
        for name, entries, _ in self._levels(key, None):
            n = self._events(entries)
            if not n:
                continue
            est = self._level(entries, now, after=ran)
            if est is not None:
                return Prediction(est[0] - ran, est[1] - ran, name, n)
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


_UNSET = object()


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
