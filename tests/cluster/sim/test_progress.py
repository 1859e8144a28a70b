"""The engine's progress reports (``JobProgressed``): when a running job sends them, what they say (iterations done
of the total at the job's current rate), which jobs send them (a known total, a plugin that reads them), and that
the predictor's remaining time follows them."""

from __future__ import annotations

import math
import zlib

import pytest

from cluster import events as ev
from cluster.plugins.predictor import job_key
from cluster.sim import SimConfig
from cluster.sim.network import parse_spread
from tests.cluster.sim.helpers import job, node_specs, run


def reports(sim) -> list[tuple[float, ev.JobProgressed]]:
    return [(t, e) for t, evs, _ in sim.log for e in evs if isinstance(e, ev.JobProgressed)]


def test_a_running_job_reports_when_its_run_time_doubles():
    cfg = SimConfig(record=True, progress_s=600.0, step_s=2.0, known_total=1.0)
    sim, rows, summary = run("backfill", [job("a", 100.0, 5000.0)], node_specs("1x1"), config=cfg)
    got = [(t, e.job_id, e.done, e.total, e.step_p50_s, e.step_p90_s, e.step_mean_s) for t, e in reports(sim)]
    assert got == [(100.0 + r, "a", r // 2, 2500, 2.0, 2.0, 2.0) for r in (600, 1200, 2400, 4800)]
    assert summary["progress_reports"] == 4 and rows[0]["end_s"] == 5100.0


def test_a_gang_slowed_by_its_spread_reports_the_slower_step():
    """Two workers of 4 GPUs on two nodes, node factor 2: rate 1/2, so 600 s of run is 150 iterations of 2 s
    solo, each taking 4 s."""
    cfg = SimConfig(record=True, progress_s=600.0, step_s=2.0, known_total=1.0, spread=parse_spread("node=2,switch=1"))
    sim, _, _ = run("backfill", [job("g", 0.0, 1000.0, gpus=4, workers=2)], node_specs("2x4"), config=cfg)
    (t, e), *_ = reports(sim)
    assert (t, e.done, e.total, e.step_p50_s) == (600.0, 150, 500, 4.0)


@pytest.mark.parametrize("policy, cfg", [
    ("gang-binpack", SimConfig(record=True, known_total=1.0)),  # no plugin reads progress
    ("backfill", SimConfig(record=True, known_total=0.0)),  # no job's total is known
    ("backfill", SimConfig(record=True, known_total=1.0, progress_s=0.0)),  # reports off
])
def test_no_reports_without_a_reader_a_known_total_or_a_period(policy, cfg):
    sim, _, summary = run(policy, [job("a", 0.0, 5000.0)], node_specs("1x1"), config=cfg)
    assert reports(sim) == [] and summary["progress_reports"] == 0


def test_the_jobs_that_know_their_total_are_picked_by_a_hash_of_their_id():
    jobs = [job(f"j{i:02d}", 0.0, 1000.0) for i in range(32)]
    sim, _, _ = run("backfill", jobs, node_specs("4x8"), config=SimConfig(record=True, known_total=0.5))
    want = {j.spec.job_id for j in jobs if zlib.crc32(j.spec.job_id.encode()) < 2**31}
    assert {e.job_id for _, e in reports(sim)} == want and 0 < len(want) < 32


def test_a_run_that_ended_sends_nothing_more():
    """Each job ends before its second report would be due: one report each, none after its end."""
    jobs = [job("a", 0.0, 1000.0), job("b", 0.0, 700.0)]
    sim, rows, _ = run("backfill", jobs, node_specs("1x2"), config=SimConfig(record=True, known_total=1.0))
    assert [(t, e.job_id) for t, e in reports(sim)] == [(600.0, "a"), (600.0, "b")]


def test_the_predictors_remaining_time_follows_the_reports():
    """With no history, the predictor knows nothing of a lone job's remaining time until its first report; from
    then it is the true remaining time (the job runs at rate 1)."""
    seen = []

    def observer(sim, t, events, out):
        pred = sim.core.fw.plugin("predictor")
        spec = sim.by_id["a"].spec
        seen.append((t, pred.model.remaining("a", job_key(spec), t)))

    cfg = SimConfig(record=True, known_total=1.0)
    run("backfill", [job("a", 0.0, 5000.0)], node_specs("1x1"), config=cfg, observer=observer)
    before = [p for t, p in seen if 0 < t < 600]
    after = [(t, p) for t, p in seen if 600 <= t < 5000]
    assert all(p is None for p in before)
    assert after and all(p is not None and p.level == "progress" and math.isclose(p.p50, 5000.0 - t)
                         for t, p in after)


def test_simulate_reports_progress_by_default_and_the_flags_turn_it_off(tmp_path, capsys):
    """``colocate simulate``: backfill's run sends progress reports (counted in the summary) by default; none with
    ``--known-total 0`` or ``--progress-every 0``; a bad value is one line, exit 2."""
    import json

    from colocate.cli import main
    from tests.cluster.sim.test_cli import philly_file

    trace = philly_file(tmp_path / "philly.csv", n=80, bad=False)
    base = ["simulate", "--trace", str(trace), "--cluster", "4x8", "--out", str(tmp_path / "out"), "--quiet",
            "--no-plots", "--colocation-data", "none", "--policy", "backfill"]

    def sent(*extra: str) -> int:
        assert main(base + list(extra)) == 0
        (summary,) = json.loads((tmp_path / "out" / "summary.json").read_text())
        return summary["progress_reports"]

    assert sent() > 0
    assert sent("--known-total", "0") == 0 and sent("--progress-every", "0") == 0
    capsys.readouterr()
    for bad, message in ((["--known-total", "1.5"], "must be a number in [0, 1]"),
                         (["--progress-every", "-1"], "a number of seconds >= 0")):
        with pytest.raises(SystemExit) as stop:
            main(base + bad)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
