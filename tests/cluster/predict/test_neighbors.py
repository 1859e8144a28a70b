"""Neighbors: the started jobs of a group submitted nearest in time to a job."""

from __future__ import annotations

import pytest

from cluster.predict.neighbors import Neighbors

JOBS = [("a", 0.0), ("b", 100.0), ("c", 110.0), ("d", 5000.0)]  # (job id, submit), all of group "g"


@pytest.mark.parametrize("k, within_s, submit, exclude, expected", [
    (5, 3600.0, 105.0, "", ["b", "c", "a"]),  # nearest first, before or after; d is too far
    (2, 3600.0, 105.0, "", ["b", "c"]),
    (5, 50.0, 105.0, "", ["b", "c"]),
    (5, 3600.0, 4000.0, "", ["d"]),
    (5, 3600.0, 100.0, "b", ["c", "a"]),  # the asking job itself left out
    (0, 3600.0, 105.0, "", []),  # off
])
def test_nearest(k, within_s, submit, exclude, expected):
    n = Neighbors(k, within_s)
    for job_id, t in JOBS:
        n.add(job_id, "g", t, job_id)
    assert n.nearest("g", submit, exclude) == expected
    assert n.nearest("other", submit) == []


def test_keep_drops_the_oldest_starts_and_remove_forgets():
    n = Neighbors(5, 1e9, keep=2)
    for job_id, t in [("late", 500.0), ("early", 0.0), ("mid", 200.0)]:  # started in this order
        n.add(job_id, "g", t, job_id)
    assert n.nearest("g", 0.0) == ["early", "mid"]  # "late" started first: dropped
    n.remove("early")
    n.remove("early")
    assert n.nearest("g", 0.0) == ["mid"]


@pytest.mark.parametrize("kw", [{"k": -1}, {"within_s": -1.0}, {"keep": 0}])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        Neighbors(**kw)
