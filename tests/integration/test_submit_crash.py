"""kill -9 of a real scheduler during bursts of submits from several client processes (CURVE keys, one connection
each): every acknowledged submit is in the journal after the restarts, and none is there twice
(``benchmarks/scheduler_crash.py``, smaller)."""

from __future__ import annotations

import sys

from tests.support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import scheduler_crash


def test_every_acknowledged_submit_survives_kill_9_and_none_is_made_twice(tmp_path):
    res = scheduler_crash.run(clients=4, rounds=3, tmp=tmp_path, seed=1, log=lambda _: None)
    assert res["acknowledged"] > 0
    assert not res["missing"] and not res["twice"] and res["job_told_twice"] == 0, res
