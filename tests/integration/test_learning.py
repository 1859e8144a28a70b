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
