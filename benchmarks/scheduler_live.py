"""Live scheduler latency: submit -> worker process started, over real sockets on loopback.

A real ``colocate scheduler`` and one ``colocate node --scheduler`` with simulated GPUs run on this
machine. Jobs are submitted one at a time through the client API (a fresh DEALER per request, as
``colocate submit`` does); each job's worker is ``sleep`` under the launcher, so nothing of a training
script's start-up is counted. Latency = the time the scheduler received the node's ``WorkerStarted``
for the job (journaled as the rank's ``started_at``) - the time just before the client sent
``Submit``; both are this machine's wall clock. It covers: the client's request, the journal commit,
the scheduling cycle, ``StartPlacement`` to the node, the node starting the launcher process
(``Popen`` returns once it is forked and exec'd), and ``WorkerStarted`` back.

    python benchmarks/scheduler_live.py                 # 200 jobs, every 0.25 s
    python benchmarks/scheduler_live.py --jobs 50 --no-write
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

SECTION = "scheduler_live"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, log):
    return subprocess.Popen([str(a) for a in argv], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={k: v for k, v in os.environ.items()
                                                         if not k.startswith("COLOCATE_")})


def wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200, help="jobs to submit (default 200)")
    p.add_argument("--every", type=float, default=0.25, help="seconds between submissions (default 0.25)")
    p.add_argument("--gpus", type=int, default=4, help="simulated GPUs of the node (default 4)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    p.add_argument("--insecure", action="store_true", help="no CURVE keys (the default runs with them, as a cluster does)")
    args = p.parse_args(argv)

    from cluster.client import SchedulerClient, request_from_here
    from colocate import keys as K
    from colocate import rpc

    console = C.console()
    tmp = Path(tempfile.mkdtemp(prefix="colocate-bench-live-"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    py = sys.executable
    keys = tmp / "keys"  # CURVE, as by default: the scheduler's, node n0's and one user's keys
    K.generate(str(keys), K.NODE, "n0")
    K.generate(str(keys), K.USER, "bench")
    auth = ["--insecure"] if args.insecure else ["--keys", keys]
    sched = spawn([py, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp / "s.db", "--config",
                   "gang-binpack", "--log-level", "warning", *auth], tmp / "scheduler.log")
    node = spawn([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", args.gpus, "--scheduler", endpoint,
                  "--node-id", "n0", "--endpoint", f"ipc://{tmp}/n0.sock", "--log-dir", tmp / "logs", "--state-dir",
                  tmp / "n0", "--log-level", "warning", *auth], tmp / "node.log")
    client = SchedulerClient(endpoint, "" if args.insecure else str(keys), timeout_s=5.0)

    def joined():
        try:
            return any(n.up for n in client.nodes().nodes)
        except rpc.RpcError:
            return False

    sent: dict[str, float] = {}
    try:
        wait(joined, 60, "the node to join")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("submitting", total=args.jobs)
            for _ in range(args.jobs):
                req = request_from_here(["sleep", "0.2"], gpus=1, priority="guaranteed", name="bench", cwd=str(tmp))
                t0 = time.time()
                sent[client.submit(req)] = t0
                progress.advance(task)
                time.sleep(args.every)
        db = sqlite3.connect(f"file:{tmp / 's.db'}?mode=ro", uri=True)

        def started():
            rows = dict(db.execute("SELECT job_id, started_at FROM logs WHERE rank = 0 AND started_at IS NOT NULL"))
            return rows if set(sent) <= set(rows) else None

        rows = wait(started, 120, "every job's worker to start")
    finally:
        for proc in (node, sched):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in (node, sched):
            proc.wait(30)
    lat = sorted((rows[j] - t) * 1000 for j, t in sent.items())
    p50, p99 = statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    table = Table(title=f"submit -> worker started, {len(lat)} jobs over loopback")
    for h in ("jobs", "p50 ms", "p99 ms", "max ms", "goal p99"):
        table.add_column(h, justify="right")
    table.add_row(str(len(lat)), f"{p50:.1f}", f"{p99:.1f}", f"{lat[-1]:.1f}", "<= 100 ms")
    console.print(table)
    if not args.no_write:
        body = "\n".join([
            "## Live scheduler: submit -> worker process started (loopback)", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`",
            f"- a real `colocate scheduler` (gang-binpack) and one `colocate node --scheduler` with {args.gpus} "
            f"simulated GPUs; {len(lat)} single-GPU jobs submitted one every {args.every:g} s through the client "
            "API; each worker is `sleep 0.2` under the launcher, so no script start-up is counted",
            "- latency: the scheduler's receipt of the node's WorkerStarted (journaled start time) - the client's "
            "clock just before Submit (one machine: one wall clock)", "",
            C.markdown_table(["jobs", "p50 ms", "p99 ms", "max ms", "goal p99"],
                             [[str(len(lat)), f"{p50:.1f}", f"{p99:.1f}", f"{lat[-1]:.1f}", "<= 100 ms"]]),
        ])
        console.print(f"wrote section '{SECTION}' of {C.update_results(SECTION, body)}")
    return 0 if p99 <= 100 else 1


if __name__ == "__main__":
    raise SystemExit(main())
