"""What a job teaches the cluster, end to end: a real scheduler and node (one simulated GPU), an example training
script submitted with ``--iterations``; the job's features (read in the job at its first mini-batch) and its
progress (summarised by the node) reach the scheduler, which shows them on the job's view and in
``colocate status JOB``."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from colocate.clients.scheduler import request_from_here
from tests.integration.test_cluster import EXAMPLES, Cluster
from tests.support import PY, REPO, Procs, wait_for

ITERS = 400


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.mark.timeout(240)
def test_features_and_progress_reach_the_scheduler(procs, tmp_path):
    c = Cluster(procs, tmp_path, nodes=1, gpus=1)
    req = request_from_here([PY, str(EXAMPLES / "train_cnn.py"), "--iters", str(ITERS), "--host-ms", "5",
                             "--log-every", "0", "--batch-size", "16"], gpus=1, cwd=str(c.work),
                            environ=dict(os.environ), iterations=ITERS)
    job_id = c.client.submit(req)

    def learned():
        assert c.scheduler.poll() is None, c.logs()
        view = c.client.job(job_id)
        assert view.state not in ("failed", "cancelled"), (view, c.logs())
        p = view.progress
        return view if p is not None and p.features is not None and p.iterations >= 20 else None

    view = wait_for(learned, 180, interval=0.5, what="the job's features and 20 iterations of progress at the scheduler")
    p, f = view.progress, view.progress.features
    m = f.model
    kinds = dict(m.layer_counts)
    assert kinds.get("Conv2d", 0) >= 2 and kinds.get("Linear", 0) >= 1, kinds
    assert m.batch_size == 16 and m.optimizers and m.params > 0 and m.flops_per_iteration > 0
    assert (f.hardware.kind, f.hardware.name, f.hardware.gpus, f.hardware.sim_speed) == ("sim", "colocate-sim", 1, 1.0)
    assert f.iterations_hint == ITERS and p.total_iterations == ITERS
    assert 20 <= p.iterations <= ITERS and p.window > 0
    assert 0 < p.step_p50_s <= p.step_p90_s and p.step_mean_s > 0
    assert p.mem_allocated_peak > 0 and p.mem_reserved_peak >= p.mem_allocated_peak
    assert 0 < p.busy_fraction <= 1
    (paged,) = [j for j in c.client.jobs()[0] if j.job_id == job_id]  # a page of jobs carries no features
    assert paged.progress is not None and paged.progress.features is None

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([PY, "-m", "colocate", "status", job_id, "--scheduler", c.endpoint], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"of {ITERS}" in out.stdout and "GFLOP/iteration" in out.stdout and "Conv2d" in out.stdout, out.stdout
    as_json = subprocess.run([PY, "-m", "colocate", "status", job_id, "--json", "--scheduler", c.endpoint], env=env,
                             capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["progress"]["features"]["model"]["batch_size"] == 16


@pytest.mark.timeout(360)
def test_a_job_submitted_again_gets_its_recommendation_and_a_restart_keeps_the_history(procs, tmp_path):
    """Submit an example twice (real scheduler and node, one simulated GPU): the first run leaves its history
    record; the second, submitted with --gpu-mem auto --sm-share auto, gets its recommendation (exact level, one
    run), runs under it to the end, and shows its prediction in ``colocate status``; after the scheduler is killed
    and started again on its journal, ``colocate recommend`` answers from both runs."""
    import signal

    c = Cluster(procs, tmp_path, nodes=1, gpus=1)
    command = [PY, str(EXAMPLES / "train_cnn.py"), "--iters", "120", "--host-ms", "5", "--log-every", "0",
               "--batch-size", "16"]

    def run(**kw) -> str:
        req = request_from_here(command, gpus=1, cwd=str(c.work), environ=dict(os.environ), iterations=120, **kw)
        return c.client.submit(req)

    def ended(job_id: str):
        assert c.scheduler.poll() is None, c.logs()
        view = c.client.job(job_id)
        assert view.state not in ("failed", "cancelled"), (view, c.logs())
        return view if view.state == "succeeded" else None

    first = run()
    assert c.client.job(first).advice == ""  # it left nothing to a recommendation
    wait_for(lambda: ended(first), 200, interval=0.5, what="the first run to succeed")
    rec = c.client.recommend(command=command, cwd=str(c.work))
    assert (rec.gpu_mem.level, rec.gpu_mem.history, rec.identity) == ("exact", 1, "content"), rec
    assert rec.sm_share is not None and rec.run_time is not None and rec.run_time.level == "exact+gpus"

    second = run(auto=("gpu_mem", "sm_share"))
    view = c.client.job(second)
    assert not view.learning and "gpu-mem" in view.advice and "(exact, 1 run(s))" in view.advice, view
    assert view.prediction is not None  # p50/p90 before it runs, or what is left once it runs
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    status = subprocess.run([PY, "-m", "colocate", "status", second, "--scheduler", c.endpoint], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "predicted" in status.stdout and "gpu-mem" in status.stdout, status
    wait_for(lambda: ended(second), 200, interval=0.5, what="the second run to succeed under its recommendation")
    with c.db() as db:
        rows = db.execute("SELECT job_id, exit, record FROM history ORDER BY seq").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(first, "succeeded"), (second, "succeeded")]
    last = json.loads(rows[-1][2])
    assert last["recommended"] and last["mem_cap"] == int(rec.gpu_mem.value) and last["peak_mem"] <= last["mem_cap"]

    c.scheduler.send_signal(signal.SIGKILL)
    c.scheduler.wait(10)
    c.start_scheduler()
    out = subprocess.run([PY, "-m", "colocate", "recommend", "--scheduler", c.endpoint, "--", *command], env=env,
                         capture_output=True, text=True, timeout=60, cwd=str(c.work))
    assert out.returncode == 0 and "(2 run(s), exact level)" in out.stdout, (out.stdout, out.stderr)
