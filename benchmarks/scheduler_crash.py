"""Crash safety with the group commit: kill -9 of the scheduler during bursts of submits from many clients.

Each round: the scheduler is (re)started on the same journal; ``--clients`` client processes
(``_submit_load.py``, one connection each, CURVE keys) submit one job after another with request ids of
their own; after a random 0.3-1.5 s the scheduler is killed with SIGKILL in the middle of the burst; the
clients go on (their tries get no answer, or are answered by the next incarnation: the client library
retries a submit with the same request id). After the last round the scheduler is started once more and
every client's log is checked against the journal:

  * every acknowledged submit (request id -> job id) is in the journal, with that request id;
  * no request id has two jobs, and no job id was acknowledged for two request ids.

    python benchmarks/scheduler_crash.py                 # 16 clients, 10 rounds
    python benchmarks/scheduler_crash.py --clients 4 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _submit_load as L


def check(state: Path, out: Path) -> dict:
    """What the clients were told against what the journal holds."""
    acked = {rid: job for rid, job, _ in L.read_results(out) if job != "-"}
    db = sqlite3.connect(f"file:{state}?mode=ro", uri=True)
    rows = db.execute("SELECT job_id, request_id FROM jobs WHERE request_id IS NOT NULL").fetchall()
    db.close()
    by_request: dict[str, list[str]] = {}
    for job, rid in rows:
        by_request.setdefault(rid, []).append(job)
    missing = [rid for rid, job in acked.items() if by_request.get(rid) != [job]]
    twice = [rid for rid, jobs in by_request.items() if len(jobs) > 1]
    jobs_told = list(acked.values())
    return {"acknowledged": len(acked), "journaled": len(rows), "missing": missing, "twice": twice,
            "job_told_twice": len(jobs_told) - len(set(jobs_told))}


def run(clients: int, rounds: int, tmp: Path, seed: int = 0, log=print) -> dict:
    rng = random.Random(seed)
    keys = L.make_keys(tmp / "keys")
    state, endpoint = tmp / "s.db", f"tcp://127.0.0.1:{L.free_port()}"
    stop_file = tmp / "stop"
    procs = []
    try:
        sched = L.start_scheduler(state, endpoint, keys, tmp / "scheduler.log")
        L.wait_ready(endpoint, keys, sched)
        procs = L.start_clients(clients, endpoint, keys, tmp, time.time() + 1.0, stop_file=stop_file, timeout_s=6.0)
        time.sleep(1.0)
        for r in range(rounds):
            time.sleep(rng.uniform(0.3, 1.5))  # in the middle of the burst
            L.stop(sched, signal.SIGKILL)
            log(f"round {r + 1}/{rounds}: killed the scheduler (kill -9)")
            sched = L.start_scheduler(state, endpoint, keys, tmp / "scheduler.log")
            L.wait_ready(endpoint, keys, sched)
        time.sleep(1.0)
        stop_file.touch()
        for p in procs:
            p.wait(60)
    finally:
        stop_file.touch()
        for p in procs:
            if p.poll() is None:
                L.stop(p)
        L.stop(sched)
    return check(state, tmp)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16, help="client processes (default 16)")
    p.add_argument("--rounds", type=int, default=10, help="kill -9 rounds (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="colocate-bench-crash-"))
    res = run(args.clients, args.rounds, tmp, args.seed)
    line = (f"{args.clients} clients, {args.rounds} kill -9 rounds: {res['acknowledged']} acknowledged, "
            f"{res['journaled']} journaled, {len(res['missing'])} acknowledged but missing, {len(res['twice'])} request "
            f"ids with two jobs, {res['job_told_twice']} job ids told twice")
    print(f"{line} (state {tmp})")
    if not args.no_write:
        import _common as C

        body = "\n".join([
            "## Live scheduler: kill -9 during bursts of submits (group commit)", "",
            *C.machine_lines(C.machine_info()), f"- command: `{C.invocation()}`; load (1 min) after: "
            f"{os.getloadavg()[0]:.1f}",
            "- each round the scheduler is killed (SIGKILL) 0.3-1.5 s into a burst from every client process (one "
            "CURVE connection each, request ids of their own, the library's retries), then restarted on the same "
            "journal; after the last round every client's log is checked against the journal", "",
            f"- {line}",
        ])
        print(f"wrote section 'scheduler_crash' of {C.update_results('scheduler_crash', body)}")
    ok = not (res["missing"] or res["twice"] or res["job_told_twice"])
    if ok:  # a failure keeps its journal and logs for a look
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
