"""The node part of ``colocate demo``: one simulated GPU, one pair of example jobs, four co-location modes.

For each mode a real node coordinator (``colocate node --device sim --policy
MODE``) runs with a real guaranteed job (with host-side gaps) and a real
opportunistic job, both unmodified example scripts under ``colocate run``.
Solo runs give the references: the guaranteed job alone first and last (their
mean), the opportunistic job alone once. Figures come from the node's record of
every mini-batch (``colocate.node.record``, ``colocate.demo.evaluate``); ``summary.json`` and PNG plots go to
``--out``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from colocate.base.vocab import JobClass, Phase
from colocate.demo import evaluate as ev
from colocate.node import record
from colocate.node.config import POLICY_NAMES

EXAMPLES = Path(__file__).resolve().parent.parent / "_examples"  # examples/, shipped in the package
MODES = POLICY_NAMES  # one run per node policy
SOLO_G = ("solo-guaranteed", "solo-guaranteed-after")  # first and last run of a pair


@dataclass(frozen=True)
class DemoJob:
    job_id: str
    klass: JobClass
    script: str
    args: tuple[str, ...] = ()
    gpu_mem: str | None = None

    def command(self, endpoint: str, stats: str, duration: float) -> list[str]:
        cmd = [sys.executable, "-m", "colocate", "run", "--device", "sim", "--node", endpoint, "--job-id",
               self.job_id, "--priority", self.klass, "--stats-file", stats]
        if self.gpu_mem:
            cmd += ["--gpu-mem", self.gpu_mem]
        return cmd + ["--", sys.executable, str(EXAMPLES / self.script), "--duration", str(duration),
                      "--iters", "1000000", "--log-every", "0", *self.args]


@dataclass(frozen=True)
class Pair:
    name: str
    guaranteed: DemoJob
    opportunistic: DemoJob


PAIRS = {
    "cnn+transformer": Pair("cnn+transformer",
                            DemoJob("guaranteed-cnn", JobClass.GUARANTEED, "train_cnn.py", ("--host-ms", "14"), "4GiB"),
                            DemoJob("opportunistic-lm", JobClass.OPPORTUNISTIC, "train_transformer.py", ("--host-ms", "0"))),
    "recsys+cnn": Pair("recsys+cnn",
                       DemoJob("guaranteed-recsys", JobClass.GUARANTEED, "train_recsys.py", ("--host-ms", "15"), "4GiB"),
                       DemoJob("opportunistic-cnn", JobClass.OPPORTUNISTIC, "train_cnn.py", ("--host-ms", "0"))),
    "transformer+recsys": Pair("transformer+recsys",
                               DemoJob("guaranteed-lm", JobClass.GUARANTEED, "train_transformer.py", ("--host-ms", "16"), "4GiB"),
                               DemoJob("opportunistic-recsys", JobClass.OPPORTUNISTIC, "train_recsys.py", ("--host-ms", "0"))),
}


@dataclass
class Run:
    """One node + its jobs, from start to the last job's exit."""

    name: str
    record: str
    stats: dict = field(default_factory=dict)  # job id -> stats-file summary
    exit_codes: dict = field(default_factory=dict)


def run_scenario(name: str, policy: str, jobs: list[DemoJob], duration: float, workdir: str,
                 sim_gpu_mem: str = "16GiB", node_args: tuple[str, ...] = (), job_env: dict | None = None) -> Run:
    """Start a node with ``policy`` and ``jobs`` on GPU 0; wait for the jobs; stop the node.
    ``job_env``: variables added to the jobs' environment (e.g. ``COLOCATE_YIELD_VIA``)."""
    sock = f"{workdir}/{name}.sock"
    endpoint = f"ipc://{sock}"
    record = os.path.join(workdir, f"{name}.jsonl")
    log = open(os.path.join(workdir, f"{name}.log"), "w")
    node = subprocess.Popen(
        [sys.executable, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", "1", "--sim-gpu-mem",
         sim_gpu_mem, "--endpoint", endpoint, "--policy", policy, "--record", record, "--log-level", "warning",
         *node_args], stdout=log, stderr=subprocess.STDOUT)
    run = Run(name, record)
    procs = {}
    try:
        _wait_for(lambda: os.path.exists(sock) or node.poll() is not None, 15)
        if node.poll() is not None:
            raise RuntimeError(f"node for {name} exited with {node.returncode}; see {log.name}")
        for i, job in enumerate(jobs):
            if i:
                time.sleep(0.3)  # the guaranteed job registers first
            stats = os.path.join(workdir, f"{name}-{job.job_id}.json")
            procs[job.job_id] = (subprocess.Popen(job.command(endpoint, stats, duration), stdout=log,
                                                  stderr=subprocess.STDOUT, env={**os.environ, **(job_env or {})}),
                                 stats)
        for job_id, (proc, stats) in procs.items():
            run.exit_codes[job_id] = proc.wait(timeout=duration + 120)
            try:
                with open(stats) as f:
                    run.stats[job_id] = json.load(f)
            except (OSError, ValueError):
                run.stats[job_id] = {}
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
        node.terminate()
        try:
            node.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.kill()
        log.close()
    return run


def _wait_for(pred, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.05)


def analyse(pair: Pair, runs: dict[str, Run], warmup_s: float = 1.0) -> tuple[list[dict], dict]:
    """Figures per mode (the summary.json rows) and timelines for plots."""
    gid, oid = pair.guaranteed.job_id, pair.opportunistic.job_id

    def figures(run):
        rec = record.read(run.record)
        t0, t1 = ev.window(rec.batches, warmup_s)
        return rec, t0, t1, ev.job_figures(rec.batches, t0, t1)

    # the guaranteed job's reference: the mean of its solo runs before and after the modes (the
    # machine's speed drifts over minutes; one run alone would favour whichever modes ran near it)
    g_solos = [figures(runs[name])[3].get(gid, {}) for name in SOLO_G if name in runs]
    g_solo_tputs = [f.get("throughput", 0.0) for f in g_solos]
    g_solo_tput = sum(g_solo_tputs) / len(g_solos)
    g_solo_util = sum(f.get("utilization", 0.0) for f in g_solos) / len(g_solos)
    _, _, _, o_solo = figures(runs["solo-opportunistic"])
    o_solo_tput = o_solo.get(oid, {}).get("throughput", 0.0)
    rows, lines = [], {}
    for mode in [name for name in runs if not name.startswith("solo-")]:
        rec, t0, t1, figs = figures(runs[mode])
        batches = rec.batches
        g, o = figs.get(gid, {}), figs.get(oid, {})
        span = max(1e-9, t1 - t0)
        o_phases = ev.phases(batches, rec.welcomes + rec.limits, oid, runs[mode].stats.get(oid, {}).get("ready_at"),
                             t0, t1)
        util = sum(f["utilization"] for f in figs.values())
        idle = (1.0 - g_solo_util) * (t1 - t0)
        rows.append({
            "mode": mode,
            "pair": pair.name,
            "guaranteed_throughput_ratio": _ratio(g.get("throughput", 0.0), g_solo_tput),
            "device_utilization": util,
            "guaranteed_solo_utilization": g_solo_util,
            "utilization_gain": _ratio(util, g_solo_util),
            "opportunistic_throughput_ratio": _ratio(o.get("throughput", 0.0), o_solo_tput),
            "idle_share_used": _ratio(o.get("busy_s", 0.0), idle),
            # where the window went for the opportunistic job (parts of the window, by Phase)
            "opportunistic_phases": {k: v / span for k, v in o_phases.items()},
            # idle time used while it ran: its busy seconds / the idle time of its running phase
            "idle_share_used_running": _ratio(o.get("busy_s", 0.0), (1.0 - g_solo_util) * o_phases[Phase.RUNNING]),
            "guaranteed_host_bytes_peak": runs[mode].stats.get(gid, {}).get("host_bytes_peak", 0),
            "guaranteed_throughput_it_s": g.get("throughput", 0.0),
            "guaranteed_solo_throughput_it_s": g_solo_tput,
            "guaranteed_solo_runs_it_s": g_solo_tputs,
            "opportunistic_throughput_it_s": o.get("throughput", 0.0),
            "opportunistic_solo_throughput_it_s": o_solo_tput,
            "window_s": t1 - t0,
            "exit_codes": runs[mode].exit_codes,
        })
        lines[mode] = ev.timeline(batches, t0 - warmup_s, t1)
    return rows, lines


def phase_cells(row: dict) -> list[str]:
    """The opportunistic job's phases of a result row, as parts of the window, in ``Phase`` order."""
    return [f"{row['opportunistic_phases'][p]:.2f}" for p in Phase]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def plot(lines: dict, pair: Pair, out_dir: str) -> list[str]:
    """utilization.png and throughput.png; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for mode, tl in lines.items():
        ax.plot(tl["t"], tl["utilization"], label=mode)
    ax.set(xlabel="time (s)", ylabel="device utilization", ylim=(0, 1.05),
           title=f"Simulated GPU utilization over time ({pair.name})")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(os.path.join(out_dir, "utilization.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(lines), 1, figsize=(9, 2.2 * len(lines)), sharex=True, squeeze=False)
    for ax, (mode, tl) in zip(axes[:, 0], lines.items()):
        for job_id, series in sorted(tl["throughput"].items()):
            ax.plot(tl["t"], series, label=job_id)
        ax.set(ylabel="it/s", title=mode)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(f"Per-job throughput over time ({pair.name})")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "throughput.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def run_pair(pair: Pair, duration: float, modes=MODES, progress=None, workdir: str | None = None,
             variants: tuple[tuple[str, str, dict], ...] = ()) -> dict[str, Run]:
    """Solo references, every mode, each ``(name, policy, job_env)`` variant, and the
    guaranteed job solo again; ``progress(name)`` is called before each run."""
    workdir = workdir or tempfile.mkdtemp(prefix="colocate-demo-")
    both = [pair.guaranteed, pair.opportunistic]
    plan: list[tuple[str, str, list[DemoJob], dict | None]] = [  # (run, policy, jobs, job_env)
        (SOLO_G[0], "pack", [pair.guaranteed], None), ("solo-opportunistic", "pack", [pair.opportunistic], None)]
    plan += [(m, m, both, None) for m in modes]
    plan += [(name, policy, both, env) for name, policy, env in variants]
    plan += [(SOLO_G[1], "pack", [pair.guaranteed], None)]
    runs = {}
    for name, policy, jobs, env in plan:
        if progress:
            progress(name)
        runs[name] = run_scenario(name, policy, jobs, duration, workdir, job_env=env)
    return runs
