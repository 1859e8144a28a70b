"""colocate/demo/node.py and colocate/demo/evaluate.py on hand-made node records; `colocate demo` argument errors.

The records are what a node writes with ``--record`` (one JSON object a line), built
here with known batch times so every figure of ``summary.json`` can be checked by hand.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colocate.demo import node as demo
from colocate.node import record
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


def lim(t, share, state, kind="limits"):
    return {"kind": kind, "node_t": t, "job_id": OID, "limits": {"seq": 1, "mem_cap": 1, "sm_share": share,
                                                                  "gate": True}, "slo_state": state}


B = record.BatchRecord(OID, "opportunistic", 0, node_t=6.5, duration_s=0.5, busy_s=0.1, mem_reserved=0, host_bytes=0,
                 limits_seq=1)


@pytest.mark.parametrize("rows, ready_at, want", [
    # welcomed held for the baseline at 0, ready (at its first device work) at 3, released at 4, a break
    # pauses it 6..7, a re-profile 8..8.5; window [1, 10]
    ([lim(0, 0.0, "baseline", "welcome"), lim(4, 1.0, "running"), lim(6, 0.0, "paused"), lim(7, 1.0, "running"),
      lim(8, 0.0, "baseline"), lim(8.5, 1.0, "running")], 3.0,
     {"start-up": 2.0, "baseline": 1.5, "paused": 1.0, "running": 4.5}),
    # never held: start-up until its first batch began (no stats: 6.5 - 0.5)
    ([lim(0, 1.0, "full", "welcome")], None, {"start-up": 5.0, "baseline": 0.0, "paused": 0.0, "running": 4.0}),
    # held past its start-up: the hold is the baseline's cost; one that waited after (AIMD's label) is paused
    ([lim(0, 0.0, "baseline", "welcome"), lim(2.5, 0.0, "waiting"), lim(5, 0.25, "growing")], 2.0,
     {"start-up": 1.0, "baseline": 0.5, "paused": 2.5, "running": 5.0}),
])
def test_phases_of_the_opportunistic_job(rows, ready_at, want):
    from colocate.demo import evaluate as ev

    got = ev.phases([B], rows, OID, ready_at, 1.0, 10.0)
    assert got == pytest.approx(want)
    assert sum(got.values()) == pytest.approx(9.0)


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


def test_the_cluster_demos_user_runs_its_jobs_as_whoever_runs_the_demo(tmp_path):
    """A node maps a job's user to a Unix account (docs/security.md): the demo's user key ``demo`` has no account
    of that name, so without the demo's own map a root node refused every job of the cluster part."""
    import pwd

    from colocate.demo.cluster import make_keys
    from colocate.node.accounts import Accounts

    me = pwd.getpwuid(os.geteuid()).pw_name
    acct = Accounts(make_keys(str(tmp_path)), uid=0).for_user("demo")  # as a root node would resolve it
    assert acct is not None and acct.name == me


@pytest.mark.parametrize("states, timed_out, starved, failed", [
    ({"g": "succeeded", "o": "succeeded"}, False, [], []),
    ({"g": "succeeded", "o": "running"}, True, ["o"], []),  # idle time ran out: starved, by design
    ({"g": "succeeded", "o": "pending"}, True, ["o"], []),
    ({"g": "running", "o": "running"}, True, ["o"], ["g"]),  # a guaranteed job late is a failure
    ({"g": "succeeded", "o": "failed"}, True, [], ["o"]),  # an opportunistic job that failed is one
    ({"g": "failed", "o": "succeeded"}, False, [], ["g"]),
])
def test_the_cluster_part_tells_starved_opportunistic_jobs_from_failed_ones(states, timed_out, starved, failed):
    from colocate.cli.demo import starved_and_failed

    klass = {"g": "guaranteed", "o": "opportunistic"}
    rows = [{"name": n, "class": klass[n], "state": s} for n, s in states.items()]
    assert starved_and_failed(rows, timed_out) == (starved, failed)


@pytest.mark.slow
def test_a_demo_stopped_with_sigterm_stops_everything_it_started(tmp_path):
    """``timeout`` or a batch system stops the demo with SIGTERM: it exits 143 and leaves no process behind."""
    import signal

    import psutil

    from tests.support import wait_for

    demo_proc = subprocess.Popen([sys.executable, "-m", "colocate", "demo", "node", "--duration", "30",
                                  "--modes", "exclusive", "--out", str(tmp_path / "out")], cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    me = psutil.Process(demo_proc.pid)
    seen: dict[int, psutil.Process] = {}

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    def job_running():  # a node and a job's training script (under its launcher): the first, solo run
        for child in me.children(recursive=True):
            seen.setdefault(child.pid, child)
        cmds = [command(c) for c in seen.values()]
        return any("train_" in c and " run " not in c for c in cmds) and any(" node " in c for c in cmds)

    try:
        wait_for(job_running, 90, what="the demo's node and a training job")
        demo_proc.send_signal(signal.SIGTERM)
        assert demo_proc.wait(60) == 143
        gone, alive = psutil.wait_procs(list(seen.values()), timeout=30)
        assert alive == [], [p.pid for p in alive]
    finally:
        if demo_proc.poll() is None:
            demo_proc.kill()
            demo_proc.wait()
        for p in seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass
