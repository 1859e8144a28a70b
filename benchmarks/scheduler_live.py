"""Live scheduler latency: submit -> worker process started, over real sockets on loopback.

A real ``colocate scheduler`` and one ``colocate node --scheduler`` with simulated GPUs run on this
machine. Jobs are submitted one at a time through the client API (one connection, kept); each job's
worker is ``sleep`` under the launcher, so nothing of a training
script's start-up is counted. Latency = the time the scheduler received the node's ``WorkerStarted``
for the job (journaled as the rank's ``started_at``) - the time just before the client sent
``Submit``; both are this machine's wall clock. It covers: the client's request, the journal commit,
the scheduling cycle, ``StartPlacement`` to the node, the node starting the launcher process
(``Popen`` returns once it is forked and exec'd), and ``WorkerStarted`` back.

The table gives p50/p99/max over all jobs and the median of the first 100 and of the last 100 jobs
(the goal: flat within 20%, so nothing grows with the jobs the node and the scheduler have seen), and the
same medians of its two legs: the submit leg (client -> the scheduler's receipt, journaled as the job's
``submitted_at``) and the start leg (from there: journal commit, cycle, the node, WorkerStarted back). Then
the median of each tenth of the jobs in submission order: growth climbs through the tenths, while a machine
that runs slower for a minute moves a few of them either way.
A probe thread times an fsync on the journal's disk every 50 ms during the run (``_common.DiskProbe``), and
its median in each tenth of the run is given beside the jobs': the scheduler commits before it places, so a
tail or a slow tenth that the probe shows too is the disk's. A child process times a fixed Python loop every
50 ms (``_common.CpuProbe``), given the same way: a tenth slower in the jobs and in the loop is the machine's.

    python benchmarks/scheduler_live.py                 # 1000 jobs, one every 0.2 s (about 4 min)
    python benchmarks/scheduler_live.py --jobs 200 --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import getpass
import importlib.util
import os
import resource
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


def launcher_start(times: int = 5) -> str:
    """The CPU seconds (user + system, median of ``times``) of one launcher as the node starts one per job,
    ``colocate run --device sim -- true``, in this benchmark's environment; and whether its modules start from
    cached bytecode. On a 2-core machine this cost, one launcher every ``--every`` s, shares the cores with the
    scheduler and the node."""
    cpu = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "colocate", "run", "--device", "sim", "--", "true"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    import colocate.launcher

    cached = os.path.exists(importlib.util.cache_from_source(colocate.launcher.__file__))
    how = ("from cached bytecode" if cached else "compiling colocate's modules at each start (this checkout has no "
           "bytecode cache" + (": PYTHONDONTWRITEBYTECODE is set" if sys.dont_write_bytecode else "") + ")")
    return f"{statistics.median(cpu):.3f} s of CPU per launcher start (median of {times}), {how}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000, help="jobs to submit per run (default 1000)")
    p.add_argument("--every", type=float, default=0.2, help="seconds between submissions (default 0.2)")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs of the node (default 8)")
    p.add_argument("--log-level", default="warning", help="the daemons' log level (default warning)")
    p.add_argument("--repeats", type=int, default=1, help="runs, each with a fresh scheduler and node (default 1)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    p.add_argument("--insecure", action="store_true", help="no CURVE keys (the default runs with them, as a cluster does)")
    args = p.parse_args(argv)

    console = C.console()
    launcher = launcher_start()
    console.print(f"launcher: {launcher}")
    runs = []
    for _ in range(args.repeats):
        sent, rows, received, disk, cpu, own = one_run(args, console)
        order = sorted(sent, key=sent.get)
        lat_in_order = [(rows[j] - sent[j]) * 1000 for j in order]
        lat = sorted(lat_in_order)
        head = statistics.median(lat_in_order[:100])
        last = statistics.median(lat_in_order[-100:])
        # the two legs: client -> the scheduler's receipt of the submit, and from there -> WorkerStarted received
        legs = []
        for a, b in ((sent, received), (received, rows)):
            leg = [(b[j] - a[j]) * 1000 for j in order]
            legs.append(f"{statistics.median(leg[:100]):.1f} -> {statistics.median(leg[-100:]):.1f}")
        tenths = " ".join(f"{x:.1f}" for x in C.tenth_medians(lat_in_order))
        disk_tenths = " ".join(f"{x:.1f}" for x in disk["tenths_ms"])
        cpu_tenths = " ".join(f"{x:.2f}" for x in cpu["tenths_ms"]) + f" (steal {cpu['steal_pct']:.1f}%)"
        own_tenths = " / ".join(" ".join(f"{x:.0f}" for x in own[name]) for name in ("scheduler", "node", "launchers"))
        runs.append([str(len(lat)), f"{statistics.median(lat):.1f}", f"{C.rank(lat, 0.99):.1f}",
                     f"{lat[-1]:.1f}", f"{head:.1f}", f"{last:.1f}", f"{last / head:.2f}", *legs,
                     tenths, cpu_tenths, own_tenths, disk_tenths, f"{disk['p99_ms']:.1f} / {disk['max_ms']:.0f} ({disk['over_100ms']})",
                     f"{os.getloadavg()[0]:.1f}"])
        console.print(" | ".join(runs[-1]))
    heads = ["jobs", "p50 ms", "p99 ms", "max ms", "first 100 median", "last 100 median", "last/first",
             "submit leg: first -> last 100 median", "start leg: first -> last 100 median",
             "median of each tenth, ms", "CPU probe median of each tenth, ms (steal over the run)",
             "CPU ms per job in each tenth: scheduler / node / its launchers", "disk fsync median of each tenth, ms", "disk fsync p99 / max ms (over 100 ms)", "load 1m"]
    console.print(C.rich_table(f"submit -> worker started over loopback, {args.repeats} run(s); goals: p99 <= 100 ms, "
                               "last/first within 0.8-1.2", heads, runs))
    if not args.no_write:
        body = "\n".join([
            "## Live scheduler: submit -> worker process started (loopback)", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`",
            f"- a real `colocate scheduler` (gang-binpack) and one `colocate node --scheduler` with {args.gpus} "
            f"simulated GPUs; {args.jobs} single-GPU jobs per run submitted one every {args.every:g} s through the "
            "client API (one kept connection); each worker is `sleep 0.2` under the launcher, so no script start-up "
            "is counted",
            f"- the launcher the node starts for each job: {launcher} (`scheduler_live.launcher_start`)",
            "- latency: the scheduler's receipt of the node's WorkerStarted (journaled start time) - the client's "
            "clock just before Submit (one machine: one wall clock); first/last 100: medians of the first and the "
            "last 100 jobs submitted, and of each tenth of the jobs in submission order; load: 1-minute load average after the run",
            "- disk fsync: a probe thread of the benchmark appends 16 KB to a file beside the journal and fsyncs it "
            "every 50 ms during the run (`_common.DiskProbe`), with its median in each tenth of the run beside the "
            "jobs' (a tenth slower in both is the disk's); the scheduler's commit and the node's start wait on "
            "the same disk, so a tail in both is the disk's (the machine's disk is shared with other sessions)",
            "- CPU probe: a child process times a loop of 20,000 Python additions every 50 ms during the run "
            "(`_common.CpuProbe`), its median in each tenth beside the jobs': a busy VM host slows every process "
            "(steal time shows only part of it), and the loop slows with it (our daemons and launchers share the cores "
            "with it too, at a steady rate); steal: the share of the machine's CPU time the hypervisor took during the "
            "run (`/proc/stat`)",
            "- CPU ms per job: what the scheduler, the node and the node's launchers (children it reaped) used in each "
            "tenth of the submissions, over the jobs submitted in it (`_common.ProcessCpu`, psutil): steady "
            "tenths while the jobs' and the probe's move together say the slower tenths were the machine's, not more "
            "work of ours", "",
            C.markdown_table(heads, runs),
        ])
        console.print(f"wrote section '{SECTION}' of {C.update_results(SECTION, body)}")
    worst = max(float(r[2]) for r in runs)
    flat = all(0.8 <= float(r[6]) <= 1.2 for r in runs)
    return 0 if worst <= 100 and flat else 1


def one_run(args, console):
    """One scheduler and node; ``(sent, rows, received, disk, cpu, own)``: job id -> client send time, ->
    WorkerStarted receipt, -> the scheduler's receipt of the submit (its journaled ``submitted_at``); the disk and
    CPU probes' summaries; the CPU ms per job of the scheduler, the node and the node's reaped launchers in each
    tenth of the submissions."""
    from colocate.base import keys as K
    from colocate.clients import rpc
    from colocate.clients.scheduler import SchedulerClient, request_from_here

    tmp = Path(tempfile.mkdtemp(prefix="colocate-bench-live-"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    py = sys.executable
    keys = tmp / "keys"  # CURVE, as by default: the scheduler's, node n0's and one user's keys
    K.generate(str(keys), K.NODE, "n0")
    K.generate(str(keys), K.USER, "bench")
    # the node runs a user's jobs as that user's Unix account (colocate.node.accounts): "bench" runs as whoever
    # runs this benchmark, as root too (else every start is refused: no account "bench")
    (keys / "users").write_text(f"bench {getpass.getuser()}\n")
    auth = ["--insecure"] if args.insecure else ["--keys", keys]
    sched = spawn([py, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp / "s.db", "--config",
                   "gang-binpack", "--log-level", args.log_level, *auth], tmp / "scheduler.log")
    node = spawn([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", args.gpus, "--scheduler", endpoint,
                  "--node-id", "n0", "--endpoint", f"ipc://{tmp}/n0.sock", "--log-dir", tmp / "logs", "--state-dir",
                  tmp / "n0", "--log-level", args.log_level, *auth], tmp / "node.log")
    client = SchedulerClient(endpoint, "" if args.insecure else str(keys), timeout_s=5.0)

    def joined():
        try:
            return any(n.up for n in client.nodes().nodes)
        except rpc.RpcError:
            return False

    sent: dict[str, float] = {}
    try:
        wait(joined, 60, "the node to join")
        with C.DiskProbe(tmp) as probe, C.CpuProbe(tmp) as cpu, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                                 TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("submitting", total=args.jobs)
            tenth = max(1, args.jobs // 10)
            own = C.ProcessCpu({"scheduler": sched.pid, "node": node.pid})
            own.mark()
            for i in range(args.jobs):
                req = request_from_here(["sleep", "0.2"], gpus=1, priority="guaranteed", name="bench", cwd=str(tmp))
                t0 = time.time()
                sent[client.submit(req)] = t0
                progress.advance(task)
                time.sleep(max(0.0, args.every - (time.time() - t0)))
                if (i + 1) % tenth == 0:
                    own.mark()
        db = sqlite3.connect(f"file:{tmp / 's.db'}?mode=ro", uri=True)

        def started():
            rows = dict(db.execute("SELECT job_id, started_at FROM logs WHERE rank = 0 AND started_at IS NOT NULL"))
            return rows if set(sent) <= set(rows) else None

        rows = wait(started, 120, "every job's worker to start")
        received = dict(db.execute("SELECT job_id, submitted_at FROM jobs"))
    finally:
        for proc in (node, sched):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in (node, sched):
            proc.wait(30)
    client.close()
    own_ms = {"scheduler": own.per_step_ms("scheduler", tenth), "node": own.per_step_ms("node", tenth),
              "launchers": own.per_step_ms("node", tenth, children=True)}
    return sent, rows, received, probe.summary(), cpu.summary(), own_ms


if __name__ == "__main__":
    raise SystemExit(main())
