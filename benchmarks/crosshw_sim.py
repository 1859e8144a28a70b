"""Cross-hardware prediction on simulated GPU types: each example's time per iteration on type B, predicted from
its run on type A (issue 25).

For each simulated GPU type (``--types``, default V100, P100 and K80 at their table speeds 1, 0.81 and 0.25),
a real ``colocate scheduler`` and one ``colocate node --sim-gpus 1:TYPE`` run on this machine, and each
example (``train_cnn``, ``train_transformer``, ``train_recsys`` at their default sizes) is submitted once, one
job at a time. What the job taught on A is what the scheduler has at its end (``colocate status JOB``): the
node's last summary (mean step time over its window of recent mini-batches, its host part before the first
device work, busy fraction = device time over wall time) and the job's hardware features (the simulated type and its speed, as the node told the job).

For each ordered pair (A, B) the prediction is ``cluster.predict.carry.carry``: the device part of A's step
(step x ``carry.device_share``: the share after the first device work) scaled by speed_A / speed_B, the
host part kept, with B's hardware features from its declared spec (``colocate.gpus.sim.declared`` of
``--sim-gpus 1:B``). It is compared with the time per iteration measured on B: the mean over B's run of
every mini-batch but the first (the node's ``--record``). Also printed: the device's own time per
iteration (a simulated GPU's: the job's CPU time on its core, the ``busy_s`` of its reports) carried by
the same ratio against B's, which shows how well the speed model holds where the time the job waited for
its core is left out; the error with the busy fraction as the device share (a simulated GPU's busy time
is CPU time: it leaves out that waiting); and the error with the whole step scaled (no host/device split).
With ``--repeats N`` the types run in rounds of alternating order and each figure is the median over the
N runs.

    python benchmarks/crosshw_sim.py --repeats 3      # 27 runs, about 10 min on 2 shared cores
    python benchmarks/crosshw_sim.py --types V100 K80 --no-write
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C
import _live_runs as L

SECTION = "crosshw_sim"
# iterations per example on the fastest type; a slower type runs fewer so that every run takes ~10 s
ITERS = {"cnn": 240, "transformer": 240, "recsys": 240}


def declared_features(spec: str):
    """``HardwareFeatures`` of the one GPU of ``--sim-gpus spec`` as its node declares it."""
    from colocate import protocol as P
    from colocate.base.vocab import DeviceKind
    from colocate.gpus.sim import declared, parse_sim_gpus

    ((name, speed),) = parse_sim_gpus(spec)
    return P.HardwareFeatures(kind=DeviceKind.SIM, gpus=1, **declared(16 << 30, 0, name, speed))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=["V100", "P100", "K80"],
                   help="simulated GPU types, as --sim-gpus takes them (TYPE or TYPE@SPEED)")
    p.add_argument("--examples", nargs="+", default=list(ITERS), choices=list(ITERS))
    p.add_argument("--repeats", type=int, default=1, help="runs of each example on each type (default 1; figures "
                   "are the medians over the repeats)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    p.add_argument("--log-level", default="warning", help="the daemons' log level")
    args = p.parse_args(argv)

    from cluster.predict import carry
    from colocate.gpus.sim import parse_sim_gpus

    console = C.console()
    info = C.machine_info()
    t_start = time.time()
    seen: dict[tuple[str, str], list[dict]] = {}  # (example, type) -> what each run taught and measured
    loads = []
    for r in range(args.repeats):  # rounds in alternating order, so that a drift of the machine's load evens out
        for gpu_type in (args.types if r % 2 == 0 else args.types[::-1]):
            ((_, speed),) = parse_sim_gpus(f"1:{gpu_type}")
            with L.Cluster(f"1:{gpu_type}", log_level=args.log_level, record=True) as cluster:
                for name in args.examples:
                    iters = max(40, round(ITERS[name] * speed ** 0.5))
                    cmd = [sys.executable, str(C.example_path(name)), "--iters", str(iters), "--log-every", "0"]
                    run = cluster.run_job(cmd, iterations=iters, name=f"train_{name}.py")
                    loads.append(os.getloadavg()[0])
                    last = run.last()
                    if run.state != "succeeded" or last is None or run.features is None:
                        raise SystemExit(f"{name} on {gpu_type}: {run.state}, exit {run.exit_code}: nothing learnt "
                                         f"(logs in {cluster.tmp})")
                    reports = cluster.reports(run.job_id)[1:]
                    steps = [r["duration_s"] for r in reports]
                    got = {"step": last.step_mean_s or last.step_p50_s, "busy": last.busy_fraction,
                           "device": carry.device_share(last), "hw": run.features.hardware,
                           "measured": statistics.mean(steps), "n": len(steps), "load": loads[-1],
                           "cpu": statistics.mean(r["busy_s"] for r in reports)}
                    seen.setdefault((name, gpu_type), []).append(got)
                    console.print(f"{name} on {gpu_type}: summary step {got['step'] * 1e3:.1f} ms, busy "
                                  f"{got['busy']:.2f}, device share {got['device']:.2f}, measured "
                                  f"{got['measured'] * 1e3:.1f} ms over {len(steps)}, features say "
                                  f"{got['hw'].name} speed {got['hw'].sim_speed:g}")
    # per (example, type): the median over the repeats of each figure
    learnt = {k: {f: (statistics.median(g[f] for g in v) if f not in ("hw", "n") else v[-1][f]) for f in v[0]}
              for k, v in seen.items()}

    rows, errors, whole_errors, busy_errors, cpu_errors = [], [], [], [], []
    for name in args.examples:
        for a in args.types:
            for b in args.types:
                if a == b:
                    continue
                la, lb = learnt[(name, a)], learnt[(name, b)]
                hw_b = declared_features(f"1:{b}")
                pred = carry.carry(la["step"], la["device"], la["hw"], hw_b)
                by_busy = carry.carry(la["step"], la["busy"], la["hw"], hw_b)
                if pred is None:
                    raise SystemExit(f"{name}: no carry from {a} to {b} (features {la['hw']})")
                ratio = carry.device_ratio(la["hw"], hw_b)
                whole = la["step"] * ratio  # the whole step scaled (no host/device split)
                m = lb["measured"]
                err, werr, berr = abs(pred - m) / m, abs(whole - m) / m, abs(by_busy - m) / m
                cerr = abs(la["cpu"] * ratio - lb["cpu"]) / lb["cpu"]  # the device's own (CPU) time, carried
                cpu_errors.append(cerr)
                errors.append(err)
                whole_errors.append(werr)
                busy_errors.append(berr)
                rows.append([f"train_{name}", f"{a} -> {b}", f"{la['step'] * 1e3:.1f}", f"{la['device']:.2f}",
                             f"{ratio:.3f}", f"{pred * 1e3:.1f}", f"{m * 1e3:.1f}", f"{err:.1%}",
                             f"{la['busy']:.2f}", f"{berr:.1%}", f"{werr:.1%}",
                             f"{la['cpu'] * ratio * 1e3:.1f} / {lb['cpu'] * 1e3:.1f}", f"{cerr:.1%}"])
    headers = ["example", "A -> B", "step on A ms", "device share on A", "device ratio", "predicted on B ms",
               "measured on B ms", "error", "busy on A", "error (busy as the share)", "error (whole step scaled)",
               "device CPU ms on B: carried / measured", "error (device CPU)"]
    runs_headers = ["example", "type", "speed (features)", "summary step ms", "device share", "busy", "measured ms",
                    "mini-batches", "load"]
    runs = [[f"train_{n}", t, f"{v['hw'].sim_speed:g}", f"{v['step'] * 1e3:.1f}", f"{v['device']:.2f}",
             f"{v['busy']:.2f}",
             f"{v['measured'] * 1e3:.1f}", str(v["n"]), f"{v['load']:.2f}"] for (n, t), v in learnt.items()]
    within = sum(e <= 0.10 for e in errors)
    verdict = (f"{within} of {len(errors)} pairs within 10%; median error {statistics.median(errors):.1%}, "
               f"max {max(errors):.1%} (with the busy fraction as the device share: median "
               f"{statistics.median(busy_errors):.1%}; whole step scaled: median {statistics.median(whole_errors):.1%}; "
               f"the device's CPU time alone, carried: median {statistics.median(cpu_errors):.1%}, "
               f"max {max(cpu_errors):.1%})")
    console.print(C.rich_table("runs", runs_headers, runs, left=("example", "type")))
    console.print(C.rich_table("time per iteration on B, carried from A", headers, rows, left=("example", "A -> B")))
    console.print(verdict)
    if args.no_write:
        return 0
    body = "\n".join([
        "## Cross-hardware prediction on simulated GPU types: real runs of the examples (issue 25)", "",
        f"`{C.invocation()}`", "", *C.machine_lines(info),
        f"- load average (1 min) after each run: median {statistics.median(loads):.2f}, max {max(loads):.2f}; "
        f"wall {time.time() - t_start:.0f} s",
        "- per type a real `colocate scheduler` and one `colocate node --sim-gpus 1:TYPE`; one job at a time; "
        "A's step (the node's last summary: mean over its window) and busy fraction, A's hardware features as "
        "the job reported them, B's from its declared spec; predicted = `cluster.predict.carry.carry` "
        "(host part kept, device part x speed_A / speed_B; the device share = 1 - host part / step); measured = "
        "mean of B's mini-batches but the first",
        "", C.markdown_table(runs_headers, runs), "", C.markdown_table(headers, rows), "", f"**{verdict}**",
    ])
    C.update_results(SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
