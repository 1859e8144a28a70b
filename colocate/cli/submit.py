"""``colocate submit``: hand a job to the scheduler (prints its id), or every job of a file (``--file``) over
one connection.

The file (``--file FILE``, ``-`` for stdin) is JSON Lines: one job per line, a JSON object with
``command`` (a non-empty list of strings) and any of ``gpus``, ``workers``, ``gpu_mem`` (bytes, a
size such as ``"4GiB"``, or ``"auto"``), ``sm_share`` (0.01..1 or ``"auto"``), ``gpu_model``, ``priority``, ``queue``,
``name``, ``estimate`` (seconds or a duration such as ``"2h"``), ``iterations``, ``epochs``; what a line leaves out comes from the command line's options. Blank lines and lines
starting with ``#`` are skipped. Every line is checked before anything is sent: any bad line is
reported (``FILE:LINE: why``, one line each) and nothing is submitted (exit 2). Then the jobs are
submitted in order, each id printed on its own line as it is acknowledged; if one fails, the line
says which, how many were submitted before it, and that none after it was (exit 1, or 2 if the
scheduler found it invalid).
"""

from __future__ import annotations

import argparse

from colocate.base.vocab import JOB_CLASSES, JobClass
from colocate.cli._common import (
    DURATION,
    POSITIVE_INT,
    add_scheduler_options,
    argtype,
    client_failure,
    fail,
    scheduler_client,
)

EPILOG = """\
examples:
  colocate submit --gpus 1 --epochs 3 -- python train.py --epochs 3
  colocate submit --name ddp --gpus 1 --workers 4 --estimate 2h -- python train_ddp.py
  colocate submit --gpus 1 --gpu-mem 4GiB --priority opportunistic -- python sweep.py
  colocate submit --gpus 1 --queue research -- python sweep.py   # a queue the scheduler's policy defines
  colocate submit --gpus 1 --gpu-mem auto --sm-share auto -- python train.py --batch-size 64
  colocate submit --gpus 2 --gpu-model 'V100|A100' -- python train.py   # only on nodes of these GPU models
  colocate submit --gpus 1 --file sweep.jsonl   # one job per line: {"command": ["python", "sweep.py", "--lr", "0.1"]}

The job runs in this working directory with this environment (minus COLOCATE_* variables):
a shared filesystem is assumed, as with Slurm. A variable over 64 KiB, or an environment that
makes the request over 960 KiB, is refused before anything is sent (never silently dropped).
Each worker is one process with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...): submit the script itself, not torchrun. --gpus is per worker.
--priority is guaranteed unless given.
--gpu-mem auto / --sm-share auto: the job gets what the history of the same job (or of its family: the same
script and arguments with other numbers) recommends (colocate recommend shows it); a job that runs out of
memory under a recommended cap is restarted at the whole GPU, not counted as its failure; with no history it
runs as requested and is marked "learning" (colocate status). A site may make auto the default for what a
submit does not state (the policy's [scheduler] auto = ["gpu_mem", "sm_share"]).
--file FILE submits one job per line of FILE (JSON Lines: "command" and any of "gpus", "workers",
"gpu_mem", "sm_share", "gpu_model", "priority", "queue", "name", "estimate", "iterations", "epochs"; the options above
are the defaults) over one
connection; every line is checked here first, and a bad line submits nothing. A line the scheduler then
refuses (an unknown queue, a request no node could hold) stops the file there: the jobs of the lines before it
were submitted (their ids are printed), none from it on.
Exit code: 0 submitted (the job id is printed); 2 a bad request (nothing was submitted);
1 the scheduler did not answer, or refused this key (forbidden) or could not take it now (unavailable);
3 --file: some jobs were submitted, then a line was refused or the scheduler stopped answering (the message
names the line; resubmit from it).
"""

FIELDS = ("command", "gpus", "workers", "gpu_mem", "sm_share", "gpu_model", "priority", "queue", "name", "estimate",
          "iterations", "epochs")
AUTO = "auto"
PARTLY = 3  # exit code: --file submitted some of its jobs, not all


MIN_GPU_MEM = 1 << 20  # a stated GPU memory below 1 MiB is a typo (a unit left out), not a cap


def _size_or_auto(text) -> int | str:
    """``auto``, 0 (not stated: the whole GPU), or a size of at least ``MIN_GPU_MEM``; ValueError else."""
    from colocate.base.units import parse_size

    if text == AUTO:
        return AUTO
    size = parse_size(text)
    if 0 < size < MIN_GPU_MEM:
        raise ValueError(f"{size} bytes is below 1 MiB: give a unit (e.g. 8GiB), or 0 for the whole GPU")
    return size


def _share_or_auto(text) -> float | str:
    if text == AUTO:
        return AUTO
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"must be a share 0.01..1 or auto, got {str(text)[:40]!r}") from None
    if not 0.01 <= value <= 1:
        raise ValueError(f"must be a share 0.01..1 or auto, got {text}")
    return value


def _gpu_model(text) -> str:
    """A GPU model constraint (``P.gpu_model_problem``): one model, or several joined by ``|``."""
    from colocate import protocol as P

    why = P.gpu_model_problem(text)
    if why:
        raise ValueError(why)
    return text.strip()


GPU_MODEL = argtype(_gpu_model, "GPU model")
SIZE_OR_AUTO = argtype(_size_or_auto, "size")
SHARE_OR_AUTO = argtype(_share_or_auto, "share")


def resources(gpu_mem, sm_share) -> dict:
    """``request_from_here``'s gpu_mem, sm_share and auto from what the user said (a value, ``auto`` or none)."""
    auto = tuple(name for name, v in (("gpu_mem", gpu_mem), ("sm_share", sm_share)) if v == AUTO)
    return {"gpu_mem": 0 if gpu_mem == AUTO else gpu_mem, "sm_share": None if sm_share == AUTO else sm_share,
            "auto": auto}


def register(sub) -> None:
    p = sub.add_parser("submit", help="submit a job to the scheduler (prints its id)",
                       description="Submit a job: a gang of workers, each with its GPUs, run on the cluster's nodes.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="", help="job name (default: the program's name)")
    p.add_argument("--gpus", type=POSITIVE_INT, default=None, metavar="G",
                   help="GPUs per worker (>= 1; required, unless each line of --file gives it)")
    p.add_argument("--workers", type=POSITIVE_INT, default=1, metavar="W", help="workers in the gang (default 1)")
    p.add_argument("--gpu-mem", type=SIZE_OR_AUTO, default=0, metavar="SIZE|auto",
                   help="GPU memory per GPU, e.g. 8GiB (opportunistic: its ceiling; default: not stated); auto: "
                        "its recommendation from the history of this job and its family (colocate recommend); 0: not stated, "
                        "the whole GPU; at least 1MiB otherwise")
    p.add_argument("--sm-share", type=SHARE_OR_AUTO, default=None, metavar="F|auto",
                   help="compute share of each GPU, 0.01..1 (default: the whole GPU); auto: its recommendation")
    p.add_argument("--gpu-model", type=GPU_MODEL, default="", metavar="MODEL",
                   help="only GPUs of this model, as `colocate nodes` lists them, or of one of several: 'V100|A100' "
                        "(default: any). A node of several models (V100+T4) takes no job that names a model")
    p.add_argument("--priority", choices=JOB_CLASSES, default=JobClass.GUARANTEED,
                   help="guaranteed: reserved GPUs (the default); opportunistic: idle capacity, may be preempted")
    p.add_argument("--queue", default="", help="queue (default: the policy's choice)")
    p.add_argument("--estimate", type=DURATION, default=None, metavar="DURATION",
                   help="expected run time, e.g. 45m, 2h, 1:30:00 (lets backfill start it early)")
    p.add_argument("--iterations", type=POSITIVE_INT, default=None, metavar="N",
                   help="the job's total mini-batches, if known (progress and run-time prediction use it; not "
                   "with --epochs)")
    p.add_argument("--epochs", type=POSITIVE_INT, default=None, metavar="E",
                   help="the job's epochs, if known: its total is len(DataLoader) x E, as the job sees it")
    p.add_argument("--file", default=None, metavar="FILE",
                   help="submit every job of FILE (JSON Lines, one job per line; - for stdin) over one connection")
    add_scheduler_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command of each worker")
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.clients import rpc
    from colocate.clients.scheduler import request_from_here
    from colocate.launcher import LaunchError, check_command

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.file is not None:
        if command:
            return fail("submit", "error: give the jobs' commands in --file or one command after --, not both", 2)
        return submit_file(args)
    if args.gpus is None:
        return fail("submit", "error: --gpus is required (GPUs per worker)", 2)
    if args.iterations is not None and args.epochs is not None:
        return fail("submit", "error: give --iterations or --epochs, not both (the total is one or the other)", 2)
    try:
        check_command(tuple(command), None)
    except LaunchError as exc:
        return fail("submit", f"error: {str(exc).replace('colocate run', 'colocate submit')}", 2)
    try:
        request = request_from_here(command, workers=args.workers, gpus=args.gpus, priority=args.priority,
                                    queue=args.queue, name=args.name, estimate_s=args.estimate,
                                    iterations=args.iterations, epochs=args.epochs, gpu_model=args.gpu_model,
                                    **resources(args.gpu_mem, args.sm_share))
    except ValueError as exc:
        return fail("submit", f"error: {exc}", 2)
    try:
        job_id = scheduler_client(args).submit(request)
    except rpc.RpcError as exc:
        return client_failure("submit", exc)
    print(job_id)
    return 0


def _entry(line: str, args, environ: dict):
    """The ``JobRequest`` of one line of a jobs file; ``ValueError`` (one line) if it is not one."""
    import json

    from colocate.base.units import parse_duration
    from colocate.clients.scheduler import request_from_here
    from colocate.launcher import LaunchError, check_command

    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(d, dict):
        raise ValueError("expected a JSON object, e.g. {\"command\": [\"python\", \"train.py\"], \"gpus\": 1}")
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0][:40]!r} (fields: {', '.join(FIELDS)})")
    command = d.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise ValueError("\"command\" must be a non-empty list of strings")
    try:
        check_command(tuple(command), None)
    except LaunchError as exc:
        raise ValueError(str(exc).replace("colocate run", "colocate submit")) from None
    ints: dict[str, int] = {}
    hints: dict[str, int | None] = {}  # the total's: absent is None
    total_on_line = "iterations" in d or "epochs" in d  # a line's total replaces the options' (both keys)
    for key in ("gpus", "workers", "iterations", "epochs"):
        value = d.get(key) if key in ("iterations", "epochs") and total_on_line else d.get(key, getattr(args, key))
        if key == "gpus" and value is None:
            raise ValueError("no \"gpus\" (give it on the line or --gpus)")
        if value is None and key in ("iterations", "epochs"):
            hints[key] = None
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"\"{key}\" must be a whole number >= 1, not {value!r:.40}")
        if key in ("iterations", "epochs"):
            hints[key] = value
        else:
            ints[key] = value
    if hints["iterations"] is not None and hints["epochs"] is not None:
        raise ValueError("give \"iterations\" or \"epochs\", not both (the total is one or the other)")
    for key in ("priority", "queue", "name", "gpu_model"):
        if key in d and not isinstance(d[key], str):
            raise ValueError(f"\"{key}\" must be a string")
    gpu_model = _gpu_model(d["gpu_model"]) if "gpu_model" in d else args.gpu_model
    priority = d.get("priority", args.priority)
    if priority not in JOB_CLASSES:
        raise ValueError(f"\"priority\" must be one of {', '.join(JOB_CLASSES)}, not {priority[:40]!r}")
    gpu_mem = _size_or_auto(d["gpu_mem"]) if "gpu_mem" in d else args.gpu_mem
    share = d.get("sm_share", args.sm_share)
    if share is not None and share != AUTO and (isinstance(share, bool) or not isinstance(share, (int, float))):
        raise ValueError(f"\"sm_share\" must be a share 0.01..1 or \"auto\", not {share!r:.40}")
    share = _share_or_auto(str(share)) if share is not None else None
    estimate = parse_duration(d["estimate"]) if d.get("estimate") is not None else args.estimate
    return request_from_here(command, workers=ints["workers"], gpus=ints["gpus"], priority=priority,
                             queue=d.get("queue", args.queue), name=d.get("name", args.name), estimate_s=estimate,
                             iterations=hints["iterations"], epochs=hints["epochs"], environ=environ,
                             gpu_model=gpu_model, **resources(gpu_mem, share))


def _read_lines(path: str) -> list[str]:
    import sys

    if path == "-":
        return sys.stdin.read().splitlines()
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def submit_file(args) -> int:
    """Every job of ``args.file``, checked first, then submitted in order over one connection."""
    import os

    from colocate import protocol as P
    from colocate.clients import rpc

    try:
        lines = _read_lines(args.file)
    except (OSError, UnicodeDecodeError) as exc:
        return fail("submit", f"error: cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}", 2)
    environ = dict(os.environ)
    jobs, bad = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            jobs.append((number, _entry(line, args, environ)))
        except ValueError as exc:
            bad += 1
            fail("submit", f"error: {args.file}:{number}: {exc}", 2)
    if bad:
        return fail("submit", f"error: {bad} bad line(s) in {args.file}: nothing was submitted", 2)
    if not jobs:
        return fail("submit", f"error: {args.file} has no job (one JSON object per line)", 2)
    done = 0
    with scheduler_client(args) as client:
        for number, request in jobs:
            try:
                job_id = client.submit(request)
            except rpc.RpcError as exc:
                invalid = isinstance(exc, rpc.BadEndpoint) or getattr(exc, "code", None) == P.INVALID
                code = PARTLY if done else 2 if invalid else 1
                return fail("submit", f"error: {args.file}:{number}: {exc}; {done} of {len(jobs)} job(s) were "
                            f"submitted (their ids are printed above), none from line {number} on", code)
            print(job_id, flush=True)
            done += 1
    return 0
