"""``colocate logs JOB [--worker R] [--tail N]``: the output of a job's workers (latest placement)."""

from __future__ import annotations

import sys

from colocate.cli._common import (
    JOB_ID,
    POSITIVE_INT,
    RANK,
    add_scheduler_options,
    client_failure,
    fail,
    scheduler_client,
)


def register(sub) -> None:
    p = sub.add_parser("logs", help="print a job's worker output",
                       description="Print the end of each worker's log (stdout and stderr) of the job's latest "
                       "placement, as the node that ran it reads it (at most 64 KiB a worker; less for large "
                       "gangs), relayed by the scheduler. Exit code: 0; 1 unknown job or worker, no log yet, "
                       "a node down or silent, or no answer; 2 a bad job id or option.")
    p.add_argument("job", type=JOB_ID, metavar="JOB")
    p.add_argument("--worker", type=RANK, default=None, metavar="R", help="only worker (rank) R")
    p.add_argument("--tail", type=POSITIVE_INT, default=None, metavar="N",
                   help="only the last N lines of each (N >= 1; default: all the node sends)")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.clients import rpc

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
            print(f"==> worker {ref.rank} on {ref.node_id} <==")
        if ref.error:
            rc = fail("logs", f"worker {ref.rank}: {ref.error}", 1)
            continue
        if ref.truncated and not args.tail:
            print(f"colocate logs: worker {ref.rank}: earlier output left out (its log is on node {ref.node_id})",
                  file=sys.stderr)
        lines = ref.text.splitlines(keepends=True)
        if ref.truncated and lines:
            lines = lines[1:]  # the first line is cut
        sys.stdout.writelines(lines[-args.tail:] if args.tail else lines)
    sys.stdout.flush()
    return rc
