"""Submit load through real sockets: a scheduler process to load, and client processes that submit.

Used by ``scheduler_submit.py`` (throughput and latency), ``scheduler_crash.py`` (kill -9 during bursts)
and the integration test of the group commit. A client process (``python _submit_load.py worker ...``)
keeps one connection (``SchedulerClient``), submits one job after another from ``--start`` until
``--until`` (wall clock) or until ``--stop-file`` exists, with request ids ``TAG-N``, and appends one
line per submit to ``--out``: ``request_id job_id seconds`` (``job_id`` ``-`` when no answer came).

Two ways to load: closed (the default: the next submit goes as soon as the last is answered, so the
latency is whatever the saturated server gives) and paced (``--interval S``: the Nth submit is due at
``start + offset + N*S``; the latency is counted from when it was due, not from when it went, so a server
that falls behind is charged for the wait it causes: no "coordinated omission").
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def make_keys(folder: Path) -> Path:
    """CURVE keys as a cluster has them by default: the scheduler's and one user's (``load``)."""
    from colocate.base import keys as K

    K.generate(str(folder), K.USER, "load", exist_ok=True)
    return folder


def start_scheduler(state: Path, endpoint: str, keys: Path | None, log: Path) -> subprocess.Popen:
    auth = ["--keys", str(keys)] if keys else ["--insecure"]
    return subprocess.Popen([sys.executable, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", str(state),
                             "--config", "gang-binpack", "--log-level", "warning", *auth],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True, env=child_env())


def wait_ready(endpoint: str, keys: Path | None, proc: subprocess.Popen, timeout: float = 600.0) -> float:
    """Seconds until the scheduler answers (``SystemExit`` if it dies or never does)."""
    from colocate.clients import rpc
    from colocate.clients.scheduler import SchedulerClient

    t0 = time.monotonic()
    with SchedulerClient(endpoint, str(keys) if keys else "", timeout_s=1.0) as client:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the scheduler exited ({proc.returncode}) before answering")
            try:
                client.nodes()
                return time.monotonic() - t0
            except rpc.RpcError:
                client.close()
    raise SystemExit("the scheduler did not answer")


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 60) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout)


def start_clients(n: int, endpoint: str, keys: Path | None, out: Path, start: float, until: float | None = None,
                  stop_file: Path | None = None, timeout_s: float = 5.0,
                  rate: float = 0.0) -> list[subprocess.Popen]:
    """``n`` client processes. ``rate`` > 0: paced, ``rate`` submits/s offered in all, each client due every
    ``n / rate`` s and the clients evenly staggered; 0: closed loop, each as fast as it is answered."""
    procs = []
    for i in range(n):
        argv = [sys.executable, __file__, "worker", "--endpoint", endpoint, "--keys", str(keys) if keys else "",
                "--out", str(out / f"client{i}.txt"), "--tag", f"c{i}", "--start", repr(start),
                "--timeout", repr(timeout_s)]
        if until is not None:
            argv += ["--until", repr(until)]
        if stop_file is not None:
            argv += ["--stop-file", str(stop_file)]
        if rate > 0:
            interval = n / rate
            argv += ["--interval", repr(interval), "--offset", repr(interval * i / n)]
        procs.append(subprocess.Popen(argv, env=child_env(), start_new_session=True))
    return procs


def read_results(out: Path) -> list[tuple[str, str, float]]:
    rows = []
    for f in sorted(out.glob("client*.txt")):
        for line in f.read_text().splitlines():
            rid, job, secs = line.split()
            rows.append((rid, job, float(secs)))
    return rows


def worker(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--keys", default="")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--until", type=float, default=None)
    p.add_argument("--stop-file", default=None)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--interval", type=float, default=0.0, help="paced: seconds between due times (0: closed loop)")
    p.add_argument("--offset", type=float, default=0.0, help="paced: this client's first due time after --start")
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from colocate.clients import rpc
    from colocate.clients.scheduler import SchedulerClient, request_from_here

    client = SchedulerClient(a.endpoint, a.keys, timeout_s=a.timeout)
    req = request_from_here(["true"], gpus=1, name="load", environ={"PATH": "/usr/bin:/bin"}, cwd="/tmp")
    try:
        client.nodes()  # the connection (and its CURVE handshake) before the clock starts
    except rpc.RpcError:
        client.close()
    while time.time() < a.start:
        time.sleep(min(0.01, max(0.0, a.start - time.time())))
    n = 0
    with open(a.out, "a") as out:
        while True:
            if a.until is not None and time.time() >= a.until:
                break
            if a.stop_file and os.path.exists(a.stop_file):
                break
            rid = f"{a.tag}-{n}"
            if a.interval > 0:  # paced: wait for this submit's due time; late ones go at once, and count it
                due = a.start + a.offset + n * a.interval
                if due >= (a.until if a.until is not None else float("inf")):
                    break
                while (ahead := due - time.time()) > 0:
                    time.sleep(ahead)
                t0 = time.perf_counter() - (time.time() - due)
            else:
                t0 = time.perf_counter()
            try:
                job = client.submit(req, rid)
            except rpc.RpcError:
                job = "-"
            out.write(f"{rid} {job} {time.perf_counter() - t0:.6f}\n")
            out.flush()
            n += 1
    client.close()
    return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    raise SystemExit(worker(sys.argv[2:]))
