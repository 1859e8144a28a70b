"""colocate/base/stats.py: the one definition of the --stats-file fields, and how processes merge."""

from __future__ import annotations

import pytest

from colocate.base import stats


def proc(iters, wall, busy, peak, host=0):
    return {"iterations": iters, "wall_s": wall, "device_busy_s": busy, "mem_reserved_peak_bytes": peak,
            "mem_allocated_peak_bytes": peak // 2, "host_bytes_peak": host, "mem_floor_peak_bytes": 0,
            "boundary_reserved_over_cap_max_bytes": 0, "busy_fraction": busy / wall, "mem_cap_bytes": 1 << 30}


def test_no_process_gives_zeros_and_says_why():
    out = stats.merge([])
    assert {k: out[k] for k in stats.NUMERIC} == dict.fromkeys(stats.NUMERIC, 0)
    assert "never imported torch" in out["note"] and out["processes"] == []


def test_one_process_is_the_summary():
    p = proc(10, 2.0, 1.0, 100)
    out = stats.merge([p])
    assert {k: out[k] for k in p} == p and out["processes"] == [p]


def test_several_processes_sum_busy_time_and_keep_the_largest_peaks():
    a, b = proc(10, 2.0, 1.0, 100, host=5), proc(30, 4.0, 1.0, 50)
    out = stats.merge([a, b])
    assert out["iterations"] == 30  # the main process: the one that trained
    assert out["device_busy_s"] == 2.0 and out["wall_s"] == 4.0
    assert out["busy_fraction"] == pytest.approx(0.5)
    assert (out["mem_reserved_peak_bytes"], out["host_bytes_peak"]) == (100, 5)


def test_numeric_fields_are_documented_fields():
    assert set(stats.NUMERIC) <= set(stats.FIELDS)
