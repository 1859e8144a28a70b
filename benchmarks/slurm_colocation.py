"""A guaranteed ``--gres=gpu:1`` job and an opportunistic one on the same Slurm node, through the SPANK plugin.

A loopback Slurm cluster (``colocate.slurm.loopback``: slurmctld and slurmd on 127.0.0.1, fake GPUs; needs
root and Debian's slurm-wlm + libslurm-dev) with a ``colocate node`` (adaptive policy, one simulated GPU)
beside slurmd ``n2``. Per repeat, on n2:

1. solo: ``srun --gres=gpu:1 --colocate --colocate-gpu-mem 4GiB python examples/train_cnn.py --host-ms 14``;
2. together: the same, and ``srun --colocate=opportunistic python examples/train_transformer.py --host-ms 0``
   (no Slurm GPU: the node picks it one) started once the guaranteed job runs;
3. solo again (the guaranteed job's reference is the mean of both solo runs: the machine drifts).

Reported (medians over repeats): the guaranteed job's throughput in ``together`` vs solo, and the share of
the idle device time (1 - the guaranteed job's solo utilization) the opportunistic job used; both from the
node's per-batch record (the guaranteed job's batches after 1 s of warm-up).

    python benchmarks/slurm_colocation.py [--repeats 2] [--duration 20] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EXAMPLES_DIR, invocation, machine_info, machine_lines, markdown_table, update_results

from colocate.base.vocab import JobClass
from colocate.demo import evaluate as ev
from colocate.node import record
from colocate.slurm import loopback

NODE = "n2"
# (srun options, example script, its options)
GUARANTEED = (("--gres=gpu:1", "--colocate", "--colocate-gpu-mem=4GiB"), "train_cnn.py", ("--host-ms", "14"))
OPPORTUNISTIC = (("--colocate=opportunistic",), "train_transformer.py", ("--host-ms", "0"))


def srun(cluster, spec, duration: float, log) -> subprocess.Popen:
    opts, script, script_args = spec
    cmd = ["srun", "-w", NODE, *opts, sys.executable, str(EXAMPLES_DIR / script), "--duration", str(duration),
           "--iters", "1000000", "--log-every", "0", *script_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")} | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=cluster.env(env), stdout=log, stderr=subprocess.STDOUT)


def scenario(cluster, name: str, specs: list, duration: float, workdir: Path) -> dict:
    """Start the node with a fresh record, run ``specs`` (the first registers before the others start)."""
    rec = workdir / f"{name}.jsonl"
    log = open(workdir / f"{name}.log", "w")
    node = subprocess.Popen([sys.executable, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", "1",
                             "--sim-gpu-mem", cluster.sim_gpu_mem, "--endpoint", cluster.node_endpoint(NODE),
                             "--policy", "adaptive", "--record", str(rec), "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    procs = []
    try:
        _wait(lambda: Path(cluster.node_endpoint(NODE)[len("ipc://"):]).exists() or node.poll() is not None, 30)
        for i, spec in enumerate(specs):
            if i:  # the guaranteed job registers first
                _wait(lambda: rec.exists() and rec.stat().st_size > 0, 120)
            procs.append(srun(cluster, spec, duration, log))
        codes = [p.wait(timeout=duration + 180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        node.terminate()
        node.wait(timeout=10)
        log.close()
    if any(codes):
        raise RuntimeError(f"{name}: exit codes {codes}; see {workdir / (name + '.log')}")
    batches = record.read(str(rec)).batches
    t0, t1 = ev.window(batches, 1.0)
    figs = ev.job_figures(batches, t0, t1)
    by = {f["priority"]: f for f in figs.values()}
    return {"span": t1 - t0, JobClass.GUARANTEED: by.get(JobClass.GUARANTEED, {}),
            JobClass.OPPORTUNISTIC: by.get(JobClass.OPPORTUNISTIC, {})}


def _wait(pred, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:.0f}s")
        time.sleep(0.05)


def one_repeat(cluster, duration: float, workdir: Path, k: int) -> dict:
    solo = scenario(cluster, f"r{k}-solo", [GUARANTEED], duration, workdir)
    both = scenario(cluster, f"r{k}-together", [GUARANTEED, OPPORTUNISTIC], duration, workdir)
    after = scenario(cluster, f"r{k}-solo-after", [GUARANTEED], duration, workdir)
    g_solo = [r[JobClass.GUARANTEED] for r in (solo, after)]
    solo_tput = statistics.mean(g.get("throughput", 0.0) for g in g_solo)
    solo_util = statistics.mean(g.get("utilization", 0.0) for g in g_solo)
    g, o = both[JobClass.GUARANTEED], both[JobClass.OPPORTUNISTIC]
    idle = (1.0 - solo_util) * both["span"]
    return {"guaranteed_vs_solo": g.get("throughput", 0.0) / solo_tput if solo_tput else 0.0,
            "idle_share_used": o.get("busy_s", 0.0) / idle if idle > 0 else 0.0,
            "guaranteed_solo_util": solo_util, "guaranteed_it_s": g.get("throughput", 0.0),
            "guaranteed_solo_it_s": solo_tput, "opportunistic_it_s": o.get("throughput", 0.0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds each job trains")
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    args = ap.parse_args()
    reason = loopback.missing()
    if reason:
        print(f"slurm_colocation: {reason}", file=sys.stderr)
        return 2
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sb-") as tmp:
        workdir = Path(tmp)
        with loopback.LoopbackCluster(workdir / "c", sim_gpu_mem="16GiB") as cluster:
            for k in range(args.repeats):
                rows.append(one_repeat(cluster, args.duration, workdir, k))
                print(f"repeat {k + 1}/{args.repeats}: " + ", ".join(f"{key} {v:.3f}" for key, v in rows[-1].items()),
                      flush=True)
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    table = markdown_table(
        ["figure", "median", "per repeat"],
        [[key, f"{med[key]:.3f}", ", ".join(f"{r[key]:.3f}" for r in rows)] for key in med])
    print(table)
    body = "\n".join([
        "## Slurm: a guaranteed `--gres=gpu:1` job beside an opportunistic one (`benchmarks/slurm_colocation.py`)",
        "", *machine_lines(machine_info()), f"- command: `{invocation()}`",
        f"- load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} "
        f"(on {os.cpu_count()} cores: above that, other work shared the simulated GPU's core)",
        "- loopback Slurm 22.05 (slurmctld + slurmd on 127.0.0.1), the SPANK plugin, a `colocate node` (adaptive, "
        "one simulated GPU) beside slurmd; the guaranteed CNN (`--host-ms 14`) solo before and after, then with an "
        "opportunistic transformer (`--colocate=opportunistic`, its GPU picked by the node)", "",
        table, "",
        f"Target: the guaranteed job keeps >= 0.95 of its solo throughput (median {med['guaranteed_vs_solo']:.3f}) "
        f"and the opportunistic job uses >= half of the idle device time (median {med['idle_share_used']:.3f}).",
    ])
    if not args.no_write:
        update_results("slurm_colocation", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
