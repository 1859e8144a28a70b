"""colocate inside Ray, measured on a Ray cluster of simulated-GPU nodes on 127.0.0.1 (``colocate.ray.local``).

Three parts (``--parts``), each written to its own section of ``benchmarks/RESULTS.md`` (``ray_fractions``,
``ray_colocation``, ``ray_startup``):

* fractions: two actors of ``num_gpus=0.5`` on one GPU, both training flat out at once, and a third of 0.25
  with ``gpu_mem`` 1 GiB that holds 1.25 GiB: each one's device busy fraction (over its training call, the
  three started together once their workers were up) against its share, its reserved memory peak against
  its cap;
* colocation: a guaranteed whole-GPU Ray Train run (``examples/ray_train.py --mode whole``: 2 workers on 2 Ray
  nodes, a CNN with a data phase) solo, then beside one opportunistic Ray task per GPU (the node picks the GPU);
  the guaranteed throughput against its solo run, and the share of the guaranteed job's idle device time the
  opportunistic tasks used (their device busy time in the run's window over (1 - solo busy) of it);
* startup: seconds from ``.remote()`` to ``ray.get`` of a trivial GPU task importing torch, with and without
  colocate (a fresh worker each time: ``max_calls=1``).

The two Ray nodes share one ``colocate node`` that owns two simulated GPUs, one per Ray node (so each GPU is
its own CPU core). Medians over ``--repeats``. On a 2-core machine shared with other work the figures are
noisy: compare within one run.

    python benchmarks/ray_colocation.py                       # all parts, 3 repeats, RESULTS.md
    python benchmarks/ray_colocation.py --parts startup --repeats 5 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    EXAMPLES_DIR,
    invocation,
    machine_info,
    machine_lines,
    markdown_table,
    update_results,
)

from colocate.base.vocab import JobClass

GiB = 1 << 30
PARTS = ("fractions", "colocation", "startup")
SECTION = {"fractions": "ray_fractions", "colocation": "ray_colocation", "startup": "ray_startup"}  # RESULTS.md
NOTES = {
    "fractions": "three actors trained flat out at once (after a warm-up call); busy = device busy fraction of "
                 "that call; the 0.25 actor held 1.25 GiB",
    "colocation": "G = the guaranteed Ray Train run (2 whole-GPU workers, one per Ray node, CNN with a 14 ms data "
                  "phase), solo then beside O = one opportunistic Ray task per GPU (the node picked the GPU); idle "
                  "share used = O's device busy time in G's window / G's solo idle time, both GPUs",
    "startup": "`.remote()` to `ray.get` of a task importing torch on a fresh worker (max_calls=1), 1 GPU; the "
               "first round (cold node) dropped",
}


def cnn_steps(seconds: float, host_ms: float = 0.0, hold_bytes: int = 0, window: str | None = None) -> dict:
    """Train the example's CNN for ``seconds`` (a ``host_ms`` sleep per step); with ``window`` (a folder), until
    its ``stop`` file appears, and report the device busy time between its ``start`` and ``stop`` files."""
    import torch
    import torch.nn.functional as F
    from ray_train import SmallCNN

    import torch_hooks

    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    held = torch.ones(hold_bytes // 4) if hold_bytes else None
    begin = time.monotonic()
    marks: dict = {}
    while (time.monotonic() - begin < seconds) if window is None else "stop" not in marks:
        if window is not None:
            for mark in ("start", "stop"):
                if mark not in marks and os.path.exists(os.path.join(window, mark)):
                    marks[mark] = (time.monotonic(), torch_hooks.stats()["device_busy_s"])
        if host_ms:
            time.sleep(host_ms / 1000.0)
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    del held
    stats = torch_hooks.stats()
    # busy_fraction: from this process's first device work (this call's first step) to now
    out = {k: stats[k] for k in ("job_id", "gpu", "priority", "sm_share", "mem_cap_bytes", "busy_fraction",
                                 "mem_reserved_peak_bytes", "host_bytes_peak", "iterations", "wall_s")}
    if window is not None and "start" in marks:
        (t0, b0), (t1, b1) = marks["start"], marks["stop"]
        out["window_busy_fraction"] = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
    return out


def part_fractions(args) -> tuple[list[str], list[list[str]]]:
    import ray

    import colocate.ray as cr

    class Steps:
        def warm(self) -> bool:  # torch imported, the runtime installed and registered
            import torch  # noqa: F401

            return True

        def run(self, *a, **k) -> dict:
            return cnn_steps(*a, **k)

    Actor = ray.remote(Steps)
    rows: dict[str, list[dict]] = {"0.5 (a)": [], "0.5 (b)": [], "0.25, gpu_mem 1GiB": []}
    for _ in range(args.repeats):
        actors = [Actor.options(**cr.options(0.5, resources={"node0": 1})).remote() for _ in range(2)]
        actors.append(Actor.options(**cr.options(0.25, gpu_mem="1GiB", resources={"node1": 1})).remote())
        ray.get([a.warm.remote() for a in actors], timeout=600)  # then all three train at once
        runs = [a.run.remote(args.seconds) for a in actors[:2]]
        runs.append(actors[2].run.remote(args.seconds, hold_bytes=int(1.25 * GiB)))
        for key, result in zip(rows, ray.get(runs, timeout=600)):
            rows[key].append(result)
        for actor in actors:
            ray.kill(actor)
    headers = ["actor (num_gpus)", "GPU", "share", "busy (median, max)", "cap", "reserved peak (max)",
               "host bytes peak"]
    table = []
    for key, runs in rows.items():
        busy = [r["busy_fraction"] for r in runs]
        table.append([key, str(runs[0]["gpu"]), f"{runs[0]['sm_share']:.2f}",
                      f"{statistics.median(busy):.3f}, {max(busy):.3f}", f"{runs[0]['mem_cap_bytes'] / GiB:.2f} GiB",
                      f"{max(r['mem_reserved_peak_bytes'] for r in runs) / GiB:.3f} GiB",
                      f"{max(r['host_bytes_peak'] for r in runs) / GiB:.3f} GiB"])
    return headers, table


def _train(args, out: str) -> list[dict]:
    from ray_train import trainer

    trainer("whole", args.seconds, args.host_ms, "gloo", tempfile.mkdtemp(prefix="ray-bench-"), out=out).fit()
    return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in (0, 1)]


def part_colocation(args, cluster) -> tuple[list[str], list[list[str]]]:
    import ray

    import colocate.ray as cr

    Steps = ray.remote(max_calls=1)(cnn_steps)
    ratios, used, solo_busy, opp_busy, gpus = [], [], [], [], []
    for _ in range(args.repeats):
        solo = _train(args, tempfile.mkdtemp(prefix="ray-solo-"))
        window = tempfile.mkdtemp(prefix="ray-co-")
        opps = []
        for i in range(2):  # one after the other: the node picks the least utilized GPU, so the second the other
            opps.append(Steps.options(**cr.options(priority=JobClass.OPPORTUNISTIC, resources={f"node{i}": 1}))
                        .remote(0, window=window))
            _wait(lambda n=i + 1: sum(1 for j in cluster.jobs().values()
                                      if j.priority == JobClass.OPPORTUNISTIC and j.iterations >= 50) >= n,
                  "the opportunistic tasks to run")
        co = _train(args, window)
        opp = ray.get(opps, timeout=600)
        g_solo = statistics.mean(r["it_per_s"] for r in solo)
        g_co = statistics.mean(r["it_per_s"] for r in co)
        idle = sum(1.0 - r["busy"] for r in solo)  # the 2 GPUs' idle fractions while G ran alone
        o_busy = sum(o.get("window_busy_fraction", 0.0) for o in opp)  # device fractions O took in G's window
        ratios.append(g_co / g_solo)
        used.append(o_busy / idle if idle > 0 else 0.0)
        solo_busy.append(statistics.mean(r["busy"] for r in solo))
        opp_busy.append(o_busy / 2)
        gpus.append("+".join(str(o["gpu"]) for o in opp))
    headers = ["repeats", "G it/s vs solo (median, min)", "G busy solo (per GPU)", "O busy in G's window (per GPU)",
               "idle share used by O (median, min)", "GPUs the node picked for O"]
    return headers, [[str(args.repeats), f"{statistics.median(ratios):.3f}, {min(ratios):.3f}",
                      f"{statistics.median(solo_busy):.3f}", f"{statistics.median(opp_busy):.3f}",
                      f"{statistics.median(used):.3f}, {min(used):.3f}", ", ".join(gpus)]]


def _wait(pred, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)


def part_startup(args) -> tuple[list[str], list[list[str]]]:
    import ray

    import colocate.ray as cr

    def trivial():
        import torch

        return torch.zeros(1).numel()

    task = ray.remote(max_calls=1)(trivial)
    times: dict[str, list[float]] = {"plain Ray": [], "with colocate": []}
    for repeat in range(args.repeats + 1):  # the first round warms the node (its first worker) and is dropped
        for key, opts in (("plain Ray", {"num_gpus": 1}), ("with colocate", cr.options(1.0))):
            t0 = time.monotonic()
            ray.get(task.options(**opts, resources={"node0": 1}).remote(), timeout=300)
            if repeat:
                times[key].append(time.monotonic() - t0)
    plain, coloc = statistics.median(times["plain Ray"]), statistics.median(times["with colocate"])
    headers = ["task", "median s", "min s", "max s"]
    rows = [[k, f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"] for k, v in times.items()]
    rows.append(["colocate adds", f"{coloc - plain:+.2f}", "", ""])
    return headers, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0, help="training time per run")
    ap.add_argument("--host-ms", type=float, default=14.0, help="the guaranteed run's data phase per step")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        ap.error(f"--parts: comma-separated, of {', '.join(PARTS)}")
    sys.path.insert(0, str(EXAMPLES_DIR))  # ray_train (the example), in this process and the workers
    os.environ["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES_DIR), os.environ.get("PYTHONPATH", "")])
    from colocate.ray.local import LocalCluster

    info = machine_info()
    with LocalCluster(ray_nodes=2, policy="adaptive") as cluster:
        for part in parts:
            t0, load0 = time.monotonic(), os.getloadavg()[0]
            headers, rows = (part_fractions(args) if part == "fractions" else part_colocation(args, cluster)
                             if part == "colocation" else part_startup(args))
            table = markdown_table(headers, rows)
            print(f"\n{part} ({time.monotonic() - t0:.0f} s)\n{table}", flush=True)
            body = "\n".join([
                f"## colocate inside Ray: {part} (2 Ray nodes on 127.0.0.1, one colocate node, 2 sim GPUs of 4 GiB)",
                "", *machine_lines(info), f"- command: `{invocation()}`",
                f"- {args.repeats} repeat(s), {args.seconds:g} s per run; " + NOTES[part],
                f"- load average (1 min) before / after: {load0:.1f} / {os.getloadavg()[0]:.1f} on "
                f"{os.cpu_count()} cores (Ray's own processes add about 2-3; more means other work shared the "
                "machine and the figures are noise)", "", table, ""])
            if not args.no_write:
                print(f"wrote {update_results(SECTION[part], body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
