"""The client commands against a real `colocate scheduler` and one `colocate node` (two simulated GPUs) on
loopback: `status --json`, `submit` without `--priority`, an environment that does not fit (refused with
one line, nothing submitted, nothing dropped), and a gang failed by `kill -9` of one rank, whose exit code
is that rank's cause (137), not the stop we sent the others (143)."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from colocate.clients.scheduler import SchedulerClient
from tests.support import PY, Procs, alive, child_env, free_port, read_log, tiny_script, wait_for

WORKER = """\
import os, sys, time
with open(os.path.join(sys.argv[1], os.environ.get("RANK", "0")), "w") as f:
    f.write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
"""


class Cluster:
    def __init__(self, procs: Procs, tmp):
        self.tmp = tmp
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.scheduler = procs.start([PY, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state",
                                      tmp / "sched.db", "--config", "fifo"], "scheduler.log")
        self.node = procs.start([PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", 2, "--scheduler",
                                 self.endpoint, "--node-id", "n0", "--host", "127.0.0.1", "--endpoint",
                                 f"ipc://{tmp}/n0.sock", "--log-dir", tmp / "logs", "--state-dir", tmp / "n0"],
                                "node.log")
        self.pids = tmp / "pids"
        self.pids.mkdir()
        self.worker = tiny_script(tmp, "worker.py", WORKER)
        wait_for(lambda: "up" in self.cli("nodes").stdout or self.dead(), 60, what="the node to join")
        assert not self.dead(), read_log(self.scheduler) + read_log(self.node)

    def dead(self) -> bool:
        return self.scheduler.poll() is not None or self.node.poll() is not None

    def cli(self, *args, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "colocate", *map(str, args)], cwd=self.tmp,
                              env=child_env({"COLOCATE_SCHEDULER": self.endpoint, **(env or {})}),
                              capture_output=True, text=True, timeout=60)

    def status(self, job=None):
        proc = self.cli("status", "--json", *([job] if job else []))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture
def cluster(tmp_path):
    procs = Procs(tmp_path)
    try:
        yield Cluster(procs, tmp_path)
    finally:
        procs.cleanup()


def one_line(proc, prog: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"colocate {prog}: "), proc.stderr
    return lines[0]


@pytest.mark.timeout(300)
def test_status_json_submit_defaults_and_environments_that_do_not_fit(cluster):
    c = cluster
    sub = c.cli("submit", "--gpus", "1", "--name", "plain", "--", PY, c.worker, c.pids, "0")
    assert sub.returncode == 0, sub.stderr  # no --priority: guaranteed, as Slurm and Kubernetes users expect
    job = sub.stdout.strip()
    view = c.status(job)
    assert view["job_id"] == job and view["priority"] == "guaranteed" and view["name"] == "plain"
    assert [v["job_id"] for v in c.status()] == [job]

    big = c.cli("submit", "--gpus", "1", "--", PY, c.worker, c.pids, "0", env={"BIG_VAR": "v" * 70000})
    assert big.returncode == 2 and "BIG_VAR" in one_line(big, "submit") and "65536" in big.stderr
    many = {f"PART_{i}": "v" * 60000 for i in range(20)}  # each fits, together over one message
    huge = c.cli("submit", "--gpus", "1", "--", PY, c.worker, c.pids, "0", env=many)
    assert huge.returncode == 2 and "over the 960.0 KiB limit of a job's request" in one_line(huge, "submit")
    assert [v["job_id"] for v in c.status()] == [job]  # nothing was submitted


@pytest.mark.timeout(300)
def test_a_gang_killed_by_kill9_of_one_rank_reports_its_cause(cluster):
    c = cluster
    sub = c.cli("submit", "--gpus", "1", "--workers", "2", "--", PY, c.worker, c.pids, "120")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    wait_for(lambda: {"0", "1"} <= set(os.listdir(c.pids)) and all((c.pids / r).read_text() for r in "01"),
             120, what="both ranks to start")
    os.kill(int((c.pids / "1").read_text()), signal.SIGKILL)
    view = wait_for(lambda: (v := c.status(job))["state"] == "failed" and v, 60, what="the gang to fail")
    assert view["exit_code"] == 137 and "rank 1" in view["reason"], view
    # the other rank is stopped by us (exit 143) after the failure; once the node has told the scheduler it
    # runs no worker any more, that exit has been heard too: the job still reports the cause
    other = int((c.pids / "0").read_text())
    wait_for(lambda: not alive(other), 60, what="the stopped rank to exit")
    client = SchedulerClient(c.endpoint, None, timeout_s=5.0)  # the keys the scheduler made in the config folder
    wait_for(lambda: client.nodes().nodes[0].workers == 0, 60, what="the node to report no worker")
    assert c.status(job)["exit_code"] == 137


def test_submit_file_checks_every_line_first_then_submits_in_order_over_one_connection(cluster):
    c = cluster
    good = c.tmp / "good.jsonl"
    good.write_text("# a sweep\n" + "\n".join(json.dumps({"command": [PY, str(c.worker), str(c.pids), "0"],
                                                          "name": f"s{i}"}) for i in range(3)) + "\n\n")
    sub = c.cli("submit", "--gpus", "1", "--file", good)
    assert sub.returncode == 0 and not sub.stderr, sub.stderr
    ids = sub.stdout.split()
    assert len(ids) == 3 and [v["name"] for v in c.status() if v["job_id"] in ids] == ["s0", "s1", "s2"]

    bad = c.tmp / "bad.jsonl"
    ok = [PY, str(c.worker), str(c.pids), "0"]
    bad.write_text("\n".join([json.dumps({"command": ok, "gpus": 1}), "{not json",
                              json.dumps({"command": ok, "gpus": 0}),
                              json.dumps({"command": "python x.py", "gpus": 1}),
                              json.dumps({"command": ok, "gpu": 1}),
                              json.dumps({"command": [PY, "missing.py"], "gpus": 1})]))
    res = c.cli("submit", "--file", bad)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(lines) == 6, res.stderr
    assert [ln.split(":")[3] for ln in lines[:5]] == ["2", "3", "4", "5", "6"] and "nothing was submitted" in lines[5]
    assert "gpus" in lines[1] and "command" in lines[2] and "unknown field 'gpu'" in lines[3]
    assert "missing.py" in lines[4]
    assert len(c.status()) == 3  # nothing of the bad file

    refused = c.tmp / "refused.jsonl"  # valid lines; the scheduler refuses the third (no node has 8 GPUs)
    refused.write_text("\n".join(json.dumps({"command": [PY, str(c.worker), str(c.pids), "0"], **extra})
                                 for extra in ({}, {}, {"gpus": 8}, {})))
    res = c.cli("submit", "--gpus", "1", "--file", refused)
    line = one_line(res, "submit")
    assert res.returncode == 3 and len(res.stdout.split()) == 2, res.stderr  # 3: some submitted (2: none)
    assert ":3:" in line and "2 of 4 job(s) were submitted" in line and "none from line 3 on" in line
    assert len(c.status()) == 5
