"""Fault soak: a scheduler, three nodes and a stream of jobs while a driver kills, stops and restarts them.

Real processes on 127.0.0.1 with CURVE keys (``benchmarks/_soak.py``): one ``colocate scheduler``, three
``colocate node`` with two simulated GPUs each, and jobs submitted with ``colocate submit`` (2-worker
gangs, single-GPU guaranteed, opportunistic), each worker a plain Python script that appends one
progress line per step to a shared file. Faults, drawn by a seeded ``random.Random`` and logged to
``faults.jsonl``: kill -9 of the scheduler (restarted on its state file); kill -9, SIGSTOP for 1-20 s,
SIGTERM of a node (restarted on its state dir); kill -9 of a worker; kill -9 of a node whose worker table is then
removed or corrupted, restarted within a second on the same state dir; deletion of a running node's state dir. Then, with no faults, the cluster
drains, and the progress file and the journal (read-only) are counted (``benchmarks/_soak_check.py``):
jobs lost, jobs finished twice, two copies of a job making progress at once, a GPU holding two
guaranteed jobs at once. Every count must be 0.

    python benchmarks/fault_soak.py                       # 200 faults, about 3 s apart
    python benchmarks/fault_soak.py --faults 20 --every 2 --stop-max 8 --no-write
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _soak as S

SECTION = "fault_soak"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=200, help="faults to make (default 200)")
    p.add_argument("--every", type=float, default=3.0, help="mean seconds between faults (default 3)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of faults in all (sets --every to DURATION / FAULTS)")
    p.add_argument("--submit-every", type=float, default=1.5, help="mean seconds between submissions (default 1.5)")
    p.add_argument("--steps", type=int, default=40, help="progress steps per worker, 0.1 s each (default 40)")
    p.add_argument("--stop-max", type=float, default=20.0, help="longest SIGSTOP of a node, s (default 20)")
    p.add_argument("--drain", type=float, default=300.0, help="most seconds to let the jobs end (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault and job draws (default 0)")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (logs, progress, journal)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)

    if args.faults < 1 or (args.duration is not None and args.duration <= 0):
        p.error("--faults and --duration must be positive")
    every = args.duration / args.faults if args.duration is not None else args.every
    cfg = S.SoakConfig(faults=args.faults, every_s=every, submit_every_s=args.submit_every, steps=args.steps,
                       stop_s=(1.0, max(1.0, args.stop_max)), drain_s=args.drain, seed=args.seed)
    console = C.console()
    load_before = _load()
    tmp = Path(tempfile.mkdtemp(prefix="colocate-soak-"))
    console.print(f"run folder {tmp}")
    out = S.run_soak(tmp, cfg, say=console.print)
    rep = out.report

    faults_s = ", ".join(f"{k} {v}" for k, v in out.faults.items())
    ended = ", ".join(f"{k} {v}" for k, v in sorted(rep.ended.items()))
    rows = [["jobs lost", str(len(rep.lost)), ", ".join(rep.lost[:8])],
            ["jobs finished twice", str(len(rep.finished_twice)), ", ".join(rep.finished_twice[:8])],
            ["two copies of a job progressed at once", str(len(rep.two_copies)),
             f"{rep.two_copies_s:.1f} s in all; " + "; ".join(f"job {j} rank {r} pids {a},{b} {s:.1f} s"
                                                             for j, r, a, b, s in rep.two_copies[:4])],
            ["a GPU held two guaranteed jobs at once", str(len(rep.gpu_double)),
             f"{rep.gpu_double_s:.1f} s in all; " + "; ".join(f"{n} GPU {g}: jobs {a},{b} {s:.1f} s"
                                                             for n, g, a, _, b, _, s in rep.gpu_double[:4])]]
    console.print(C.rich_table(f"fault soak: {sum(out.faults.values())} faults in {out.run_s:.0f} s, seed {cfg.seed}",
                               ["invariant", "count", "examples"], rows, justify="left"))
    summary = [f"faults: {faults_s}",
               f"jobs: {out.submitted} submitted, {rep.jobs} acknowledged ({out.unacked} not: scheduler away), "
               f"{rep.finished} finished; journal states: {ended}; attempts -> jobs: {out.attempts}",
               f"jobs said done again by a placement that resumed at its last step (no work; not counted): "
               f"{len(rep.redone)}",
               "failed because: " + ("; ".join(f"{n} x {why}" for why, n in out.reasons.items()) or "-"),
               f"drain: {'every job ended' if out.drained else 'NOT every job ended'} in {out.drain_s:.0f} s; "
               f"{rep.lines} progress lines ({out.bad_lines} malformed)",
               f"verdict: {'PASS' if rep.passed else 'FAIL'} (every count must be 0)"]
    for line in summary:
        console.print(line)
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if not args.no_write:
        body = "\n".join([
            "## Fault soak: no job lost, run twice, or sharing a guaranteed GPU under faults", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`",
            f"- a real `colocate scheduler` (multi_queue, gang, binpack, opportunistic, preemption), "
            f"{cfg.nodes} `colocate node` with {cfg.gpus} simulated GPUs each, CURVE keys; jobs from `colocate "
            f"submit` about every {cfg.submit_every_s:g} s (2-worker gangs, single-GPU guaranteed, opportunistic), "
            f"each worker a plain Python script of {cfg.steps} steps of {cfg.step_s:g} s appending a progress line "
            "per step to one shared file (it resumes from its own step count)",
            f"- faults about every {cfg.every_s:g} s, drawn by `random.Random({cfg.seed})`: kill -9 of the scheduler "
            f"(restarted {cfg.sched_restart_s[0]:g}-{cfg.sched_restart_s[1]:g} s later); kill -9, SIGSTOP "
            f"({cfg.stop_s[0]:g}-{cfg.stop_s[1]:g} s, then SIGCONT), SIGTERM of a node (restarted "
            f"{cfg.restart_s[0]:g}-{cfg.restart_s[1]:g} s later on its state dir); kill -9 of a worker; kill -9 of a "
            f"node whose `workers.json` is then removed or corrupted ({', '.join(S.CORRUPTIONS)}), restarted "
            f"{cfg.table_restart_s[0]:g}-{cfg.table_restart_s[1]:g} s later on the same state dir; deletion of a "
            "running node's whole state dir",
            f"- load average before / after the run: {load_before} / {_load()} (the machine is shared: other "
            "sessions' tests and builds ran beside it)",
            "- counted from the progress file and the journal after the drain (`benchmarks/_soak_check.py`): "
            "lost = acknowledged, not finished by every rank, not failed/cancelled with a reason; finished twice = "
            "two placements each did work and wrote every rank's done line; two copies = two pids of one job and rank whose "
            "progress lines interleaved; GPU double = two guaranteed jobs' lines interleaved on one node and GPU",
            "", *[f"- {line}" for line in summary], "",
            C.markdown_table(["invariant", "count", "examples"], rows),
        ])
        console.print(f"wrote section '{SECTION}' of {C.update_results(SECTION, body)}")
    return 0 if rep.passed else 1


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    import os

    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
