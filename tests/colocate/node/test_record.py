"""colocate/node/record.py: the node's --record format, written and read by the same definition."""

from __future__ import annotations

import json

import pytest

from colocate import protocol as P
from colocate.node import record


def report(job="g", seq=0):
    return P.BatchReport(job_id=job, seq=seq, t_end=123.0, duration_s=0.05, busy_s=0.02, device_start_s=0.0,
                         mem_allocated_peak=1, mem_reserved=2, mem_floor=0, host_bytes=3, host_bytes_touched=3,
                         limits_seq=4)


def test_rows_round_trip_on_the_node_clock(tmp_path):
    path = tmp_path / "r.jsonl"
    limits = P.SetLimits(job_id="o", limits=P.Limits(seq=2, mem_cap=5, sm_share=0.5, gate=True))
    applied = P.LimitsApplied(job_id="o", limits_seq=2, applied_at=9e9)  # the job's clock: kept, not used
    with open(path, "w") as f:
        f.write(record.row(record.REPORT, 10.5, report(), gpu=1, priority="guaranteed") + "\n")
        f.write(record.row(record.LIMITS, 10.6, limits) + "\n")
        f.write(record.row(record.APPLIED, 10.7, applied) + "\n")
    rec = record.read(str(path))
    (b,) = rec.batches
    assert (b.job_id, b.klass, b.gpu, b.node_t, b.busy_s, b.host_bytes, b.limits_seq) == (
        "g", "guaranteed", 1, 10.5, 0.02, 3, 4)
    assert rec.limits[0]["limits"]["seq"] == 2 and rec.limits[0]["node_t"] == 10.6
    assert rec.applied[0]["node_t"] == 10.7


@pytest.mark.parametrize("line", ["{not json", json.dumps([1, 2]), json.dumps({"kind": "future", "x": 1}), ""])
def test_cut_or_unknown_lines_are_skipped(tmp_path, line):
    path = tmp_path / "r.jsonl"
    path.write_text(record.row(record.REPORT, 1.0, report()) + "\n" + line + "\n")
    assert [b.job_id for b in record.read(str(path)).batches] == ["g"]


def test_only_known_kinds_are_written():
    with pytest.raises(AssertionError):
        record.row("nonsense", 1.0, report())
