"""The engine's timing contract on hand-computed scenarios: solo runs, start delays, preemption that keeps
finished work, restart overhead, promotion, and jobs that never finish (co-location re-timing:
``test_sharing.py``)."""

from __future__ import annotations

import math

import pytest

from cluster import events as ev
from cluster.sim import SimConfig
from tests.cluster.sim.helpers import GIB, config, job, node_specs, run


def by_id(rows):
    return {r["job_id"]: r for r in rows}


@pytest.mark.parametrize("delay, end", [(0.0, 105.0), (7.0, 112.0)])
def test_a_lone_job_ends_after_its_duration_and_the_start_delay(delay, end):
    sim, rows, s = run("gang-binpack", [job("a", 5.0, 100.0, gpus=4, workers=2)], node_specs("2x4"),
                       config=SimConfig(record=True, start_delay_s=delay))
    r = by_id(rows)["a"]
    assert (r["start_s"], r["end_s"], r["queue_delay_s"], r["jct_s"]) == (5.0, end, 0.0, end - 5.0)
    assert r["run_s"] == 100.0 and s["makespan_s"] == end
    started = [t for t, e, _ in sim.log if any(isinstance(x, ev.RankStarted) for x in e)]
    assert started == [5.0 + delay]
    # 8 GPUs of 8 allocated for 100 + delay seconds of a run that ends at `end`
    assert math.isclose(s["gpu_allocation_rate"], (100.0 + delay) / end)


@pytest.mark.parametrize("overhead", [0.0, 5.0])
def test_preemption_keeps_finished_work(overhead):
    """O (12 GiB of a 16 GiB GPU) runs from 0; G needs 8 GiB at t=30: O is preempted with 70 s of
    work left, G runs 30..80, O restarts at 80 (memory free again) and ends 70 s (+ overhead) later."""
    jobs = [job("o", 0.0, 100.0, gpu_mem=12 * GIB, klass="opportunistic"),
            job("g", 30.0, 50.0, gpu_mem=8 * GIB)]
    no_promotion = config(["multi_queue", "gang", "binpack", "opportunistic", "preemption"])
    sim, rows, s = run(no_promotion, jobs, node_specs("1x1", gpu_mem=16 * GIB),
                       config=SimConfig(record=True, restart_overhead_s=overhead))
    r = by_id(rows)
    assert (r["g"]["start_s"], r["g"]["end_s"]) == (30.0, 80.0)
    assert (r["o"]["preemptions"], r["o"]["starts"], r["o"]["queue_delay_s"]) == (1, 2, 0.0)
    assert math.isclose(r["o"]["end_s"], 150.0 + overhead) and math.isclose(r["o"]["wait_s"], 50.0)
    stops = [(t, e.exit_code) for t, evs, _ in sim.log for e in evs if isinstance(e, ev.RankExited) and e.job_id == "o"]
    assert stops[0] == (30.0, 143)
    assert s["by_class"]["opportunistic"]["preemptions"] == 1


def test_promotion_turns_an_opportunistic_job_guaranteed():
    # o comes after the first report (t=10) shows g's GPU busy: it goes to the idle GPU
    jobs = [job("g", 0.0, 500.0, busy=0.5), job("o", 20.0, 300.0, busy=0.5, klass="opportunistic")]
    sim, rows, s = run("antman", jobs, node_specs("1x2"))
    r = by_id(rows)
    promotes = [t for t, _, out in sim.log for d in out if isinstance(d, ev.Promote)]
    assert promotes and r["o"]["ran_as"] == "guaranteed" and r["o"]["class"] == "opportunistic"
    assert r["o"]["end_s"] == 320.0  # alone on the second GPU: solo speed throughout
    assert s["core"]["promotions"] == 1
    assert sim.ticks_sent > 0  # promotion is time-driven: the engine ticks


def test_no_ticks_and_no_reports_when_no_plugin_needs_them():
    sim, _, s = run("gang-binpack", [job("a", 0.0, 1e5), job("b", 5e4, 10.0)], node_specs("1x1"))
    # submit a, a started, submit b (waits), a exits (b placed), b started, b exits
    assert (s["ticks"], s["node_reports"], s["batches"]) == (0, 0, 6)


def test_a_job_without_duration_never_ends_and_the_run_stops():
    jobs = [job("forever", 0.0, None), job("b", 1.0, 10.0), job("c", 2.0, 10.0)]
    sim, rows, s = run("antman", jobs, node_specs("1x2"))
    r = by_id(rows)
    assert r["forever"]["end_s"] is None and r["forever"]["state"] == "running"
    assert r["b"]["end_s"] == 11.0 and s["unfinished"] == 1 and s["succeeded"] == 2


def test_a_gang_too_large_for_the_cluster_fails_once():
    sim, rows, s = run("gang-binpack", [job("big", 0.0, 10.0, gpus=4, workers=4)], node_specs("2x4"))
    assert by_id(rows)["big"]["state"] == "failed" and s["failed"] == 1 and s["mean_jct_s"] is None


def test_reports_carry_the_windowed_utilization():
    """A GPU busy 0.5 from t=3 reports 0.35 at t=10 (7 of the last 10 s) and 0.5 at t=20, then
    stops reporting; ``reports="never"`` sends none."""
    jobs = [job("g", 3.0, 100.0, busy=0.5), job("o", 500.0, 10.0, busy=0.2, klass="opportunistic")]
    sim, _, s = run("antman", jobs, node_specs("1x1"))
    reports = [(t, e.gpus[0].utilization) for t, evs, _ in sim.log for e in evs if isinstance(e, ev.NodeReport)]
    assert reports[:3] == [(10.0, pytest.approx(0.35)), (20.0, 0.5), (110.0, pytest.approx(0.5 * 3 / 10))]
    assert reports[3] == (120.0, 0.0)
    quiet = run("antman", jobs, node_specs("1x1"), config=SimConfig(record=True, reports="never"))[2]
    assert quiet["node_reports"] == 0 and s["node_reports"] == len(reports)


def test_jobs_csv_formats_every_cell(tmp_path):
    from cluster.sim.metrics import CSV_FIELDS, write_jobs_csv
    row = dict.fromkeys(CSV_FIELDS, "x")
    row.update(job_id="j1", submit_s=3.0, start_s=None, end_s=float("inf"), wait_s=1.23456, jct_s=2.5, starts=2)
    path = tmp_path / "jobs.csv"
    write_jobs_csv([row], path)
    header, line = path.read_text().splitlines()
    assert header.split(",") == list(CSV_FIELDS)
    got = dict(zip(CSV_FIELDS, line.split(",")))
    assert (got["job_id"], got["submit_s"], got["start_s"], got["end_s"], got["wait_s"], got["jct_s"], got["starts"]) == \
        ("j1", "3", "", "inf", "1.235", "2.5", "2")


def test_the_start_deadline_holds_however_busy_the_cluster_is():
    """A start deadline is a core timer that only a Tick acts on: a tick falls due for it even when cycles
    ran within the last tick period (the live server ticks every period; the engine skips a tick that would
    decide nothing). Jobs every 20 s (a cycle each) and jobs an hour apart fail the same way."""
    dense = [job(f"d{i}", i * 20.0, 1000.0) for i in range(40)]
    sparse = [job(f"s{i}", 10_000.0 + i * 3600.0, 1000.0) for i in range(5)]
    for tick in (None, 10.0):
        _, rows, _ = run("fifo", dense + sparse, node_specs("64x8"),
                         config=SimConfig(start_delay_s=400.0, tick_s=tick))
        states = {r["state"] for r in rows}
        assert states == {"failed"}, (tick, [(r["job_id"], r["state"]) for r in rows if r["state"] != "failed"])
        assert all("did not all start within 300 s" in r["reason"] for r in rows)


@pytest.mark.timeout(30)  # without the fix it ticks on for hours
def test_a_start_that_fails_long_before_its_start_event_does_not_keep_the_clock_ticking():
    """A start event of a placement stopped before it came is no work ahead: the run ends when the job's
    starts have failed, not at the stale event's time (1e12 s of 30 s ticks)."""
    sim, rows, s = run("fifo", [job("a", 0.0, 100.0)], node_specs("1x8"),
                       config=SimConfig(start_delay_s=1e12))
    assert rows[0]["state"] == "failed"
    assert sim.t < 10_000.0 and s["ticks"] < 300, (sim.t, s["ticks"])
