"""A live one-node cluster for benchmarks that run the example scripts and read what colocate learnt
(not a benchmark itself).

``Cluster(sim_gpus)`` starts a real ``colocate scheduler`` and one ``colocate node --scheduler`` with
simulated GPUs (``--sim-gpus`` as the node takes it), with CURVE keys as a cluster runs; ``run_job``
submits one job through the client API and follows it to its end, polling ``status`` every ``poll_s``:
each time the job's progress summary (``JobProgress``, as its node last reported it) changes, a
``Seen`` is kept with the local wall time it was first seen. Stop with ``close()`` (or ``with``).
Processes are stopped by their own process group ids.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TERMINAL = {"succeeded", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Seen:
    at: float  # local wall clock when this summary was first seen (the scheduler had it by then)
    progress: object  # colocate.protocol.JobProgress


@dataclass
class JobRun:
    job_id: str
    command: list[str]
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    state: str = ""
    exit_code: int | None = None
    seen: list[Seen] = field(default_factory=list)
    features: object = None  # colocate.protocol.Features, once reported

    def last(self):
        return self.seen[-1].progress if self.seen else None


class Cluster:
    def __init__(self, sim_gpus: str = "1", log_level: str = "warning", heartbeat_s: float | None = None,
                 record: bool = False):
        from colocate.base import keys as K
        from colocate.clients import rpc
        from colocate.clients.scheduler import SchedulerClient

        self.tmp = Path(tempfile.mkdtemp(prefix="colocate-bench-runs-"))
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        keys = self.tmp / "keys"
        K.generate(str(keys), K.NODE, "n0")
        K.generate(str(keys), K.USER, "bench")
        (keys / "users").write_text(f"bench {getpass.getuser()}\n")
        py = sys.executable
        beat = ["--heartbeat", str(heartbeat_s)] if heartbeat_s else []
        self.record = self.tmp / "node.record" if record else None
        rec = ["--record", self.record] if self.record else []
        self.procs = []
        self.procs.append(self._spawn([py, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state",
                                       self.tmp / "s.db", "--config", "gang-binpack", "--log-level", log_level,
                                       "--keys", keys, *beat], self.tmp / "scheduler.log"))
        self.procs.append(self._spawn([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", sim_gpus,
                                       "--scheduler", self.endpoint, "--node-id", "n0", "--endpoint",
                                       f"ipc://{self.tmp}/n0.sock", "--log-dir", self.tmp / "logs", "--state-dir",
                                       self.tmp / "n0", "--log-level", log_level, "--keys", keys, *rec],
                                      self.tmp / "node.log"))
        self.client = SchedulerClient(self.endpoint, str(keys), timeout_s=5.0)

        def joined():
            try:
                return any(n.up for n in self.client.nodes().nodes)
            except rpc.RpcError:
                return False

        try:
            _wait(joined, 60, "the node to join")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _spawn(argv, log):
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
        return subprocess.Popen([str(a) for a in argv], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)

    def run_job(self, command: list[str], *, iterations: int | None, timeout_s: float = 600.0,
                poll_s: float = 0.1, name: str = "") -> JobRun:
        """Submit ``command`` (one worker, one GPU, guaranteed) and follow it to its end."""
        from colocate.clients.scheduler import request_from_here

        req = request_from_here(command, gpus=1, priority="guaranteed", name=name, iterations=iterations,
                                cwd=str(Path(__file__).resolve().parent.parent))
        t0 = time.time()
        run = JobRun(self.client.submit(req), list(command), t0)
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.client.job(run.job_id)
            now = time.time()
            p = view.progress
            if p is not None:
                if p.features is not None:
                    run.features = p.features
                last = run.last()
                if last is None or (p.iterations, p.since_report_s, p.step_p50_s) != (
                        last.iterations, last.since_report_s, last.step_p50_s):
                    run.seen.append(Seen(now, p))
            if view.state in TERMINAL:
                run.state, run.exit_code = str(view.state), view.exit_code
                run.started_at, run.ended_at = view.started_at, view.ended_at
                return run
            if time.monotonic() > deadline:
                self.client.cancel(run.job_id)
                raise SystemExit(f"job {run.job_id} ({' '.join(command)}) did not end in {timeout_s:.0f} s")
            time.sleep(poll_s)

    def reports(self, job_id: str) -> list[dict]:
        """The ``report`` rows (``BatchReport`` fields) the node recorded for ``job_id``'s first worker, in the
        job's order (its ``--record``; empty without one)."""
        if self.record is None:
            return []
        from colocate.node import record as R

        with open(self.record) as f:
            rows = [json.loads(line) for line in f if '"report"' in line]
        return sorted((r for r in rows if r.get("kind") == R.REPORT and r["job_id"] in (job_id, job_id + "/0")),
                      key=lambda r: r["seq"])

    def durations(self, job_id: str) -> list[float]:
        """``duration_s`` of each mini-batch of ``job_id``'s first worker, in order (``reports``)."""
        return [r["duration_s"] for r in self.reports(job_id)]

    def last_report_wall(self, job_id: str) -> float | None:
        """Local wall time of the last mini-batch report the node received from ``job_id``'s workers (from its
        ``--record``; the node's clock is this machine's monotonic clock), None without a record or report."""
        if self.record is None:
            return None
        from colocate.node import record as R

        times = [b.node_t for b in R.read(str(self.record)).batches
                 if b.job_id == job_id or b.job_id.startswith(job_id + "/")]
        return max(times) + (time.time() - time.monotonic()) if times else None

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")
