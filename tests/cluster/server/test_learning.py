"""cluster/server/learning.py through the service: each run that ends leaves one history record in the journal,
written with its end; a restart (or a rebuilt core) predicts from the same history."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.predict.history import Exit
from colocate import protocol as P
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, replies
from tests.colocate.test_protocol import PROGRESS


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path / "s.db", policy="backfill")


def run_job(h, n, **kw):
    """Submit a one-GPU job and start it on ``n``: (job id, placement id)."""
    (ack,) = replies(h.submit(gpus=1, **kw), P.Submitted)
    n.start_all()
    pid = [m for m in n.inbox(P.StartPlacement) if m.job_id == ack.job_id][0].placement_id
    return ack.job_id, pid


def progress(job_id, **kw):
    base = dict(job_id=job_id, iterations=100, total_iterations=400, step_p50_s=0.5, step_p90_s=0.7,
                mem_reserved_peak=3 << 30, mem_allocated_peak=2 << 30, busy_fraction=0.4, since_report_s=0.0)
    return dataclasses.replace(PROGRESS, **{**base, **kw})


def test_a_run_that_ends_leaves_one_record_with_what_its_node_reported(h):
    n = FakeNode(h, "n1")
    n.hello()
    job_id, pid = run_job(h, n)
    n.status(progress=(progress(job_id),))
    h.now += 60.0
    n.exit(pid, 0)
    (rec,) = h.journal.history_of_job(job_id)
    spec = h.svc.core.job(job_id).spec
    assert (rec.exit, rec.exact, rec.family, rec.user, rec.gpus, rec.gpu_type) == (
        Exit.SUCCEEDED, spec.fingerprint, spec.family, spec.user, 1, "sim")
    assert rec.exact and rec.wall_s == pytest.approx(60.0)
    assert (rec.iterations, rec.step_p50_s, rec.step_p90_s, rec.peak_mem, rec.busy) == (100, 0.5, 0.7, 3 << 30, 0.4)
    assert rec.features == P.record_map(PROGRESS.features)
    assert h.journal.job(job_id)["state"] == "succeeded"


@pytest.mark.parametrize("how, code, oom, exit_", [
    ("exit", 1, False, Exit.FAILED),
    ("exit", 1, True, Exit.OOM),
    ("cancel", None, False, Exit.KILLED),
])
def test_the_exit_state_is_recorded(h, how, code, oom, exit_):
    n = FakeNode(h, "n1")
    n.hello()
    job_id, pid = run_job(h, n)
    if how == "cancel":
        h.send(CLIENT, P.Cancel(job_id=job_id))
    else:
        h.send(n.ident, P.WorkerExited(node_id="n1", epoch=1, job_id=job_id, placement_id=pid, rank=0,
                                       exit_code=code, oom=oom))
    (rec,) = h.journal.history_of_job(job_id)
    assert rec.exit == exit_ and rec.iterations is None  # no progress was reported
    if oom:
        assert "ran out of GPU memory" in h.journal.job(job_id)["reason"]


def test_a_job_that_never_ran_leaves_no_record(h):
    n = FakeNode(h, "n1")
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    h.send(CLIENT, P.Cancel(job_id=ack.job_id))  # placed, never started
    assert h.journal.history_of_job(ack.job_id) == []


def test_a_restart_predicts_from_the_same_history(h):
    n = FakeNode(h, "n1")
    n.hello()
    for wall in (100.0, 200.0, 300.0):
        job_id, pid = run_job(h, n)
        h.now += wall
        n.exit(pid, 0)
    spec = h.svc.core.job(job_id).spec
    before = h.svc.core.fw.plugin("predictor").quantiles(spec, h.now)
    assert before is not None and before.level == "exact+gpus" and before.n == 3
    h.restart()
    assert h.svc.core.fw.plugin("predictor").quantiles(spec, h.now) == before
    assert len(h.svc.learning.learned) == 3


def test_views_show_the_prediction_a_pending_job_waits_with_and_the_time_left_of_a_running_one(h):
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    for wall in (100.0, 200.0, 300.0):
        job_id, pid = run_job(h, n)
        h.now += wall
        n.exit(pid, 0)
    running, _ = run_job(h, n)
    (ack,) = replies(h.submit(gpus=1), P.Submitted)  # waits: the one GPU is taken
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(active_only=True)), P.JobsReply)
    views = {v.job_id: v for v in reply.jobs}
    pending, run = views[ack.job_id].prediction, views[running].prediction
    assert (pending.level, pending.history, pending.remaining) == ("exact+gpus", 3, False)
    assert 100.0 <= pending.p50_s <= pending.p90_s <= 300.0
    assert run.remaining and run.p90_s >= run.p50_s  # from its run time so far and the history
    n.status(progress=(progress(running, iterations=100, total_iterations=400, step_p50_s=0.5, step_p90_s=1.0),))
    (one,) = replies(h.send(CLIENT, P.JobsRequest(job_id=running)), P.JobsReply)
    got = one.jobs[0].prediction
    assert (got.level, got.history, got.p50_s, got.p90_s) == ("progress", 100, 150.0, 300.0)
    n.status(progress=(progress(running, iterations=200, total_iterations=400, step_p50_s=0.5, step_p90_s=1.0,
                                step_mean_s=0.6),))  # the window's mean is what the projection uses
    (one,) = replies(h.send(CLIENT, P.JobsRequest(job_id=running)), P.JobsReply)
    got = one.jobs[0].prediction
    assert (got.level, got.history, got.p50_s) == ("progress", 200, 120.0)


def test_without_a_predictor_plugin_the_views_predict_from_the_services_own_model(tmp_path):
    h = Harness(tmp_path / "s.db", policy="gang-binpack")
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    job_id, pid = run_job(h, n)
    h.now += 50.0
    n.exit(pid, 0)
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)
    assert reply.jobs[0].prediction.level == "exact+gpus" and reply.jobs[0].prediction.p50_s == 50.0
    h.restart()
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=ack.job_id)), P.JobsReply)
    assert reply.jobs[0].prediction.p50_s == 50.0  # learned again from the journal


V100_T4 = (("V100", 1.0), ("V100", 1.0), ("T4", 0.6), ("T4", 0.6))  # --sim-gpus 2:V100,2:T4@0.6: one node, two models


def hello_typed(h, node_id, gpus, epoch=1):
    """A node of the GPUs ``gpus`` ((model, declared speed) by index) says hello and joins with its first status."""
    n = FakeNode(h, node_id, gpus=len(gpus), epoch=epoch)
    listed = tuple(P.NodeGpu(index=i, model=model, mem_total=16 << 30, speed=speed)
                   for i, (model, speed) in enumerate(gpus))
    h.send(n.ident, P.NodeHello(node_id=node_id, epoch=epoch, host="127.0.0.1", gpus=listed))
    n.status()
    return n


def test_a_run_is_recorded_with_the_model_of_the_gpus_it_ran_on_not_its_nodes_first(h):
    """A node of two models registers none in the core (``node_model``); a job on its GPU 2 or 3 ran on a T4 and
    says so, one on GPU 0 or 1 on a V100."""
    n = hello_typed(h, "mixed", V100_T4)
    assert h.svc.core.state.nodes["mixed"].model == ""
    ran, pids = {}, []
    for _ in range(4):
        job_id, pid = run_job(h, n)
        (start,) = [m for m in n.inbox(P.StartPlacement) if m.placement_id == pid]
        ran[job_id] = V100_T4[start.workers[0].gpus[0]][0]
        pids.append(pid)
    for pid in pids:
        n.exit(pid, 0)
    recorded = {job_id: rec.gpu_type for job_id in ran for rec in h.journal.history_of_job(job_id)}
    assert recorded == ran and sorted(ran.values()) == ["T4", "T4", "V100", "V100"]


@pytest.mark.parametrize("speeds, expected", [
    ((0.0, 0.6), "T4"),  # the slowest declared: a synchronous gang runs at its T4's pace
    ((0.5, 0.6), "V100"),  # V100 declared slower here
    ((0.0, 0.0), "V100"),  # none declared: the first rank's
])
def test_a_gang_across_gpu_types_is_recorded_with_the_slowest(h, speeds, expected):
    n = hello_typed(h, "mixed", [(m, speeds[m == "T4"]) for m, _ in V100_T4])
    (ack,) = replies(h.submit(workers=2, gpus=2), P.Submitted)
    n.start_all()
    (start,) = n.inbox(P.StartPlacement)
    assert sorted(w.gpus for w in start.workers) == [(0, 1), (2, 3)]  # a worker on each model
    n.exit(start.placement_id, 0)
    (rec,) = h.journal.history_of_job(ack.job_id)
    assert rec.gpu_type == expected


def test_the_gpu_type_of_a_placement_without_a_hellos_models_is_its_nodes():
    from cluster.server.learning import gpu_type
    from cluster.spec import Placement, WorkerSlot

    p = Placement("j.1", "j", (WorkerSlot(0, "a", (3,)), WorkerSlot(1, "b", (0,))), "guaranteed")
    registered = {"a": "A100", "b": "T4"}.get
    assert gpu_type(p, {}, {}, lambda n: registered(n) or "") == "A100"  # first rank's: no speed declared
    assert gpu_type(p, {}, {"T4": 0.6}, lambda n: registered(n) or "") == "T4"
    assert gpu_type(p, {"a": {3: "H100"}}, {}, lambda n: registered(n) or "") == "H100"
    assert gpu_type(None, {}, {}, lambda n: "") == "" and gpu_type(p, {}, {}, lambda n: "") == ""
