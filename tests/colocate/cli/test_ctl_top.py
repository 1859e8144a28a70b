"""`colocate ctl` and `colocate top` as real commands against a real node running one real job."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from colocate import protocol as P
from colocate.gpus.spec import SIM_NAME
from tests.support import (
    JOB_START_S,
    PY,
    REPO,
    NodeProc,
    Procs,
    child_env,
    cnn,
    colocate_cli,
    read_log,
    start_job,
    wait_for,
)

GiB = 1 << 30
JOB_FIELDS = set(P.JobInfo.__dataclass_fields__)

# a job starts in here: on a fresh machine the first one also builds the allocator extension
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def setup(sim_ext):
    """A node with one guaranteed job that reports (killed at the end of the module)."""
    tmp = Path(tempfile.mkdtemp(prefix="clt-"))
    procs = Procs(tmp)
    try:
        node = NodeProc(procs, tmp, metrics=False).start()
        job = start_job(procs, node, "g1", *cnn("--duration", 120, "--host-ms", 10), stats=False)
        wait_for(lambda: node.jobs().get("g1") and node.jobs()["g1"].iterations >= 3 or job.poll() is not None,
                 JOB_START_S, what="the job to register and report")
        assert job.poll() is None, read_log(job)[-3000:]
        yield node, job, tmp
    finally:
        procs.cleanup()
        from torch_hooks.gate import gate_path

        try:
            Path(gate_path(f"ipc://{tmp}/node.sock", 0)).unlink()
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)


def no_traceback(res):
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr


def test_ctl_list_table(setup):
    node, job, _ = setup
    res = colocate_cli("ctl", "--node", node.endpoint, "list")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.strip() and not set(line.strip()) <= {"─"}]
    assert lines[0].strip() == "GPUs"
    assert lines[1].split() == ["GPU", "KIND", "MODEL", "MEMORY", "UTILIZATION", "JOBS"]
    assert lines[2].split()[:5] == ["0", "sim", SIM_NAME, "16.0", "GiB"] and lines[2].split()[-1] == "1"
    header = next(i for i, l in enumerate(lines) if l.split()[:1] == ["JOB"])
    assert lines[header - 1].strip() == "Jobs"
    assert lines[header].split() == ["JOB", "GPU", "PRIORITY", "PID", "CAP", "SHARE", "RESERVED", "HOST", "IT/S",
                                     "SLO", "ITERS"]
    row = lines[header + 1].split()
    pid = node.jobs()["g1"].pid
    assert row[:4] == ["g1", "0", "guaranteed", str(pid)]
    assert row[4:6] == ["16.0", "GiB"] and row[6] == "1.00"
    assert float(row[-3]) >= 0 and int(row[-1]) >= 3  # it/s, iterations
    no_traceback(res)


def test_ctl_list_json_and_explicit_ctl_endpoint(setup):
    node, job, _ = setup
    res = colocate_cli("ctl", "--ctl", node.ctl, "list", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["node_epoch"] == node.listing().node_epoch
    assert [g["index"] for g in data["gpus"]] == [0] and data["gpus"][0]["kind"] == "sim"
    assert 0.0 <= data["gpus"][0]["utilization"] <= 1.0
    (j,) = data["jobs"]
    assert set(j) == JOB_FIELDS
    assert j["job_id"] == "g1" and j["priority"] == "guaranteed" and j["mem_cap"] == 16 * GiB
    assert j["iterations"] >= 3 and j["throughput"] > 0 and j["mem_reserved"] > 0


def test_top_once(setup):
    node, job, _ = setup
    res = colocate_cli("top", "--node", node.endpoint, "--once")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for word in ("colocate top", "GPUs", "Jobs", "UTILIZATION", "g1", "guaranteed", "16.0 GiB", "IT/S", "SLO", "%"):
        assert word in out, (word, out)
    assert "not reachable" not in out
    no_traceback(res)


def test_ctl_set_and_errors_from_the_node(setup):
    node, job, _ = setup
    res = colocate_cli("ctl", "--node", node.endpoint, "set", "g1", "--gpu-mem", "8GiB")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith("g1: cap 8.0 GiB, share ")
    data = json.loads(colocate_cli("ctl", "--node", node.endpoint, "list", "--json").stdout)
    assert data["jobs"][0]["mem_cap"] == 8 * GiB
    # the job applies it: its reports name the override's limits seq, and it keeps running
    seq = int(re.search(r"\(seq (\d+)\)", res.stdout).group(1))
    assert [r["limits"]["mem_cap"] for r in node.records() if r["kind"] == "limits" and r["limits"]["seq"] == seq] \
        == [8 * GiB]
    wait_for(lambda: any(r["kind"] == "report" and r["limits_seq"] >= seq for r in node.records()), 30,
             what="a report under the override")
    assert job.poll() is None

    res = colocate_cli("ctl", "--node", node.endpoint, "clear", "g1")
    assert res.returncode == 0 and "overrides cleared" in res.stdout, res.stderr
    wait_for(lambda: json.loads(colocate_cli("ctl", "--node", node.endpoint, "list", "--json").stdout)["jobs"][0]
             ["slo_state"] != "override", 30, what="the job's label to leave override")

    res = colocate_cli("ctl", "--node", node.endpoint, "set", "no-such-job", "--sm-share", "0.5")
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "colocate ctl: unknown_job: job no-such-job is not registered with this node"]


@pytest.mark.parametrize("args", [
    ["list"], ["list", "--json"], ["set", "g1", "--sm-share", "0.5"],
])
def test_ctl_without_a_node_says_no_answer(tmp_path, args):
    endpoint = f"ipc://{tmp_path}/none.sock"
    t0 = time.monotonic()
    res = colocate_cli("ctl", "--node", endpoint, "--timeout", "1", *args)
    took = time.monotonic() - t0
    assert res.returncode == 1
    assert res.stderr.splitlines() == [f"colocate ctl: no answer from the node at {endpoint}.ctl"]
    assert res.stdout == ""
    assert took < 15  # never hangs
    no_traceback(res)


def test_top_once_without_a_node(tmp_path):
    res = colocate_cli("top", "--node", f"ipc://{tmp_path}/none.sock", "--once", "--timeout", "1")
    assert res.returncode == 1
    assert "node not reachable, retrying" in res.stdout
    no_traceback(res)


@pytest.mark.parametrize("args", [
    ["set", "g1", "--gpu-mem", "12XB"],
    ["set", "g1", "--gpu-mem", "-1GiB"],
    ["set", "g1", "--sm-share", "1.5"],
    ["set", "g1", "--gpu-mem", "0"],
    ["clear"],
    ["clear", "g1", "--sm-share", "0.5"],
    ["set", "g1"],
    ["set"],
    ["frobnicate"],
    [],
])
def test_ctl_bad_arguments_exit_2(tmp_path, args):
    res = colocate_cli("ctl", "--node", f"ipc://{tmp_path}/none.sock", *args)
    assert res.returncode == 2, (args, res.stdout, res.stderr)
    assert res.stderr.strip()
    no_traceback(res)


def test_ctl_bad_endpoints_exit_2(tmp_path):
    res = colocate_cli("ctl", "--node", "tcp://127.0.0.1:1", "list")  # no .ctl to derive
    assert res.returncode == 2 and "--ctl" in res.stderr
    res = colocate_cli("ctl", "--ctl", "not-an-endpoint", "list")
    assert res.returncode == 2 and "not-an-endpoint" in res.stderr
    no_traceback(res)


class FakeCtl:
    """A node's operator endpoint played by the test: a ROUTER thread that counts the ``CtlList`` requests it
    gets and answers each with a one-job listing (``answer=True``) or never (a node that is not there)."""

    LISTING = P.CtlJobs(node_epoch=5, gpus=(P.GpuInfo(index=0, mem_total=16 * GiB, utilization=0.5, kind="sim"),),
                        jobs=(P.JobInfo(job_id="fake-g1", gpu=0, priority="guaranteed", pid=1, mem_cap=16 * GiB,
                                        sm_share=1.0, mem_reserved=GiB, mem_allocated_peak=GiB, host_bytes=0,
                                        throughput=10.0, slo_state="ok", iterations=7),))

    def __init__(self, endpoint: str, answer: bool):
        import zmq

        self.endpoint, self.answer = endpoint, answer
        self.requests = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        try:
            while not self._stop.is_set():
                if not self._sock.poll(50):
                    continue
                ident, data = self._sock.recv_multipart()
                assert isinstance(P.decode(data), P.CtlList)
                if self.answer:
                    self._sock.send_multipart([ident, P.encode(self.LISTING)])
                with self._cond:
                    self.requests += 1
                    self._cond.notify_all()
        finally:
            self._sock.close(0)

    def wait_requests(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.requests >= n, timeout)

    def close(self):
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("with_node", [True, False], ids=["node", "no-node"])
def test_top_live_exits_0_on_ctrl_c(tmp_path, with_node):
    endpoint = f"ipc://{tmp_path}/n.sock"
    fake = FakeCtl(endpoint + ".ctl", answer=with_node)
    # as from a terminal: Ctrl-C's signal not ignored, even where the suite itself was started in the background
    # of a script (``cmd &`` ignores SIGINT, and an ignored signal stays ignored across exec)
    proc = subprocess.Popen([PY, "-m", "colocate", "top", "--node", endpoint, "--interval", "0.2", "--timeout", "0.3"],
                            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Ctrl-C once top is in its live loop: it has refreshed three times (three requests reached the node)
        assert fake.wait_requests(3, 60), f"top made {fake.requests} requests"
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # a bound for a loaded machine; it exits within a refresh
    finally:
        fake.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    if with_node:
        assert "fake-g1" in out and "node not reachable" not in out
    else:
        assert "node not reachable, retrying" in out
