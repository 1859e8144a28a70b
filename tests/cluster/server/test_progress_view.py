"""``cluster.server.views.Progress``: the scheduler's latest progress per job, as nodes report it."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.server.views import Progress
from tests.colocate.test_protocol import FEATURES, PROGRESS

KNOWN = {"ddp-1", "other"}


def known(job_id):
    return job_id in KNOWN


def test_the_lowest_rank_speaks_and_features_stay_until_replaced():
    p = Progress()
    rank1 = dataclasses.replace(PROGRESS, rank=1, iterations=50, features=None)
    p.note([rank1], known)
    assert p.of("ddp-1", True) == rank1
    p.note([dataclasses.replace(PROGRESS, iterations=60)], known)  # rank 0, with features
    p.note([dataclasses.replace(rank1, iterations=70)], known)  # rank 1 again: rank 0 speaks for the job
    assert p.of("ddp-1", True).iterations == 60
    p.note([dataclasses.replace(PROGRESS, iterations=80, features=None)], known)  # later status: no features
    latest = p.of("ddp-1", True)
    assert latest.iterations == 80 and latest.features == FEATURES
    assert p.of("ddp-1", False) == dataclasses.replace(latest, features=None)


def test_unknown_jobs_are_dropped_and_the_oldest_forgotten():
    p = Progress(keep=1)
    p.note([dataclasses.replace(PROGRESS, job_id="by-hand")], known)
    assert p.of("by-hand", True) is None
    p.note([PROGRESS], known)
    p.note([dataclasses.replace(PROGRESS, job_id="other")], known)
    assert p.of("ddp-1", True) is None and p.of("other", True) is not None


def test_a_status_that_moves_a_jobs_iterations_reaches_the_predictor_and_a_repeat_does_not(tmp_path):
    from tests.cluster.server.helpers import FakeNode, Harness, one_running_job

    h = Harness(tmp_path / "s.db", policy="backfill")
    n = FakeNode(h, "n1")
    ack, _ = one_running_job(h, n)
    job = h.svc.core.job(ack.job_id)
    pred = h.svc.core.fw.plugin("predictor")
    assert pred.expected_end(job, "p90", h.now) is None  # no history, no progress: unknown
    report = dataclasses.replace(PROGRESS, job_id=ack.job_id, iterations=100, total_iterations=1100, step_p50_s=0.5,
                                 step_p90_s=1.0, since_report_s=0.0, features=None)
    events = h.svc.core.stats["events"]
    n.status(progress=(report,))
    assert pred.expected_end(job, "p90", h.now) == pytest.approx(h.now + 1000 * 1.0)
    assert pred.expected_end(job, "p50", h.now) == pytest.approx(h.now + 1000 * 0.5)
    assert h.svc.core.stats["events"] == events + 2  # the report and the job's progress
    n.status(progress=(report,))  # the same iterations again: the core hears the report only
    assert h.svc.core.stats["events"] == events + 3


def test_a_node_speaks_only_for_the_jobs_it_holds(tmp_path):
    """A node's status carrying the progress of a job placed on another node (a stale node, a forged report) moves
    nothing: neither the job's progress view nor its prediction."""
    from tests.cluster.server.helpers import FakeNode, Harness, one_running_job

    h = Harness(tmp_path / "s.db", policy="backfill")
    n1, n2 = FakeNode(h, "n1"), FakeNode(h, "n2")
    ack, _ = one_running_job(h, n1)
    n2.hello()
    job = h.svc.core.job(ack.job_id)
    pred = h.svc.core.fw.plugin("predictor")
    forged = dataclasses.replace(PROGRESS, job_id=ack.job_id, iterations=100, total_iterations=1100,
                                 step_p50_s=0.5, step_p90_s=1.0, since_report_s=0.0, features=None)
    n2.status(progress=(forged,))
    assert h.svc.progress.of(ack.job_id, True) is None
    assert pred.expected_end(job, "p90", h.now) is None
    n1.status(progress=(forged,))  # the node the job runs on
    assert h.svc.progress.of(ack.job_id, True) is not None
    assert pred.expected_end(job, "p90", h.now) == pytest.approx(h.now + 1000 * 1.0)
