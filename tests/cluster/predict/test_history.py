"""History records: validation, JSON round trip, and the key levels a prediction walks."""

from __future__ import annotations

import json

import pytest

from cluster.predict.history import Exit, HistoryRecord, JobKey, levels


def rec(**kw):
    base = dict(job_id="j", exact="e", family="f", user="ann", gpus=2, gpu_type="V100", wall_s=60.0,
                exit=Exit.SUCCEEDED, submit_s=0.0, end_s=100.0)
    base.update(kw)
    return HistoryRecord(**base)


def test_round_trip_through_json():
    r = rec(iterations=500, step_p50_s=0.1, step_p90_s=0.12, peak_mem=3 << 30, busy=0.8, exit=Exit.OOM)
    assert HistoryRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r


@pytest.mark.parametrize("kw, message", [
    ({"job_id": ""}, "empty job id"),
    ({"gpus": -1}, "gpus must be"),
    ({"wall_s": -1.0}, "wall_s must be"),
    ({"wall_s": float("nan")}, "wall_s must be"),
    ({"end_s": -5.0}, "before its submit"),
    ({"iterations": -2}, "iterations must be"),
    ({"step_p50_s": 0.0}, "step_p50_s must be"),
    ({"peak_mem": 1.5}, "peak_mem must be"),
    ({"busy": 1.5}, "busy must be"),
])
def test_bad_records_are_one_line(kw, message):
    with pytest.raises(ValueError, match=message) as e:
        rec(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("d, message", [
    ([], "expected an object"),
    ({**rec().to_dict(), "exit": "exploded"}, "exit must be one of"),
    ({**rec().to_dict(), "colour": 1}, "unknown field"),
    ({"job_id": "j", "exit": "failed"}, "history record"),  # missing fields
])
def test_from_dict_rejects_bad_input(d, message):
    with pytest.raises(ValueError, match=message):
        HistoryRecord.from_dict(d)


@pytest.mark.parametrize("key, names", [
    (JobKey("e", "f", "ann", 2, "V100"), ["exact+gpus", "exact", "family", "user+gpus", "user", "gpus", "all"]),
    (JobKey("", "f", "ann", 2), ["family", "user+gpus", "user", "gpus", "all"]),
    (JobKey("e", "", "", 1), ["exact+gpus", "exact", "gpus", "all"]),
    (JobKey(), ["gpus", "all"]),
])
def test_levels(key, names):
    assert [n for n, _ in levels(key)] == names


def test_levels_separate_gpu_count_and_type():
    a = dict(levels(JobKey("e", "f", "ann", 2, "V100")))
    b = dict(levels(JobKey("e", "f", "ann", 2, "T4")))
    c = dict(levels(JobKey("e", "f", "ann", 4, "V100")))
    assert a["exact+gpus"] != b["exact+gpus"] and a["exact"] == b["exact"]
    assert a["user+gpus"] != c["user+gpus"] and a["user"] == c["user"]
