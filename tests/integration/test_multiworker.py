"""Jobs of several worker processes: torchrun under `colocate run --gpus` against a real `colocate node`, and
examples/train_ddp.py's gang behaviour (checkpoint on SIGTERM and resume; a missing worker hangs it until its
--dist-timeout). Every process is killed by group when a test ends; waits poll with deadlines on what the
processes themselves print or report.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import JOB_START_S, PY, REPO, NodeProc, child_env, finish, free_port, read_log, stats_of, wait_for

DDP = str(REPO / "examples" / "train_ddp.py")
TORCHRUN = str(Path(PY).parent / "torchrun")


def torchrun(nproc: int, *args) -> list[str]:
    return [TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), DDP, *map(str, args)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchrun_job_of_two_workers_registers_one_worker_per_gpu(sim_ext, procs, ipc_dir):
    node = NodeProc(procs, ipc_dir, "--sim-gpus", 2).start()
    stats = ipc_dir / "ddp.stats.json"
    t0 = time.monotonic()
    job = procs.start([PY, "-m", "colocate", "run", "--device", "sim", "--node", node.endpoint, "--gpus", "0,1",
                       "--job-id", "ddp", "--stats-file", stats, "--",
                       *torchrun(2, "--iters", 400, "--log-every", 100, "--host-ms", 5)], "ddp.log")
    jobs = wait_for(lambda: (lambda js: js if {"ddp/0", "ddp/1"} <= set(js) else None)(node.jobs()), JOB_START_S,
                    what="both workers in the node's listing")
    assert (jobs["ddp/0"].gpu, jobs["ddp/1"].gpu) == (0, 1)  # each worker on its own GPU
    assert jobs["ddp/0"].pid != jobs["ddp/1"].pid and {j.priority for j in jobs.values()} == {"guaranteed"}
    wait_for(lambda: all(node.jobs().get(w) and node.jobs()[w].iterations >= 5 for w in ("ddp/0", "ddp/1")), 60,
             what="reports from both workers")
    job.stats_path = stats
    assert finish(job, 180) == 0, read_log(job)[-3000:]
    wall = time.monotonic() - t0
    assert "done: 400 iterations" in read_log(job)
    reports = {r["job_id"] for r in node.records() if r["kind"] == "report"}
    assert {"ddp/0", "ddp/1"} <= reports
    wait_for(lambda: "job ddp/0 left: exited" in node.log() and "job ddp/1 left: exited" in node.log(), 30,
             what="both workers to say goodbye")
    assert "in use by pid" not in node.log()  # the second worker is no longer taken for the first
    s = stats_of(job)
    assert s["exit_code"] == 0 and s["iterations"] >= 400
    print(f"torchrun 2 workers x 400 iterations under a sim node: {wall:.1f} s wall")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_ddp_saves_on_sigterm_and_resumes_from_the_saved_iteration(procs, ipc_dir):
    ckpt = ipc_dir / "ddp.pt"
    first = procs.start(torchrun(2, "--duration", 300, "--log-every", 20, "--checkpoint", ckpt), "first.log")

    def progressed():
        found = [int(n) for n in re.findall(r"^iter (\d+)/", read_log(first), re.M)]
        return found and max(found) >= 60

    wait_for(progressed, 120, what="the gang to pass iteration 60")
    os.killpg(first.pid, signal.SIGTERM)  # as a node's StopPlacement does: the whole process group
    finish(first, 60)
    saved = re.search(r"SIGTERM: checkpoint saved at iteration (\d+)", read_log(first))
    assert saved, read_log(first)[-3000:]
    k = int(saved.group(1))
    assert k >= 60 and ckpt.exists()
    again = procs.start(torchrun(2, "--iters", k + 40, "--log-every", 0, "--checkpoint", ckpt), "again.log")
    assert finish(again, 120) == 0, read_log(again)[-3000:]
    text = read_log(again)
    assert f"resumed from iteration {k}" in text and f"done: {k + 40} iterations" in text


@pytest.mark.slow
def test_a_gang_with_a_missing_worker_hangs_until_its_timeout(tmp_path):
    env = child_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port())})
    timeout_s = 4
    t0 = time.monotonic()
    proc = subprocess.run([PY, DDP, "--iters", "10", "--dist-timeout", str(timeout_s)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    waited = time.monotonic() - t0
    assert proc.returncode != 0
    assert "1/2 clients joined" in proc.stderr or "Timed out" in proc.stderr, proc.stderr[-2000:]
    assert waited >= timeout_s  # it waited for the missing worker that long, not less
    assert "training:" not in proc.stdout  # it never got past the rendezvous
