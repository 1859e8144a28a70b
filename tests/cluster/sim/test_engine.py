"""The engine's timing contract on hand-computed scenarios: solo runs, start delays, co-location
re-timing (stale completions ignored), preemption that keeps finished work, restart overhead,
promotion, and jobs that never finish."""

from __future__ import annotations

import math

import pytest

from cluster import events as ev
from cluster.sim import ADAPTIVE_FILL, ADAPTIVE_KEEP, ColocationModel, LucidTable, SimConfig
from tests.cluster.sim.helpers import GIB, SOLO, config, job, lucid_csv, node_specs, run


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


def test_colocation_retimes_both_jobs_and_ignores_stale_completions():
    """G (busy 0.5, 1000 s) from t=0; O (busy 0.5, 100 s) joins its GPU at t=10 (the first report
    shows 0.5 < 0.8): G runs at keep, O fills ``fill`` of G's idle time; when O ends, G is back to 1."""
    jobs = [job("g", 0.0, 1000.0, busy=0.5), job("o", 10.0, 100.0, busy=0.5, klass="opportunistic")]
    sim, rows, _ = run("antman", jobs, node_specs("1x1"))
    r = by_id(rows)
    o_rate = min(1.0, ADAPTIVE_FILL * (1 - 0.5 * ADAPTIVE_KEEP) / 0.5)
    o_end = 10.0 + 100.0 / o_rate
    g_end = o_end + (990.0 - ADAPTIVE_KEEP * (o_end - 10.0))
    assert r["o"]["start_s"] == 10.0 and math.isclose(r["o"]["end_s"], o_end)
    assert math.isclose(r["g"]["end_s"], g_end), "G ended at a stale completion time"
    exits = [(t, e.job_id) for t, evs, _ in sim.log for e in evs if isinstance(e, ev.RankExited)]
    assert [j for _, j in exits] == ["o", "g"] and len(exits) == 2
    # utilization: 0.5 alone, G 0.5*keep + O's share while shared
    shared = 0.5 * ADAPTIVE_KEEP + 0.5 * o_rate
    want = (0.5 * 10.0 + shared * (o_end - 10.0) + 0.5 * (g_end - o_end)) / g_end
    assert math.isclose(sim.acc_busy / g_end, want)


def test_pack_uses_the_measured_pair_speeds(tmp_path):
    """Unmanaged sharing: each job at its Lucid speed beside the other. Only the row (A 1.0, C 0.7)
    measured this pair: O (config A) keeps 1.0, G (config C) drops to 0.7 while they share."""
    table = LucidTable.load(lucid_csv(tmp_path / "lucid.csv"))
    a, c = table.configs.index(("A", "DA", "32", "0")), table.configs.index(("C", "DC", "32", "0"))
    jobs = [job("g", 0.0, 1000.0, busy=SOLO["C"], cfg=c), job("o", 10.0, 90.0, busy=SOLO["A"], cfg=a,
                                                            klass="opportunistic")]
    sim, rows, _ = run("antman", jobs, node_specs("1x1"), model=ColocationModel(table, "pack"))
    r = by_id(rows)
    assert math.isclose(r["o"]["end_s"], 100.0)
    assert math.isclose(r["g"]["end_s"], 100.0 + 990.0 - 0.7 * 90.0)
    assert math.isclose(sim.acc_busy, 0.6 * 10 + (0.6 * 0.7 + 0.2) * 90 + 0.6 * (r["g"]["end_s"] - 100.0))


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
