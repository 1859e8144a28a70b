"""Weighted Kaplan-Meier quantiles of run times with censored (still running) observations."""

from __future__ import annotations

import pytest

from cluster.predict.estimate import km_quantiles


def fin(*vals, w=1.0):
    return [(v, w, True) for v in vals]


def run(*vals):
    return [(v, 1.0, False) for v in vals]


@pytest.mark.parametrize("obs, qs, after, expected", [
    (fin(10, 20, 30, 40), (0.5, 0.9), 0.0, [20, 40]),  # no censoring: empirical quantiles
    (fin(10), (0.5, 0.9), 0.0, [10, 10]),
    (fin(10, 20) + run(100, 100), (0.5,), 0.0, [20]),  # S(20) = 3/4 x 2/3 = 1/2
    (fin(10, 20) + run(100, 100, 100), (0.5,), 0.0, [None]),  # most still running past 20: median unknown
    (fin(10, 20, 200) + run(100), (0.5, 0.9), 0.0, [20, 200]),
    (fin(10, 20, 30, 40), (0.5,), 25.0, [30]),  # conditioned on having run 25 s: of 30, 40
    ([(10.0, 3.0, True), (40.0, 1.0, True)], (0.5,), 0.0, [10]),  # weights count
    ([(10.0, 1.0, True), (40.0, 3.0, True)], (0.5,), 0.0, [40]),
    ([], (0.5,), 0.0, [None]),
])
def test_km_quantiles(obs, qs, after, expected):
    assert km_quantiles(obs, qs, after) == expected


@pytest.mark.parametrize("obs, qs, after, expected", [
    (fin(10, 20, 30, 40), (0.5, 0.9), 0.0, [20, 40]),  # reached within the data: no tail
    (fin(10, 20) + run(100, 100, 100), (0.5, 0.9), 0.0, [100 * 0.6 / 0.5, 100 * 0.6 / 0.1]),  # S(100) = 3/5
    (run(50), (0.5, 0.9), 0.0, [100, 500]),  # only a running job: 2x and 10x its time so far
    (fin(10, 20), (0.5, 0.9), 30.0, [60, 300]),  # outlived everything seen: as long again, 9x again
    ([], (0.5,), 0.0, [None]),  # nothing at all
])
def test_km_quantiles_with_a_pareto_tail(obs, qs, after, expected):
    assert km_quantiles(obs, qs, after, tail=True) == pytest.approx(expected)


def test_censoring_raises_the_median_over_finished_only():
    """Jobs still running longer than every finished one move the median up (the history-at-submit bias)."""
    finished = fin(10, 20, 30, 200, 300)
    assert km_quantiles(finished, (0.5,)) == [30]
    assert km_quantiles(finished + run(150, 150, 150), (0.5,)) == [200]
