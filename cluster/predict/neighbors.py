"""The jobs submitted nearest in time to a job, by the same user at the same GPU count: a sweep or a
burst of one script's runs is submitted in one go, and its runs take alike (Tsafrir, Etsion and
Feitelson, IEEE TPDS 2007, predict from a user's last two jobs for this reason). In the Philly trace
the job submitted just before another at the same GPU count ran within 2x of it for 73% of jobs.

``Neighbors(k, within_s, keep)`` indexes started jobs by ``(group, submit time)``; ``nearest(group,
submit)`` returns the up to ``k`` of them nearest to ``submit`` (before or after: a job submitted
later may have started and ended first, e.g. when it was backfilled), all within ``within_s``
seconds of it, nearest first. Only jobs that have started are in the index, so what it returns is
what had happened by the time of the question. Each group keeps its last ``keep`` starts (older
ones are dropped first). Pure: no clock; entries are the caller's objects, compared by identity."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Any


class Neighbors:
    def __init__(self, k: int = 5, within_s: float = 3600.0, keep: int = 1000) -> None:
        if k < 0 or within_s < 0 or keep < 1:
            raise ValueError("k must be >= 0, within_s >= 0, keep >= 1")
        self.k, self.within_s, self.keep = k, within_s, keep
        self._by_submit: dict[Any, list[tuple[float, str]]] = {}  # group -> (submit, job id), sorted
        self._order: dict[Any, deque[str]] = {}  # group -> job ids in start order
        self._entries: dict[str, tuple[Any, float, Any]] = {}  # job id -> (group, submit, entry)

    def add(self, job_id: str, group: Any, submit: float, entry: Any) -> None:
        """A job of ``group`` submitted at ``submit`` has started (idempotent)."""
        if not self.k or job_id in self._entries:
            return
        self._entries[job_id] = (group, submit, entry)
        insort(self._by_submit.setdefault(group, []), (submit, job_id))
        order = self._order.setdefault(group, deque())
        order.append(job_id)
        if len(order) > self.keep:
            self.remove(order[0])

    def remove(self, job_id: str) -> None:
        """Forget a job (idempotent)."""
        got = self._entries.pop(job_id, None)
        if got is None:
            return
        group, submit, _ = got
        lst = self._by_submit[group]
        del lst[bisect_left(lst, (submit, job_id))]
        self._order[group].remove(job_id)
        if not lst:
            del self._by_submit[group], self._order[group]

    def nearest(self, group: Any, submit: float, exclude: str = "") -> list[Any]:
        """The entries of the up to ``k`` jobs of ``group`` submitted nearest to ``submit`` (module docstring)."""
        lst = self._by_submit.get(group)
        if not lst or not self.k:
            return []
        hi = bisect_left(lst, (submit, ""))
        lo = hi - 1
        out: list[Any] = []
        while len(out) < self.k:
            dl = submit - lst[lo][0] if lo >= 0 else float("inf")
            dh = lst[hi][0] - submit if hi < len(lst) else float("inf")
            if min(dl, dh) > self.within_s:
                break
            if dl <= dh:
                job_id = lst[lo][1]
                lo -= 1
            else:
                job_id = lst[hi][1]
                hi += 1
            if job_id != exclude:
                out.append(self._entries[job_id][2])
        return out
