"""The cluster part of ``colocate demo``: a scheduler and two nodes of simulated GPUs on loopback, a
stream of example jobs, and a report.

Real processes throughout: ``colocate scheduler`` (the ``antman`` policy: gang + bin-packing for
guaranteed jobs, least-utilized GPUs for opportunistic ones, preemption), two ``colocate node
--scheduler`` daemons with ``--sim-gpus`` simulated GPUs each, and the unmodified example scripts
submitted through the scheduler's client API (a DDP gang, single-GPU guaranteed jobs, opportunistic
jobs). While it runs, the scheduler is sampled every ``SAMPLE_S``; each sample is handed to
``progress`` (the command draws a live view from it). The report: per job its queue wait and
completion time; GPU allocation and utilization over time; and for each opportunistic job, how much
of its run it spent on a GPU beside a guaranteed job.

On a machine with fewer cores than simulated GPUs (this project's 2-core machines: 4 simulated GPUs),
simulated GPUs share cores: the run shows placement and co-location, not speed.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from colocate.base.vocab import JobClass
from colocate.demo.node import EXAMPLES
from colocate.node.accounts import USERS_FILE

SAMPLE_S = 0.5
NODES = ("node-a", "node-b")


@dataclass(frozen=True)
class Submission:
    at_s: float  # seconds after the nodes joined
    name: str
    script: str
    args: tuple[str, ...] = ()
    workers: int = 1
    klass: JobClass = JobClass.GUARANTEED
    estimate_s: float | None = None


def stream(duration: float) -> tuple[Submission, ...]:
    """The demo's jobs; ``duration`` scales every job's training time (seconds)."""
    d = max(4.0, duration)
    ck = ("--checkpoint", "{name}.ckpt")
    return (
        Submission(0.0, "ddp-gang", "train_ddp.py", ("--duration", f"{1.5 * d:g}", "--host-ms", "8", *ck), workers=2,
                   estimate_s=2 * d),
        Submission(0.0, "cnn-a", "train_cnn.py", ("--duration", f"{d:g}", "--host-ms", "14", *ck), estimate_s=1.5 * d),
        Submission(2.0, "lm-opportunistic", "train_transformer.py", ("--duration", f"{2 * d:g}", "--host-ms", "0", *ck),
                   klass=JobClass.OPPORTUNISTIC),
        Submission(2.0, "recsys-opportunistic", "train_recsys.py", ("--duration", f"{1.5 * d:g}", "--host-ms", "0", *ck),
                   klass=JobClass.OPPORTUNISTIC),
        Submission(4.0, "cnn-b", "train_cnn.py", ("--duration", f"{d:g}", "--host-ms", "14", *ck), estimate_s=1.5 * d),
        Submission(6.0, "recsys-c", "train_recsys.py", ("--duration", f"{0.6 * d:g}", "--host-ms", "15", *ck),
                   estimate_s=d),
        Submission(8.0, "lm-d", "train_transformer.py", ("--duration", f"{0.6 * d:g}", "--host-ms", "16", *ck),
                   estimate_s=d),
    )


@dataclass
class ClusterSample:
    t: float  # seconds since the start
    nodes: tuple  # NodeView
    jobs: tuple  # JobView (active)


@dataclass
class ClusterRun:
    workdir: str
    samples: list[ClusterSample] = field(default_factory=list)
    jobs: list = field(default_factory=list)  # final JobView of every job
    names: dict = field(default_factory=dict)  # job id -> demo name
    elapsed_s: float = 0.0
    timed_out: bool = False


def _spawn(argv: list[str], log_path: str) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")})
    finally:
        log.close()


def _stop(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_keys(workdir: str) -> str:
    """The demo's own CURVE keys in ``workdir/keys`` (one per node and the demo user's), and the nodes' user
    map (docs/security.md) that runs the demo user's jobs as whoever runs the demo. Returns the folder."""
    from colocate.base import keys as K

    keys = os.path.join(workdir, "keys")
    for name in NODES:
        K.generate(keys, K.NODE, name, exist_ok=True)
    K.generate(keys, K.USER, "demo", exist_ok=True)
    with open(os.path.join(keys, USERS_FILE), "w") as f:
        f.write(f"demo {getpass.getuser()}\n")
    return keys


def run_cluster(workdir: str, duration: float = 20.0, sim_gpus: int = 2, progress=None,
                timeout_s: float = 300.0) -> ClusterRun:
    """Run the stream to completion (or ``timeout_s``); ``progress(sample, run)`` after each sample."""
    from colocate.clients import rpc
    from colocate.clients.scheduler import SchedulerClient, request_from_here

    run = ClusterRun(workdir)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    py = sys.executable
    keys = make_keys(workdir)
    daemons = [_spawn([py, "-m", "colocate", "scheduler", "--bind", endpoint, "--state",
                       os.path.join(workdir, "scheduler.db"), "--config", "antman", "--log-level", "info",
                       "--keys", keys], os.path.join(workdir, "scheduler.log"))]
    try:
        client = SchedulerClient(endpoint, keys_dir=keys, timeout_s=2.0)
        _wait(lambda: _answers(client), 30, "the scheduler to start", daemons)
        for name in NODES:
            daemons.append(_spawn([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", str(sim_gpus),
                                   "--scheduler", endpoint, "--node-id", name, "--host", "127.0.0.1",
                                   "--endpoint", f"ipc://{workdir}/{name}.sock", "--log-dir",
                                   os.path.join(workdir, "logs"), "--state-dir", os.path.join(workdir, name),
                                   "--log-level", "warning", "--keys", keys], os.path.join(workdir, f"{name}.log")))
        _wait(lambda: sum(n.up for n in client.nodes().nodes) == len(NODES), 60, "the nodes to join", daemons)
        t0 = time.monotonic()
        todo = sorted(stream(duration), key=lambda s: s.at_s)
        while True:
            now = time.monotonic() - t0
            while todo and todo[0].at_s <= now:
                sub = todo.pop(0)
                args = [a.format(name=sub.name) for a in sub.args]
                req = request_from_here([py, str(EXAMPLES / sub.script), *args, "--log-every", "0"],
                                        workers=sub.workers, gpus=1, priority=sub.klass, name=sub.name,
                                        estimate_s=sub.estimate_s, cwd=workdir)
                run.names[client.submit(req)] = sub.name
            try:
                nodes = client.nodes().nodes
                active, _ = client.jobs(active_only=True)
            except rpc.RpcError:
                nodes, active = (), []
            sample = ClusterSample(now, tuple(nodes), tuple(active))
            run.samples.append(sample)
            if progress:
                progress(sample, run)
            if not todo and run.names and not active:
                break
            if now > timeout_s:
                run.timed_out = True
                break
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t0 - now)))
        run.jobs = [j for j in client.jobs()[0] if j.job_id in run.names]
        run.elapsed_s = time.monotonic() - t0
    finally:
        _stop(daemons[1:])
        _stop(daemons[:1])
    return run


def _answers(client) -> bool:
    from colocate.clients import rpc

    try:
        client.nodes()
        return True
    except rpc.RpcError:
        return False


def _wait(pred, timeout: float, what: str, procs) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a daemon exited (rc {dead[0].returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------- report


def analyse(run: ClusterRun) -> tuple[list[dict], dict]:
    """Per-job rows and the time series for the plot."""
    beside: dict[str, list[int]] = {}  # opportunistic job -> [samples running, samples beside a guaranteed job]
    series: dict[str, list[float]] = {"t": [], "allocated": [], "shared": [], "utilization": []}
    for s in run.samples:
        gpus = [g for n in s.nodes if n.up for g in n.gpu_views]
        total = max(1, len(gpus))
        series["t"].append(s.t)
        series["allocated"].append(sum(1 for g in gpus if g.guaranteed) / total)
        series["shared"].append(sum(1 for g in gpus if g.opportunistic) / total)
        series["utilization"].append(sum(g.utilization for g in gpus) / total)
        for g in gpus:
            for job in g.opportunistic:
                count = beside.setdefault(job, [0, 0])
                count[0] += 1
                count[1] += bool(g.guaranteed)
    rows = []
    for j in sorted(run.jobs, key=lambda j: j.submitted_at):
        ran, with_g = beside.get(j.job_id, [0, 0])
        rows.append({
            "job": j.job_id, "name": run.names.get(j.job_id, j.name), "class": j.priority, "state": j.state,
            "workers": j.workers, "queue_wait_s": (j.started_at - j.submitted_at) if j.started_at else None,
            "completion_s": (j.ended_at - j.submitted_at) if j.ended_at else None, "attempts": j.attempts,
            "nodes": list(j.nodes), "exit_code": j.exit_code,
            "beside_guaranteed": (with_g / ran) if j.priority == JobClass.OPPORTUNISTIC and ran else None,
        })
    return rows, series


def plot(series: dict, out_dir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(series["t"], series["allocated"], label="GPUs allocated (a guaranteed worker)")
    ax.plot(series["t"], series["shared"], label="GPUs shared (an opportunistic worker)")
    ax.plot(series["t"], series["utilization"], label="mean GPU utilization (last 10 s)", linestyle="--")
    ax.set(xlabel="time (s)", ylabel="fraction of the cluster's GPUs", ylim=(0, 1.05),
           title=f"Cluster of {len(NODES)} nodes: GPU allocation and utilization over time")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "cluster-gpus.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
