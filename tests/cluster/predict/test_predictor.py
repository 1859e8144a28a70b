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


@pytest.mark.parametrize("key, p50, level", [
    (JobKey("e9", "f9", "ann", 1), 10 ** (5 / 3), "user+gpus"),  # 1 of 3 trusted: 1000^(1/3) x 10^(2/3)
    (ANN, 1000.0, "exact+gpus"),  # the same command's one success is trusted: never shrunk
])
def test_a_level_with_little_history_is_shrunk_toward_a_broader_one(key, p50, level):
    p = RunTimePredictor(trust=3)
    done(p, "a", ANN, 1000.0)
    for i in range(4):
        done(p, f"o{i}", JobKey("e2", "f2", "ann", 2), 10.0)  # ann's level: 10, 10, 10, 10, 1000
    got = p.predict(key, 2000.0)
    assert (got.level, got.p50) == (level, pytest.approx(p50))


def test_running_jobs_of_the_level_count_censored_and_by_projection():
    p = RunTimePredictor(trust=1)
    for i, w in enumerate((10.0, 20.0, 30.0)):
        done(p, f"h{i}", ANN, w)
    assert p.predict(ANN, 0.0).p50 == 20.0
    for i in range(4):  # four of the same job running 500 s already: the median is past every finished one
        p.started(f"r{i}", ANN, 0.0)
    got = p.predict(ANN, 500.0)  # S(500) = 4/7: the tail past 500 gives 500 x (4/7) / 0.5 and / 0.1
    assert (got.p50, got.p90, got.n) == (pytest.approx(4000 / 7), pytest.approx(20000 / 7), 3)
    assert p.progress("r0", 10, 100, 50.0, now=500.0)  # r0 projects 500 + 90 x 50 = 5000 s: an event
    assert p.predict(ANN, 500.0).n == 4
    for i in range(4):
        done(p, f"r{i}", ANN, 600.0)
    assert p.predict(ANN, 700.0).p50 == 600.0


def test_the_cohort_is_the_last_starts_and_the_last_successes():
    """A level keeps its last `window` starts (finished or not) and its last `window` successes: the
    last successes still predict when every recent start is running (a burst), and a running job that
    has left the start window no longer counts."""
    p = RunTimePredictor(window=2, trust=1)
    done(p, "old", ANN, 30.0, end=100.0)
    for i in range(3):
        p.started(f"r{i}", ANN, 1000.0 + i)
    got = p.predict(ANN, 1003.0)  # r1, r2 ran 2 s and 1 s: censored below 30; r0 left the window
    assert (got.p50, got.level, got.n) == (30.0, "exact+gpus", 1)


def test_history_heard_only_at_its_end_is_placed_by_its_start():
    """A record replayed from the journal (never seen starting) is placed in the start window by
    end - wall: a job that started before the window's starts does not push them out."""
    p = RunTimePredictor(window=2, trust=1)
    p.started("a", ANN, 100.0)
    p.started("b", ANN, 200.0)
    done(p, "early", ANN, 50.0, end=60.0)  # started at 10: older than a and b, so left out of the starts
    assert [e.job_id for e in p._started[("exact", "e1")]] == ["a", "b"]
    assert p.predict(ANN, 300.0).n == 1  # still one of the last successes


def test_failed_jobs_teach_nothing_and_leave_the_cohort():
    p = RunTimePredictor(trust=1)
    done(p, "h", ANN, 100.0)
    p.started("f", ANN, 0.0)
    assert p.predict(ANN, 10_000.0).p90 == pytest.approx(50_000.0)  # f has run 10,000 s: S = 1/2 past it
    done(p, "f", ANN, 10_000.0, end=10_000.0, exit=Exit.FAILED)
    assert p.predict(ANN, 10_000.0).p90 == 100.0


def test_a_more_specific_level_with_only_running_jobs_is_a_floor():
    """ann's other jobs took 10 s, but the last two of this exact job have run 1,000 s and are running:
    the user's level answers, no lower than the exact level's tail (2x and 10x the longest time run)."""
    p = RunTimePredictor(trust=1)
    other = JobKey("e2", "f2", "ann", 1)
    for i in range(3):
        done(p, f"o{i}", other, 10.0)
    p.started("r0", ANN, 0.0)
    p.started("r1", ANN, 500.0)
    got = p.predict(ANN, 1000.0)
    assert (got.p50, got.p90, got.level) == (2000.0, pytest.approx(10000.0), "user+gpus")
    assert p.predict(ANN, 1.0).p50 == 10.0  # a floor of 2 s changes nothing


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


@pytest.mark.parametrize("ran, p50, p90", [
    (50.0, 350.0, 350.0),  # ran 50 s: only the 400 s run is longer
    (500.0, 500.0, 4500.0),  # past every run seen: as long again at the p50, 9x at the p90 (the tail)
])
def test_remaining_without_progress_is_conditioned_on_time_run(ran, p50, p90):
    p = RunTimePredictor(trust=1)
    for i, w in enumerate((10.0, 20.0, 30.0, 400.0)):
        done(p, f"h{i}", ANN, w)
    p.started("j", ANN, 100.0)
    r = p.remaining("j", ANN, 100.0 + ran)
    assert (r.p50, r.p90, r.level) == (pytest.approx(p50), pytest.approx(p90), "exact+gpus")
    assert p.remaining("other", ANN, 150.0) is None


@pytest.mark.parametrize("submit, p50, level", [
    (61_000.0, 50.0, "near"),  # of bob's 1-GPU jobs submitted within the hour the two nearest ran 50, 70 s
    (70_000.0, 4000.0, "user+gpus"),  # none within the hour: all of bob's 1-GPU runs
    (None, 4000.0, "user+gpus"),  # no submit time given: no near level
])
def test_the_jobs_submitted_nearest_come_before_the_user(submit, p50, level):
    p = RunTimePredictor(trust=1, near=2)
    bob = JobKey("e5", "f5", "bob", 1)
    for job_id, t, wall in [("o1", 1000.0, 4000.0), ("o2", 2000.0, 8000.0), ("o3", 3000.0, 4000.0),
                            ("n1", 60_950.0, 50.0), ("n2", 61_100.0, 70.0), ("n3", 61_500.0, 5000.0)]:
        p.started(job_id, JobKey(job_id, job_id, "bob", 1), t, submit=t)
        done(p, job_id, JobKey(job_id, job_id, "bob", 1), wall, end=t + wall)
    got = p.predict(bob, 100_000.0, submit)
    assert (got.p50, got.level) == (p50, level)


@pytest.mark.parametrize("kw", [{"window": 0}, {"near": -1}, {"decay": 0.0}, {"decay": 1.5}, {"trust": 0}])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        RunTimePredictor(**kw)


@pytest.mark.parametrize("running, p50", [(True, 4000 / 7), (False, 20.0)])
def test_running_jobs_can_be_left_out(running, p50):
    p = RunTimePredictor(trust=1, running=running)
    for i, w in enumerate((10.0, 20.0, 30.0)):
        done(p, f"h{i}", ANN, w)
    for i in range(4):
        p.started(f"r{i}", ANN, 0.0)
    assert p.predict(ANN, 500.0).p50 == pytest.approx(p50)


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
