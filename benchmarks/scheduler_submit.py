"""Live submit throughput and latency: client processes -> a real scheduler, over loopback with CURVE keys.

For each journal size (0, 100k, 1M jobs already journaled) and each number of client processes (1, 4, 16):
a real ``colocate scheduler`` (gang-binpack, no nodes: the jobs queue) is started on a copy of the journal,
the clients (``_submit_load.py``: each one connection, the default CURVE keys) submit one job after another
for ``--seconds``, and the table gives acknowledged submits per second and each submit's round trip
(p50, p99: request to acknowledgement, retries included), once per rate in ``--rates``:
- 0, *closed* (the default): each client submits again as soon as it is answered. That is the most the
  server takes; its latency is a saturated server's, which by Little's law is clients / rate.
- N > 0, *paced*: N submits/s offered in all, each client's submits due on a fixed, staggered schedule,
  the latency counted from the due time, so a server that falls behind pays for the queue it causes
  (no "coordinated omission"): the latency a cluster's users see at that rate.

The big journals are built by writing finished jobs directly with the journal's own API
(``Journal.new_job_id``, ``insert_job``, ``set_state``) in one transaction, kept in ``--cache`` for the
next runs (the schema is in the name), and each run starts the real server on a copy.

    python benchmarks/scheduler_submit.py                      # 0/100k/1M x 1/4/16 clients, 5 s each
    python benchmarks/scheduler_submit.py --sizes 0 --clients 4 --repeats 3 --no-write
    python benchmarks/scheduler_submit.py --sizes 0 --rates 0,1000,2000        # and paced at 1,000 and 2,000/s
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _submit_load as L

SECTION = "scheduler_submit"


def build_journal(path: Path, jobs: int) -> float:
    """``jobs`` finished jobs in a new journal at ``path``, in one transaction; seconds taken."""
    from cluster.server.journal import Journal
    from cluster.spec import JobSpec

    t0 = time.monotonic()
    j = Journal(str(path))
    request = '{"command": ["true"], "cwd": "/tmp", "env": {}, "workers": 1, "gpus": 1}'
    with j.transaction():
        for _ in range(jobs):
            job_id = j.new_job_id()
            j.insert_job(JobSpec(job_id, submit_time=1.0, user="load", name="old"), request, 1.0, f"old-{job_id}")
            j.set_state(job_id, "succeeded", "", 2.0)
    j.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    j.close()
    return time.monotonic() - t0


def one_run(tmp: Path, template: Path | None, clients: int, seconds: float, keys: Path | None,
            rate: float = 0.0) -> dict:
    run = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
    state = run / "s.db"
    if template is not None:
        shutil.copyfile(template, state)
    endpoint = f"tcp://127.0.0.1:{L.free_port()}"
    sched = L.start_scheduler(state, endpoint, keys, run / "scheduler.log")
    try:
        ready_s = L.wait_ready(endpoint, keys, sched)
        start = time.time() + 2.0 + 0.1 * clients  # every client connected and waiting by then
        procs = L.start_clients(clients, endpoint, keys, run, start, until=start + seconds, rate=rate)
        for p in procs:
            p.wait(seconds + 120)
    finally:
        L.stop(sched)
    rows = L.read_results(run)
    acked = [s for _, job, s in rows if job != "-"]
    lat = sorted(s * 1000 for s in acked)
    shutil.rmtree(run, ignore_errors=True)
    return {"rate": len(acked) / seconds, "p50": statistics.median(lat) if lat else float("nan"),
            "p99": C.rank(lat, 0.99),
            "lost": len(rows) - len(acked), "ready_s": ready_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0,100000,1000000", help="jobs already journaled (default 0,100000,1000000)")
    p.add_argument("--clients", default="1,4,16", help="client processes (default 1,4,16)")
    p.add_argument("--seconds", type=float, default=5.0, help="submitting time per run (default 5)")
    p.add_argument("--rates", default="0",
                   help="offered submits/s per cell, comma-separated; 0 = closed loop, each client as fast as it is "
                        "answered (default 0); e.g. 0,2000 adds a paced run at 2,000/s to every cell")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell; the table shows their medians (default 1)")
    p.add_argument("--insecure", action="store_true", help="no CURVE keys (the default runs with them)")
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "colocate-bench-journals"),
                   help="folder of the prebuilt journals (default: TMPDIR/colocate-bench-journals)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(c) for c in args.clients.split(",")]
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        p.error(f"--rates: expected numbers separated by commas, got {args.rates!r}")
    if any(r < 0 for r in rates) or not all(x > 0 for x in counts) or any(x < 0 for x in sizes):
        p.error("--rates, --clients and --sizes take numbers >= 0 (clients >= 1)")

    console = C.console()
    tmp = Path(tempfile.mkdtemp(prefix="colocate-bench-submit-"))
    keys = None if args.insecure else L.make_keys(tmp / "keys")
    rows, md = [], []
    try:
        for size in sizes:
            template = None
            note = "empty"
            if size:
                from cluster.server.journal import SCHEMA

                os.makedirs(args.cache, exist_ok=True)
                template = Path(args.cache) / f"schema{SCHEMA}-{size}.db"
                if template.exists():
                    note = f"{size:,} finished jobs written with the journal's API in one transaction (cached)"
                else:
                    part = template.with_suffix(".part")
                    for f in (part, Path(f"{part}-wal"), Path(f"{part}-shm"), Path(f"{part}.lock")):
                        f.unlink(missing_ok=True)
                    built = build_journal(part, size)
                    part.rename(template)
                    note = f"{size:,} finished jobs written with the journal's API in one transaction ({built:.0f} s)"
                console.print(f"journal of {size:,} jobs: {note}, {template.stat().st_size / 1e6:.0f} MB")
            for clients, rate in ((c, r) for c in counts for r in rates):
                runs = [one_run(tmp, template, clients, args.seconds, keys, rate) for _ in range(args.repeats)]
                load = os.getloadavg()[0]
                med = {k: statistics.median(r[k] for r in runs) for k in ("rate", "p50", "p99", "ready_s")}
                lost = sum(r["lost"] for r in runs)
                row = [f"{size:,}", str(clients), f"{rate:,.0f}/s" if rate else "closed", f"{med['rate']:,.0f}",
                       f"{med['p50']:.2f}", f"{med['p99']:.2f}", str(lost), f"{med['ready_s']:.1f}", f"{load:.1f}",
                       ", ".join(f"{r['rate']:,.0f}/{r['p99']:.1f}" for r in runs)]
                rows.append(row)
                md.append(row + [note])
                console.print(" | ".join(row))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    heads = ["journaled jobs", "clients", "offered", "submits/s", "p50 ms", "p99 ms", "no answer", "start s",
             "load 1m", "each run: submits/s / p99 ms"]
    console.print(C.rich_table(f"live submits, {'no keys' if args.insecure else 'CURVE'}, median of {args.repeats} "
                               f"run(s) of {args.seconds:g} s", heads, rows))
    if not args.no_write:
        body = "\n".join([
            "## Live submits: throughput and latency (loopback, client processes)", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`",
            f"- a real `colocate scheduler` (gang-binpack, no nodes: jobs queue) with "
            f"{'no keys' if args.insecure else 'the default CURVE keys'}; each client process keeps one connection "
            f"and submits for {args.seconds:g} s; medians of {args.repeats} run(s)",
            "- offered: *closed* = each client submits again as soon as it is answered (the server saturated: its "
            "most submits/s; latency = clients / rate by Little's law); *N/s* = paced: N submits/s offered in all, "
            "each client's submits due on a fixed, staggered schedule, latency counted from the due time (a late "
            "answer delays the next submits, and they are charged for it)",
            "- latency: request to acknowledgement (after the group commit's fsync); "
            "start s: scheduler start to first answer (restore); load: 1-minute load average after the cell", "",
            C.markdown_table(heads + ["journal"], md),
        ])
        console.print(f"wrote section '{SECTION}' of {C.update_results(SECTION, body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
