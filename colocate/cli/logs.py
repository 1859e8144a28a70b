"""``colocate logs JOB [--worker R]``: the output of a job's workers (latest placement)."""

from __future__ import annotations

import sys

from colocate.cli._common import JOB_ID, NONNEG_INT, RANK, add_scheduler_options, client_failure, fail, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("logs", help="print a job's worker output",
                       description="Print the log file of each worker of the job's latest placement (stdout and "
                       "stderr), read from the shared filesystem. Exit code: 0; 1 unknown job, no log yet, "
                       "a log file not readable here, or no answer; 2 a bad job id or option.")
    p.add_argument("job", type=JOB_ID, metavar="JOB")
    p.add_argument("--worker", type=RANK, default=None, metavar="R", help="only worker (rank) R")
    p.add_argument("--tail", type=NONNEG_INT, default=0, metavar="N", help="only the last N lines of each")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate import rpc

    try:
        logs = scheduler_client(args).logs(args.job, args.worker)
    except rpc.RpcError as exc:
        return client_failure("logs", exc)
    if not logs:
        which = f"worker {args.worker} of job {args.job}" if args.worker is not None else f"job {args.job}"
        return fail("logs", f"no log yet for {which} (it has not started)", 1)
    rc = 0
    for ref in logs:
        if len(logs) > 1:
            print(f"==> worker {ref.rank} on {ref.node_id}: {ref.path} <==")
        try:
            with open(ref.path, errors="replace") as f:
                lines = f.readlines()
        except OSError as exc:
            rc = fail("logs", f"cannot read {ref.path} (worker {ref.rank} on {ref.node_id}): {exc.strerror}; "
                      "logs are read from a shared filesystem", 1)
            continue
        sys.stdout.writelines(lines[-args.tail:] if args.tail else lines)
    return rc
