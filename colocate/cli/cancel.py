"""``colocate cancel JOB [JOB ...]``: cancel jobs (running workers get SIGTERM, then SIGKILL)."""

from __future__ import annotations

from colocate.cli._common import JOB_ID, add_scheduler_options, client_failure, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("cancel", help="cancel jobs", description="Cancel pending or running jobs. Exit code: 0 all "
                       "cancelled; 1 some were unknown, already finished, or the scheduler did not answer; "
                       "2 a bad job id.")
    p.add_argument("jobs", nargs="+", type=JOB_ID, metavar="JOB")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.clients import rpc

    try:
        client, rc = scheduler_client(args), 0
    except rpc.RpcError as exc:
        return client_failure("cancel", exc)
    for job_id in args.jobs:
        try:
            print(client.cancel(job_id))
        except rpc.RpcError as exc:
            client_failure("cancel", exc)
            rc = 1
    return rc
