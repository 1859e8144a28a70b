"""Quantiles of run times from finished and running jobs: a weighted Kaplan-Meier estimate with a
heavy tail beyond the data.

An observation is ``(seconds, weight, finished)``: a finished job's run time (an event), or a
running job's time so far (right-censored: it will run at least that long). Counting only the
jobs that have finished would see only the short ones among those started recently (a history
taken at submit time is biased short); the censored observations correct that bias.

``km_quantiles(obs, qs, after=0, tail=False)`` returns, per ``q`` in ``qs``, the smallest observed
run time ``t`` with ``S(t) / S(after) <= 1 - q`` (S: the estimated survival; ``after`` > 0
conditions on having run that long already). Where the estimate never falls that low (too few
events above: the quantile lies beyond every finished observation) it is None, or with
``tail=True`` the quantile of a Pareto tail of index 1 past the largest observation ``t_m``:
``S(T) = S(t_m) t_m / T`` for ``T > t_m``, so ``T_q = t_m S(t_m) / (1 - q)`` (with no observation
past ``after``: ``after / (1 - q)``, None when ``after`` is 0). That tail is the lifetime law Harchol-Balter
and Downey measured for processes (SIGMETRICS 1996: a job that has run ``t`` runs past ``T`` with
probability ``t / T``): a job that has outlived everything seen is expected to run about as long
again (its median), and nine times as long again at its p90. Weights must be > 0."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def km_quantiles(obs: Iterable[tuple[float, float, bool]], qs: Sequence[float], after: float = 0.0,
                 tail: bool = False) -> list[float | None]:
    data = sorted((t, not fin, w) for t, w, fin in obs if t > after)  # events before censorings at a tie
    at_risk = sum(w for _, _, w in data)
    out: list[float | None] = [None] * len(qs)
    order = sorted(range(len(qs)), key=lambda i: qs[i])
    k = 0
    surv = 1.0
    i = 0
    n = len(data)
    while i < n and k < len(order):
        t = data[i][0]
        died = gone = 0.0
        while i < n and data[i][0] == t:
            _, censored, w = data[i]
            if not censored:
                died += w
            gone += w
            i += 1
        if died and at_risk > 0:
            surv *= 1.0 - died / at_risk
            while k < len(order) and surv <= 1.0 - qs[order[k]] + 1e-12:
                out[order[k]] = t
                k += 1
        at_risk -= gone
    if tail and k < len(order):
        top = data[-1][0] if data else after
        if top > 0:
            for j in order[k:]:
                out[j] = top * surv / (1.0 - qs[j])
    return out
