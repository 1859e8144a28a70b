"""Memory recommendation on the examples (issue 25): caps from the history of earlier runs only.

Part 1, recommendations (``colocate run`` on the simulated device, one run at a time): 30 runs of
``examples/train_cnn.py``, ``train_transformer.py`` and ``train_recsys.py`` (10 each, in a seeded random order),
each with a batch size and a width drawn from a small grid. Before each run, its memory cap is recommended by
the scheduler's own code (``cluster.predict.recommend.memory``: the p95 of the exact fingerprint's peaks, else
the tightest bound the family's runs give for this run's numbers; x 1.2) from the records of the runs before it (their reserved peaks as the
runtime measured them), fingerprinted as ``colocate submit`` does (the family groups each example's sweep). A
run with a recommendation runs capped there with ``--on-cap error`` (as the node runs a recommended cap): over
it, it stops and is restarted at the whole GPU (an out-of-memory restart, counted). A run with no
recommendation (no earlier run of its family, or a number above every earlier run's) runs as requested: the
whole GPU (learning). Reported: the share of recommended runs that stayed under their cap (target >= 99%), the
out-of-memory restarts over all runs (<= 1%), and the memory given (the cap a run finally ran under: its
recommendation, or the whole GPU) against whole-GPU requests (target >= 50% lower), over all runs and over the
recommended ones.

Part 2, the cluster (a real ``colocate scheduler`` (antman) and one ``colocate node`` with two simulated GPUs on
loopback): two guaranteed jobs of one CNN configuration run asking for their whole GPU (``--gpu-mem`` = the GPU's
memory); beside them, opportunistic jobs asking for ``--opp-mem`` each are submitted; after ``--window`` seconds
all are cancelled, and the same pair runs again with ``--gpu-mem auto`` (its recommendation: the exact level, from
the first pair's two runs, whose peaks the scheduler recorded when they ended), with the same opportunistic jobs. Reported: the opportunistic jobs the
scheduler started beside the guaranteed pair within ``--window`` seconds, and the GPU memory the pair left to
opportunistic work (the scheduler's bookkeeping: the GPUs' memory minus what the guaranteed jobs were given).

    python benchmarks/recommend_memory.py               # 30 runs (about 6 min on 2 cores) and the cluster run
    python benchmarks/recommend_memory.py --runs 9 --no-cluster --no-write
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

from cluster.predict.fingerprint import command_fingerprints, command_numbers, script_hash
from cluster.predict.history import Exit, HistoryRecord
from cluster.predict.recommend import MIB, Params, memory

SECTION = "recommend_memory"
ENDED = ("cancelled", "succeeded", "failed")
GIB = 1 << 30
WHOLE = 16 * GIB  # the simulated GPU's memory (colocate run's default): a whole-GPU request
GRID = {  # example -> (batch sizes, widths)
    "cnn": ((16, 32, 64), (8, 16, 32)),
    "transformer": ((4, 8, 16), (64, 128, 256)),
    "recsys": ((128, 256, 512), (16, 32, 64)),
}


def plan(runs: int, seed: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    names = list(GRID)
    out = []
    for k in range(runs):
        name = names[k % len(names)]
        batches, widths = GRID[name]
        out.append((name, rng.choice(batches), rng.choice(widths)))
    rng.shuffle(out)
    return out


def command(name: str, batch: int, width: int, iters: int) -> list[str]:
    return [sys.executable, str(C.example_path(name)), "--iters", str(iters), "--batch-size", str(batch), "--width",
            str(width), "--host-ms", "0", "--log-every", "0"]


def run_one(cmd: list[str], cap: int | None, tmp: Path) -> dict:
    """One ``colocate run`` on the simulated device; its exit code, peaks, wall time and whether it ran out of
    memory under ``cap`` (None: the whole GPU)."""
    stats = tmp / "stats.json"
    stats.unlink(missing_ok=True)
    argv = [*C.colocate_cmd(), "run", "--device", "sim", "--sim-gpu-mem", str(WHOLE), "--stats-file", str(stats)]
    if cap is not None:
        argv += ["--gpu-mem", str(cap), "--on-cap", "error"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(C.ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    t0 = time.monotonic()
    res = subprocess.run([*argv, "--", *cmd], capture_output=True, text=True, env=env, timeout=600)
    out = json.loads(stats.read_text()) if stats.exists() else {}
    oom = res.returncode != 0 and "device memory cap" in res.stderr
    if res.returncode != 0 and not oom:
        raise SystemExit(f"run failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    return {"code": res.returncode, "oom": oom, "peak": int(out.get("mem_reserved_peak_bytes", 0)),
            "wall": time.monotonic() - t0}


def recommendations(args, console) -> tuple[list[list[str]], dict]:
    user = getpass.getuser()
    records: list[HistoryRecord] = []
    rows, given, recommended, under, restarts, learning = [], [], [], 0, 0, 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for k, (name, batch, width) in enumerate(plan(args.runs, args.seed)):
            cmd = command(name, batch, width, args.iters)
            exact, family, _ = command_fingerprints(user, cmd, script_hash(C.example_path(name).read_bytes()))
            numbers = command_numbers(cmd)
            fig, why = memory([r for r in records if r.exact == exact], [r for r in records if r.family == family],
                              numbers, Params(), WHOLE)
            cap = int(fig.value) if fig is not None else None
            res = run_one(cmd, cap, tmp)
            final_cap = cap
            if cap is not None:
                recommended.append(k)
                if res["oom"]:  # out of memory under its recommendation: restarted at the whole GPU
                    restarts += 1
                    records.append(HistoryRecord(str(k), exact, family, user, 1, "sim", res["wall"], Exit.OOM, 0.0,
                                                 res["wall"], peak_mem=res["peak"], mem_cap=cap, numbers=numbers))
                    res, final_cap = run_one(cmd, None, tmp), None
                elif res["peak"] <= cap:
                    under += 1
            else:
                learning += 1
            given.append(final_cap if final_cap is not None else WHOLE)
            records.append(HistoryRecord(str(k), exact, family, user, 1, "sim", res["wall"], Exit.SUCCEEDED, 0.0,
                                         res["wall"], peak_mem=res["peak"], mem_cap=cap, numbers=numbers))
            level = f"{fig.level} ({fig.history})" if fig is not None else f"learning: {why[:60]}"
            row = [str(k + 1), name, str(batch), str(width), f"{res['peak'] / MIB:.1f}",
                   f"{cap / MIB:.0f}" if cap is not None else "whole", level, "yes" if res["oom"] and cap else "-"]
            rows.append(row)
            console.print(" | ".join(row))
    n = len(rows)
    rec_given = [given[k] for k in recommended]
    summary = {
        "runs": n, "recommended": len(recommended), "learning": learning, "under": under, "restarts": restarts,
        "under_share": under / len(recommended) if recommended else float("nan"),
        "restart_share": restarts / n if n else float("nan"),
        "saved_all": 1 - sum(given) / (n * WHOLE) if n else float("nan"),
        "saved_recommended": 1 - sum(rec_given) / (len(rec_given) * WHOLE) if rec_given else float("nan"),
    }
    return rows, summary


# ---------------------------------------------------------------- part 2: the cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(C.ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.Popen([str(a) for a in argv], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def cluster(args, console) -> list[list[str]]:
    from colocate.clients.scheduler import SchedulerClient, request_from_here

    gpu_mem = args.cluster_gpu_mem
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "work").mkdir()
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        py = sys.executable
        sched = spawn([py, "-m", "colocate", "scheduler", "--bind", endpoint, "--state", tmp / "s.db", "--config",
                       "antman", "--insecure", "--log-level", "warning"], tmp / "scheduler.log")
        node = spawn([py, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", 2, "--sim-gpu-mem", gpu_mem,
                      "--scheduler", endpoint, "--node-id", "n0", "--endpoint", f"ipc://{tmp}/n0.sock", "--log-dir",
                      tmp / "logs", "--state-dir", tmp / "n0", "--insecure", "--log-level", "warning"],
                     tmp / "node.log")
        client = SchedulerClient(endpoint, "", timeout_s=5.0)
        try:
            wait(lambda: _try(lambda: any(n.up for n in client.nodes().nodes)), 90, "the node to join")
            guaranteed = command("cnn", 32, 16, 0)[:2] + ["--duration", str(args.window + 20), "--batch-size", "32",
                                                          "--width", "16", "--host-ms", "10", "--log-every", "0"]
            env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}

            def submit(cmd, **kw) -> str:
                req = request_from_here(cmd, gpus=1, cwd=str(tmp / "work"), environ=env, **kw)
                return client.submit(req)

            rows = []  # the first pair's runs (cancelled after the window) are the history the second's comes from
            for label, kw in (("whole GPU", {"gpu_mem": gpu_mem}), ("auto", {"auto": ("gpu_mem",)})):
                pair = [submit(guaranteed, **kw) for _ in range(2)]
                wait(lambda pair=pair: all(client.job(j).state == "running" for j in pair), 180,
                     "the guaranteed pair to run")
                given = [client.job(j) for j in pair]
                opp = [submit(command("cnn", 16, 8, 30), priority="opportunistic", gpu_mem=args.opp_mem)
                       for _ in range(args.opp_jobs)]
                time.sleep(args.window)
                started = sum(1 for j in opp if client.job(j).started_at is not None)
                caps = [_cap(v.advice, gpu_mem) for v in given]
                for j in pair + opp:
                    _try(lambda j=j: client.cancel(j))
                wait(lambda every=pair + opp: all(client.job(j).state in ENDED for j in every), 120, "the jobs to end")
                time.sleep(3)  # the node reports the GPUs free
                rows.append([label, f"{sum(caps) / GIB:.2f}", f"{(2 * gpu_mem - sum(caps)) / GIB:.2f}",
                             f"{started}/{args.opp_jobs}"])
                console.print(" | ".join(rows[-1]))
            return rows
        finally:
            for proc in (node, sched):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def _cap(advice: str, whole: int) -> int:
    """The memory a guaranteed job was given: its recommended cap (from its advice line), else its whole GPU."""
    import re

    from colocate.base.units import parse_size

    m = re.search(r"gpu-mem ([0-9.]+ [KMGT]iB)", advice)
    return parse_size(m.group(1).replace(" ", "")) if m else whole


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30, help="runs of the examples (default 30)")
    p.add_argument("--iters", type=int, default=8, help="iterations per run (default 8: the peak is reached by then)")
    p.add_argument("--seed", type=int, default=25, help="the order and the grid draws (default 25)")
    p.add_argument("--no-cluster", action="store_true", help="skip the cluster run (part 2)")
    p.add_argument("--cluster-gpu-mem", type=int, default=4 * GIB, help="memory of each GPU in the cluster run")
    p.add_argument("--opp-mem", type=int, default=512 * MIB, help="what each opportunistic job asks for")
    p.add_argument("--opp-jobs", type=int, default=4, help="opportunistic jobs beside the guaranteed pair")
    p.add_argument("--window", type=float, default=20.0, help="seconds the opportunistic jobs may start in")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)

    console = C.console()
    heads = ["run", "example", "batch", "width", "peak MiB", "cap MiB", "level (runs)", "OOM restart"]
    rows, s = recommendations(args, console)
    console.print(C.rich_table("runs", heads, rows, left=("example", "level (runs)")))
    sum_heads = ["runs", "recommended", "learning", "under their cap", "OOM restarts", "memory given vs whole GPU: all",
                 "... recommended runs"]
    summary = [[str(s["runs"]), str(s["recommended"]), str(s["learning"]),
                f"{s['under']}/{s['recommended']} ({s['under_share']:.1%})",
                f"{s['restarts']} ({s['restart_share']:.1%})", f"-{s['saved_all']:.1%}", f"-{s['saved_recommended']:.1%}"]]
    console.print(C.rich_table("memory recommendation; targets: >= 99% under, <= 1% restarts, >= 50% lower",
                               sum_heads, summary))
    cluster_heads = ["guaranteed pair asks", "GiB given to the pair", "GiB left to opportunistic work",
                     "opportunistic jobs started"]
    crows = [] if args.no_cluster else cluster(args, console)
    if crows:
        console.print(C.rich_table("the cluster run", cluster_heads, crows, left=("guaranteed pair asks",)))
    load = f"{os.getloadavg()[0]:.1f}"
    if not args.no_write:
        body = "\n".join([
            "## Memory recommendation from the history of earlier runs (issue 25)", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`; load (1 min) after: {load}",
            f"- part 1: {s['runs']} runs of the three examples ({args.iters} iterations each, a batch size and a width "
            f"drawn from a 3x3 grid per example, seed {args.seed}) under `colocate run --device sim` (GPU "
            f"{WHOLE // GIB} GiB = a whole-GPU request), one at a time; each run's cap recommended by "
            "`cluster.predict.recommend.memory` from the runs before it only (exact fingerprint: p95 of its peaks; "
            "else the tightest bound its family's runs give; x 1.2), run with `--on-cap error`; over it: restarted "
            "at the whole GPU; no recommendation: the whole GPU (learning)", "",
            C.markdown_table(sum_heads, summary), "",
            "<details><summary>every run</summary>", "", C.markdown_table(heads, rows), "", "</details>", "",
            *([f"- part 2 (a live cluster: `colocate scheduler` (antman) and one `colocate node` with 2 simulated "
               f"GPUs of {args.cluster_gpu_mem // GIB} GiB on loopback): a guaranteed CNN pair asking for the whole "
               f"GPU, then the same pair with `--gpu-mem auto` (its history: the first pair's runs, exact level); "
               f"{args.opp_jobs} opportunistic jobs "
               f"asking {args.opp_mem // MIB} MiB each submitted beside it, counted if started within "
               f"{args.window:g} s", "", C.markdown_table(cluster_heads, crows)] if crows else []),
        ])
        console.print(f"wrote section '{SECTION}' of {C.update_results(SECTION, body)}")
    met = s["under_share"] >= 0.99 and s["restart_share"] <= 0.01 and s["saved_all"] >= 0.5
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
