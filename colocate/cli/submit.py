"""``colocate submit``: hand a job to the scheduler; prints its id."""

from __future__ import annotations

import argparse

from colocate.cli._common import (
    DURATION,
    POSITIVE_INT,
    SIZE,
    add_scheduler_options,
    client_failure,
    fail,
    scheduler_client,
)
from colocate.env import PRIORITIES
from colocate.vocab import Priority

EPILOG = """\
examples:
  colocate submit --gpus 1 -- python train.py --epochs 3
  colocate submit --name ddp --gpus 1 --workers 4 --estimate 2h -- python train_ddp.py
  colocate submit --gpus 1 --gpu-mem 4GiB --priority opportunistic --queue research -- python sweep.py

The job runs in this working directory with this environment (minus COLOCATE_* variables):
a shared filesystem is assumed, as with Slurm. A variable over 64 KiB, or an environment that
makes the request over 1 MiB, is refused before anything is sent (never silently dropped).
Each worker is one process with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...): submit the script itself, not torchrun. --gpus is per worker.
--priority is guaranteed unless given.
Exit code: 0 submitted (the job id is printed); 2 a bad request (nothing was submitted);
1 the scheduler did not answer.
"""


def register(sub) -> None:
    p = sub.add_parser("submit", help="submit a job to the scheduler (prints its id)",
                       description="Submit a job: a gang of workers, each with its GPUs, run on the cluster's nodes.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="", help="job name (default: the program's name)")
    p.add_argument("--gpus", type=POSITIVE_INT, required=True, metavar="G", help="GPUs per worker (>= 1)")
    p.add_argument("--workers", type=POSITIVE_INT, default=1, metavar="W", help="workers in the gang (default 1)")
    p.add_argument("--gpu-mem", type=SIZE, default=0, metavar="SIZE",
                   help="GPU memory per GPU, e.g. 8GiB (opportunistic: its ceiling; default: not stated)")
    p.add_argument("--priority", choices=PRIORITIES, default=Priority.GUARANTEED,
                   help="guaranteed: reserved GPUs (the default); opportunistic: idle capacity, may be preempted")
    p.add_argument("--queue", default="", help="queue (default: the policy's choice)")
    p.add_argument("--estimate", type=DURATION, default=None, metavar="DURATION",
                   help="expected run time, e.g. 45m, 2h, 1:30:00 (lets backfill start it early)")
    add_scheduler_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command of each worker")
    p.set_defaults(func=main)


def main(args) -> int:
    from cluster.client import request_from_here
    from colocate import rpc
    from colocate.launcher import LaunchError, check_command

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        check_command(tuple(command), None)
    except LaunchError as exc:
        return fail("submit", f"error: {str(exc).replace('colocate run', 'colocate submit')}", 2)
    try:
        request = request_from_here(command, workers=args.workers, gpus=args.gpus, gpu_mem=args.gpu_mem,
                                    priority=args.priority, queue=args.queue, name=args.name,
                                    estimate_s=args.estimate)
    except ValueError as exc:
        return fail("submit", f"error: {exc}", 2)
    try:
        job_id = scheduler_client(args).submit(request)
    except rpc.RpcError as exc:
        return client_failure("submit", exc)
    print(job_id)
    return 0
