"""RunTimePredictor: levels, shrinkage, running jobs, progress and remaining time."""

from __future__ import annotations

import pytest

from cluster.predict.history import Exit, HistoryRecord, JobKey
from cluster.predict.predictor import RunTimePredictor

ANN = JobKey("e1", "f1", "ann", 1)


def done(p, job_id, key, wall, end=1000.0, exit=Exit.SUCCEEDED):
    p.finished(HistoryRecord(job_id, key.exact, key.family, key.user, key.gpus, key.gpu_type, wall, exit, 0.0, end))


@pytest.mark.parametrize("history, key, p50, level, n", [
    ([(ANN, 100.0)], ANN, 100.0, "exact+gpus", 1),
    ([(ANN, 100.0), (ANN, 300.0), (ANN, 200.0)], ANN, 200.0, "exact+gpus", 3),
    ([(ANN, 100.0)], ANN._replace(gpus=2), 100.0, "exact", 1),
    ([(ANN, 100.0)], ANN._replace(exact="e2"), 100.0, "family", 1),
    ([(ANN, 100.0)], JobKey("e9", "f9", "ann", 1), 100.0, "user+gpus", 1),
    ([(ANN, 100.0)], JobKey("e9", "f9", "bob", 1), 100.0, "gpus", 1),
    ([(ANN, 100.0)], JobKey("e9", "f9", "bob", 8), 100.0, "all", 1),
    ([(ANN, 100.0, Exit.FAILED)], ANN, None, None, None),  # only successes teach run times
    ([], ANN, None, None, None),
])
def test_levels_without_shrinkage(history, key, p50, level, n):
    p = RunTimePredictor(trust=1)
    for i, h in enumerate(history):
        done(p, f"h{i}", h[0], h[1], exit=h[2] if len(h) > 2 else Exit.SUCCEEDED)
    got = p.predict(key, 2000.0)
    assert (got and (got.p50, got.level, got.n)) == ((p50, level, n) if p50 else None)


def test_a_level_with_little_history_is_shrunk_toward_a_broader_one():
    other = JobKey("e2", "f2", "ann", 1)
    p = RunTimePredictor(trust=3)
    done(p, "a", ANN, 1000.0)
    for i in range(4):
        done(p, f"o{i}", other, 10.0)
    got = p.predict(ANN, 2000.0)  # 1 of 3 trusted, user+gpus's median is 10: 1000^(1/3) x 10^(2/3)
    assert got.level == "exact+gpus" and got.p50 == pytest.approx(10 ** (5 / 3))


def test_running_jobs_of_the_level_count_censored_and_by_projection():
    p = RunTimePredictor(trust=1)
    for i, w in enumerate((10.0, 20.0, 30.0)):
        done(p, f"h{i}", ANN, w)
    assert p.predict(ANN, 0.0).p50 == 20.0
    for i in range(4):  # four of the same job running 500 s already: the median is past every finished one
        p.started(f"r{i}", ANN, 0.0)
    assert p.predict(ANN, 500.0).p50 == 500.0  # beyond the finished: the largest observation (a lower bound)
    assert p.progress("r0", 10, 100, 50.0, now=500.0)  # r0 projects 500 + 90 x 50 = 5000 s
    assert p.predict(ANN, 500.0).p90 == 5000.0
    for i in range(4):
        done(p, f"r{i}", ANN, 600.0)
    assert p.predict(ANN, 700.0).p50 == 600.0


@pytest.mark.parametrize("report, now, expected", [
    ((10, 100, 2.0, None), 110.0, (180.0, 180.0, "progress")),  # 90 left x 2 s
    ((10, 100, 2.0, 3.0), 110.0, (180.0, 270.0, "progress")),  # p90 from the p90 step time
    ((10, 100, 2.0, None), 130.0, (160.0, 160.0, "progress")),  # 20 s since the report
    ((100, 100, 2.0, None), 110.0, (0.0, 0.0, "progress")),
])
def test_remaining_from_progress(report, now, expected):
    p = RunTimePredictor()
    p.started("j", ANN, 100.0)
    done_, total, s50, s90 = report
    assert p.progress("j", done_, total, s50, 110.0, s90)
    r = p.remaining("j", ANN, now)
    assert (r.p50, r.p90, r.level) == expected


@pytest.mark.parametrize("report", [(5, 0, 1.0), (5, 10, 0.0), (5, 10, float("inf")), (-1, 10, 1.0)])
def test_unusable_progress_is_ignored(report):
    p = RunTimePredictor()
    p.started("j", ANN, 0.0)
    assert not p.progress("j", *report, now=1.0)
    assert not p.progress("nobody", 1, 10, 1.0, now=1.0)


def test_remaining_without_progress_is_conditioned_on_time_run():
    p = RunTimePredictor(trust=1)
    for i, w in enumerate((10.0, 20.0, 30.0, 400.0)):
        done(p, f"h{i}", ANN, w)
    p.started("j", ANN, 100.0)
    r = p.remaining("j", ANN, 150.0)  # ran 50 s: only the 400 s run is longer
    assert (r.p50, r.level) == (350.0, "exact+gpus")
    assert p.remaining("other", ANN, 150.0) is None


@pytest.mark.parametrize("kw", [{"window": 0}, {"decay": 0.0}, {"decay": 1.5}, {"trust": 0}])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        RunTimePredictor(**kw)


@pytest.mark.parametrize("running, p50", [(True, 500.0), (False, 20.0)])
def test_running_jobs_can_be_left_out(running, p50):
    p = RunTimePredictor(trust=1, running=running)
    for i, w in enumerate((10.0, 20.0, 30.0)):
        done(p, f"h{i}", ANN, w)
    for i in range(4):
        p.started(f"r{i}", ANN, 0.0)
    assert p.predict(ANN, 500.0).p50 == p50


@pytest.mark.parametrize("steps, expected", [
    ((2.0, None, None), (180.0, 180.0)),
    ((2.0, 3.0, 2.5), (225.0, 270.0)),  # the mean projects the p50: 90 steps take 90 x their mean
    ((2.0, 2.2, 2.5), (225.0, 225.0)),  # the p90 is never below the p50 projection
    ((2.0, 3.0, 0.0), (180.0, 270.0)),  # no mean (an older node): the median
    ((2.0, 3.0, float("nan")), (180.0, 270.0)),
])
def test_remaining_projects_with_the_mean_step_where_reported(steps, expected):
    p = RunTimePredictor()
    p.started("j", ANN, 100.0)
    s50, s90, mean = steps
    assert p.progress("j", 10, 100, s50, 110.0, s90, mean)
    r = p.remaining("j", ANN, 110.0)
    assert (r.p50, r.p90) == pytest.approx(expected)


def finish_with_progress(p, job_id, key, start, done_, total, step, at, end):
    p.started(job_id, key, start)
    assert p.progress(job_id, done_, total, step, at)
    p.finished(HistoryRecord(job_id, key.exact, key.family, key.user, key.gpus, key.gpu_type, end - start,
                             Exit.SUCCEEDED, start, end))


@pytest.mark.parametrize("history, key, offset", [
    ([], ANN, 0.0),  # nothing learnt: no offset
    # last report at t=100 with 95 of 100 done at 1 s/step: projected end 105; it ended at 108: 3 s later
    ([(ANN, 95, 100.0, 108.0)], ANN, 3.0),
    ([(ANN, 95, 100.0, 108.0), (ANN, 100, 100.0, 101.0), (ANN, 100, 100.0, 104.0)], ANN, 3.0),  # the median
    ([(ANN, 50, 100.0, 158.0)], ANN, 0.0),  # its last report was too early (50%): teaches nothing
    ([(ANN, 95, 100.0, 108.0)], JobKey("e9", "f1", "ann", 1), 3.0),  # learnt at the family level too
    ([(ANN, 95, 100.0, 108.0)], JobKey("e9", "f9", "bob", 1), 3.0),  # and at the broadest ("all")
    ([(ANN, 95, 100.0, 108.0), (JobKey("e9", "f9", "bob", 1), 95, 100.0, 120.0)], ANN, 3.0),  # the first level's
    ([(ANN, 100, 100.0, 99.0)], ANN, -1.0),  # an end before the projection: signed
])
def test_the_end_offset_is_learnt_from_finished_jobs(history, key, offset):
    p = RunTimePredictor()
    for i, (k, done_, at, end) in enumerate(history):
        finish_with_progress(p, f"h{i}", k, 0.0, done_, 100, 1.0, at, end)
    p.started("j", key, 200.0)
    assert p.progress("j", 10, 100, 1.0, 210.0)
    r = p.remaining("j", key, 210.0)
    assert (r.p50, r.p90) == pytest.approx((90.0 + offset, 90.0 + offset))


def test_a_failed_job_teaches_no_end_offset():
    p = RunTimePredictor()
    p.started("h", ANN, 0.0)
    assert p.progress("h", 95, 100, 1.0, 100.0)
    p.finished(HistoryRecord("h", ANN.exact, ANN.family, ANN.user, ANN.gpus, ANN.gpu_type, 130.0, Exit.FAILED, 0.0,
                             130.0))
    p.started("j", ANN, 200.0)
    assert p.progress("j", 10, 100, 1.0, 210.0)
    assert p.remaining("j", ANN, 210.0).p50 == pytest.approx(90.0)


def test_a_running_jobs_projection_counts_the_end_offset():
    p = RunTimePredictor(trust=1)
    finish_with_progress(p, "h", ANN, 0.0, 100, 100, 1.0, at=100.0, end=110.0)  # 10 s after its projection
    p.started("r", ANN, 200.0)
    assert p.progress("r", 10, 1000, 1.0, 210.0)  # projects 210 + 990 = 1200, + 10: ran 1010 s
    assert p.predict(ANN, 210.0).p90 == pytest.approx(1010.0)
