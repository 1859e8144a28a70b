"""colocate/demo/node.py and colocate/demo/evaluate.py on hand-made node records; `colocate demo` argument errors.

The records are what a node writes with ``--record`` (one JSON object a line), built
here with known batch times so every figure of ``summary.json`` can be checked by hand.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from colocate import record
from colocate.demo import node as demo
from tests.support import REPO

PAIR = demo.PAIRS["cnn+transformer"]
GID, OID = PAIR.guaranteed.job_id, PAIR.opportunistic.job_id


def write_record(path: Path, jobs: dict, seconds: float = 11.0) -> str:
    """``jobs``: job id -> (priority, batches per second, busy seconds per batch), batches over [0, seconds]."""
    with open(path, "w") as f:
        for job_id, (priority, rate, busy) in jobs.items():
            n = int(round(seconds * rate))
            for i in range(1, n + 1):
                f.write(json.dumps({"kind": "report", "node_t": i / rate, "job_id": job_id, "priority": priority,
                                    "t_end": i / rate, "duration_s": 1 / rate, "busy_s": busy,
                                    "mem_reserved": 1 << 20, "host_bytes": 0, "limits_seq": 1}) + "\n")
        f.write("not json: a line cut by a crash\n")
    return str(path)


@pytest.fixture
def runs(tmp_path):
    def run(name, jobs):
        return demo.Run(name, write_record(tmp_path / f"{name}.jsonl", jobs))

    g, o = "guaranteed", "opportunistic"
    return {
        "solo-guaranteed": run("solo-guaranteed", {GID: (g, 30.0, 0.02)}),  # 30 it/s, 60% busy
        "solo-opportunistic": run("solo-opportunistic", {OID: (o, 50.0, 0.02)}),
        "adaptive": run("adaptive", {GID: (g, 28.5, 0.02), OID: (o, 10.0, 0.02)}),
        "solo-guaranteed-after": run("solo-guaranteed-after", {GID: (g, 20.0, 0.03)}),  # 20 it/s, 60% busy
    }


def test_record_reading_skips_cut_lines(runs):
    rec = record.read(runs["adaptive"].record)
    assert {b.job_id for b in rec.batches} == {GID, OID} and rec.limits == []


def test_analyse_against_the_mean_of_both_guaranteed_solo_runs(runs):
    rows, lines = demo.analyse(PAIR, runs)
    assert [r["mode"] for r in rows] == ["adaptive"]  # solo runs are references, not modes
    r = rows[0]
    assert r["guaranteed_solo_runs_it_s"] == pytest.approx([30.0, 20.0], rel=0.02)
    assert r["guaranteed_solo_throughput_it_s"] == pytest.approx(25.0, rel=0.02)
    assert r["guaranteed_throughput_ratio"] == pytest.approx(28.5 / 25.0, rel=0.02)
    assert r["guaranteed_solo_utilization"] == pytest.approx(0.6, rel=0.02)
    assert r["device_utilization"] == pytest.approx(28.5 * 0.02 + 10 * 0.02, rel=0.02)
    assert r["utilization_gain"] == pytest.approx(0.77 / 0.6, rel=0.02)
    assert r["opportunistic_throughput_ratio"] == pytest.approx(10 / 50, rel=0.02)
    assert r["idle_share_used"] == pytest.approx(0.2 / 0.4, rel=0.02)  # O busy / idle the guaranteed job leaves
    assert set(lines) == {"adaptive"} and lines["adaptive"]["utilization"]


def test_analyse_with_one_guaranteed_solo_run(runs):
    del runs["solo-guaranteed-after"]
    (r,), _ = demo.analyse(PAIR, runs)
    assert r["guaranteed_solo_throughput_it_s"] == pytest.approx(30.0, rel=0.02)
    assert r["guaranteed_throughput_ratio"] == pytest.approx(0.95, rel=0.02)


@pytest.mark.parametrize("args, message", [
    (["--modes", "adaptive,bogus"], "unknown mode(s) bogus"),
    (["--modes", ","], "unknown mode(s) (none)"),
    (["--duration", "0.5"], "--duration must be between 1 and 3600 seconds"),
    (["--pair", "nope"], "invalid choice"),
])
def test_demo_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "colocate", "demo", "--out", str(tmp_path / "out"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
