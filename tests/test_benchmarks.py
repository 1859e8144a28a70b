"""Every benchmark script imports and explains itself (``--help``): a refactoring that breaks one is
caught here, not on the day someone wants its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import child_env

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_help(script):
    res = subprocess.run([sys.executable, str(script), "--help"], env=child_env(), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage:" in res.stdout


def test_the_cpu_probe_times_its_loop_in_each_tenth_and_stops_its_process(tmp_path, monkeypatch):
    """``_common.CpuProbe``: a child process times its loop until the probe's block ends; the summary gives the
    median of each tenth of the samples, the child is gone and its file removed."""
    from tests.support import alive, wait_for

    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    with C.CpuProbe(tmp_path, every_s=0.01, n=1000) as probe:
        wait_for(lambda: probe.path.read_text().count("\n") >= 20, 60, what="20 probe samples")
        pid = probe._proc.pid
    summary = probe.summary()
    assert summary["n"] >= 20 and len(summary["tenths_ms"]) == 10
    assert 0 < min(summary["tenths_ms"]) <= summary["p50_ms"] * 10
    assert summary["steal_pct"] >= 0 or summary["steal_pct"] != summary["steal_pct"]  # a share, or NaN off Linux
    wait_for(lambda: not alive(pid), 30, what="the probe's process to be gone")
    assert not probe.path.exists()
