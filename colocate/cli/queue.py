"""``colocate queue``: pending and running jobs, squeue-like (queue order, why a job waits)."""

from __future__ import annotations

import time

from colocate.base.vocab import JobState
from colocate.cli._common import add_scheduler_options, client_failure, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("queue", help="pending and running jobs (like squeue)",
                       description="Jobs not finished yet: running ones with their nodes, pending ones with why "
                       "they wait (their queue position, or what blocks them); each with its predicted run time "
                       "(p50..p90; time left for a running one) and what is behind it (the history level and how "
                       "many runs, or its progress); 'learning' marks a job that left a resource to its "
                       "recommendation and runs as requested for want of history. Exit code: 0; 1 no answer.")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.base.units import format_duration
    from colocate.cli._tables import in_queue_order, prediction_cell, print_table
    from colocate.clients import rpc

    try:
        jobs, queued = scheduler_client(args).jobs(active_only=True)
    except rpc.RpcError as exc:
        return client_failure("queue", exc)
    now = time.time()
    jobs = in_queue_order(jobs)
    rows = [(j.job_id, j.name, j.user, j.queue, j.priority, j.state, f"{j.workers}x{j.gpus}",
             format_duration(now - (j.started_at or j.submitted_at)), prediction_cell(j.prediction, j.learning),
             ",".join(j.nodes) if j.state != JobState.PENDING else f"({j.reason})") for j in jobs]
    print_table(("JOBID", "NAME", "USER", "QUEUE", "CLASS", "STATE", "GPUS", "TIME", "PREDICTED [LEVEL N]",
                 "NODES(REASON)"), rows, right=("GPUS", "TIME"))
    if queued:
        print("pending per queue: " + ", ".join(f"{q} {n}" for q, n in sorted(queued.items())))
    return 0
