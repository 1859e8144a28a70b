"""``colocate recommend -- CMD ...`` / ``colocate recommend JOB``: what the scheduler's history says a job should get
(memory cap, compute share, GPU count, GPU type, run time), each figure with the history level and runs behind it."""

from __future__ import annotations

import argparse
import json

from colocate.cli._common import (
    JOB_ID,
    NODE_GPUS,
    WORKERS,
    add_scheduler_options,
    client_failure,
    fail,
    scheduler_client,
)

EPILOG = """\
examples:
  colocate recommend -- python train.py --batch-size 64 --width 512
  colocate recommend 42                     # job 42, as it was submitted (your job, or any as an operator)
  colocate submit --gpus 1 --gpu-mem auto --sm-share auto -- python train.py --batch-size 64

The command is fingerprinted as `colocate submit` would (the user of your key, the entry script's content
hash, its arguments without seeds, output paths or timestamps): the same job again (exact level), or the
same script and arguments with other numbers (family level: a sweep). `python -m pkg` and `python -c` are
not hashed: their module name or code and the arguments stand for them.
A command is checked as `colocate submit` checks it (the program, and a python script, must exist here).
Exit code: 0 (figures it cannot give say why); 1 unknown job, another user's job, or no answer; 2 bad input.
"""

IDENTITY = {"content": "the entry script's content and its arguments",
            "path": "the script's path and its arguments (the script could not be read here: not hashed)",
            "module": "the module's name and its arguments (python -m: its code is not hashed)",
            "code": "the -c code and its arguments",
            "program": "the program's name and its arguments (not hashed)",
            "stdin": "its arguments (a script on standard input)"}


def register(sub) -> None:
    p = sub.add_parser("recommend", help="what a job should get, from the history of the same job and its family",
                       description="Recommend a job's GPU memory cap, compute share, GPU count and GPU type, and "
                       "predict its run time, from the history of the same job and of its family.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=NODE_GPUS, default=None, metavar="G",
                   help="GPUs per worker (default 1, at most 64; a job id: the job's own)")
    p.add_argument("--workers", type=WORKERS, default=None, metavar="W",
                   help="workers in the gang (default 1, at most 4096; a job id: the job's own)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_scheduler_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="JOB | -- CMD ...",
                   help="a job id, or the command a submit would run")
    p.set_defaults(func=main, parser=p)


def lines(r) -> list[tuple[str, str]]:
    """What ``colocate recommend`` prints of a ``RecommendationView``: one line per figure."""
    from colocate.base.units import format_duration, format_size

    why = dict(r.why_not)

    def behind(f) -> str:
        if f.level == "speed":
            return "(by the types' declared speeds: no run measured)"
        return f"({f.history} run(s), {f.level} level)"

    out = [("fingerprint", f"exact {r.exact}, family {r.family}: {IDENTITY.get(r.identity, r.identity)}")]
    out.append(("gpu memory", f"{format_size(int(r.gpu_mem.value))} per GPU {behind(r.gpu_mem)}" if r.gpu_mem
                else f"none: {why.get('gpu_mem', '?')}"))
    out.append(("compute share", f"{r.sm_share.value:.2f} {behind(r.sm_share)}" if r.sm_share
                else f"none: {why.get('sm_share', '?')}"))
    out.append(("gpu count", f"{int(r.gpus.value)} {behind(r.gpus)}" if r.gpus
                else f"none: {why.get('gpus', '?')}"))
    if r.gpu_type is not None:
        t = r.gpu_type  # its value: seconds per iteration; 0 when the type was chosen by run time (or speed)
        if t.level == "speed":
            per = ""
        elif t.value:
            per = f", predicted {t.value * 1e3:.1f} ms per iteration"
        else:
            per = ", the fastest by run time (no run reported its time per iteration)"
        out.append(("gpu type", f"{t.label}{per} {behind(t)}"))
    else:
        out.append(("gpu type", f"none: {why.get('gpu_type', '?')}"))
    rt = r.run_time
    out.append(("run time", f"p50 {format_duration(rt.p50_s)}, p90 {format_duration(rt.p90_s)} ({rt.history} run(s), "
                            f"{rt.level} level)" if rt else f"unknown: {why.get('run_time', '?')}"))
    return out


def main(args) -> int:
    from colocate.clients import rpc
    from colocate.protocol import record_map

    command = list(args.command)
    job_id = None
    if len(command) > 1 and command[0] != "--":  # `recommend JOB --scheduler ...`: the job's options came after it
        args = args.parser.parse_args(command[1:], namespace=args)
        if args.command:
            return fail("recommend", "error: after a job id, only options (a command goes after --: colocate "
                        "recommend -- python train.py ...)", 2)
        command = command[:1]
    if command and command[0] == "--":
        command = command[1:]
    elif len(command) == 1:
        try:
            job_id = JOB_ID(command[0])
        except argparse.ArgumentTypeError as exc:
            return fail("recommend", f"error: {exc}", 2)
        command = []
    if not command and job_id is None:
        return fail("recommend", "error: give a job id, or the command after -- (colocate recommend -- python "
                    "train.py ...)", 2)
    if job_id is not None and (args.gpus is not None or args.workers is not None):
        return fail("recommend", "error: a job is recommended for as it was submitted (its own --gpus and --workers): "
                    "give them with a command after -- instead", 2)
    if command:
        from colocate.launcher import LaunchError, check_command

        try:
            check_command(tuple(command), None)  # what `colocate submit` refuses, refused alike
        except LaunchError as exc:
            return fail("recommend", f"error: {exc}", 2)
    try:
        rec = scheduler_client(args).recommend(job_id=job_id, command=command, workers=args.workers or 1,
                                               gpus=args.gpus or 1)
    except rpc.RpcError as exc:
        return client_failure("recommend", exc)
    if args.json:
        print(json.dumps(record_map(rec), indent=2))
        return 0
    rows = lines(rec)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:>{width}}: {v}")
    return 0
