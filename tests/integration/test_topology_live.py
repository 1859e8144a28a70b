"""Network-aware placement live: a real ``colocate scheduler --config topology`` and three real ``colocate
node`` daemons on 127.0.0.1 with simulated GPUs, labelled with two switches (n0 by its own ``--topology``,
n1 likewise, n2 by the scheduler's ``--topology`` file). Join order n0, n1, n2 and two GPUs each: a
topology-blind bin-packer puts a 4-worker gang on n0 + n1 (two switches); the topology plugin puts it on
n0 + n2, under one switch. n0 and n1 have typed simulated GPUs (``--sim-gpus 2:V100``, ``2:T4@0.5``): the
scheduler sees the type as the node's GPU model. Every wait is bounded; every process is stopped by its pid
(``Procs``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import PY, REPO, Procs, child_env, free_port, read_log, wait_for, wait_until_scheduler_answers

SLEEP = "import sys, time; time.sleep(float(sys.argv[1]))"


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.mark.timeout(300)
def test_a_four_worker_gang_lands_under_one_switch(procs, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    topo = tmp_path / "topology.csv"
    topo.write_text("node_id,switch,rack\nn2,s1,r1\n")
    sched = procs.start([PY, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp_path / "s.db",
                         "--config", "topology", "--topology", topo, "--log-level", "info"], "scheduler.log")
    client = SchedulerClient(endpoint, None, timeout_s=2.0)
    wait_until_scheduler_answers(sched, client)
    labels = {"n0": ["--topology", "switch=s1,rack=r1"], "n1": ["--topology", "switch=s2,rack=r1"], "n2": []}
    types = {"n0": "2:V100", "n1": "2:T4@0.5", "n2": "2"}  # typed simulated GPUs: the type is the node's model
    for i, (node_id, extra) in enumerate(labels.items()):
        procs.start([PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", types[node_id], "--scheduler",
                     endpoint,
                     "--node-id", node_id, "--host", "127.0.0.1", "--endpoint", f"ipc://{tmp_path}/{node_id}.sock",
                     "--log-dir", tmp_path / "logs", "--state-dir", tmp_path / node_id, *extra], f"{node_id}.log")
        # one at a time, so the join order (which a bin-packer follows) is n0, n1, n2
        wait_for(lambda k=i + 1: sum(n.up for n in client.nodes().nodes) == k, 90, interval=0.2,
                 what=f"node {node_id} to join")
    views = {n.node_id: (n.switch, n.rack, n.gpu_model) for n in client.nodes().nodes}
    assert views == {"n0": ("s1", "r1", "V100"), "n1": ("s2", "r1", "T4"), "n2": ("s1", "r1", "colocate-sim")}
    table = subprocess.run([PY, "-m", "colocate", "nodes", "--scheduler", endpoint], capture_output=True, text=True,
                           timeout=60, env=child_env(), cwd=REPO)
    lines = [ln.split() for ln in table.stdout.splitlines() if ln.strip() and not set(ln.strip()) <= set("─━ ")]
    assert table.returncode == 0 and lines[0][:6] == ["NODE", "HOST", "STATE", "MODEL", "SWITCH", "RACK"], table
    assert {ln[0]: (ln[3], ln[4], ln[5]) for ln in lines[1:]} == {k: (m, s, r) for k, (s, r, m) in views.items()}
    req = request_from_here([PY, "-c", SLEEP, "1"], workers=4, gpus=1, name="gang", environ=dict(os.environ),
                            cwd=str(tmp_path))
    job_id = client.submit(req)

    def placed():
        assert sched.poll() is None, read_log(sched)[-3000:]
        jobs, _ = client.jobs()
        j = next(j for j in jobs if j.job_id == job_id)
        return j if j.nodes else None

    job = wait_for(placed, 60, interval=0.2, what="the gang to be placed")
    assert sorted(job.nodes) == ["n0", "n2"], (job, read_log(sched)[-2000:])
    done = wait_for(lambda: next(j for j in client.jobs()[0] if j.job_id == job_id).state in ("succeeded", "failed"),
                    120, interval=0.5, what="the gang to finish")
    assert done
    assert next(j for j in client.jobs()[0] if j.job_id == job_id).state == "succeeded"
