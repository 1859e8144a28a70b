"""``colocate run [options] -- CMD ...``: run a command as a co-located job."""

from __future__ import annotations

import argparse
import sys

from colocate.base.env import DEVICE_CHOICES, LOG_LEVELS, ON_CAP, parse_gpus
from colocate.base.vocab import JOB_CLASSES, JobClass, OnCap
from colocate.cli._common import ENDPOINT, MEMORY, NONNEG_INT, POSITIVE_INT, SHARE, argtype

GPU_LIST = argtype(parse_gpus, "gpus")
ONE_GPU = argtype(lambda text: (NONNEG_INT(text),), "index")



EPILOG = """\
examples:
  colocate run --gpu-mem 2GiB --sm-share 0.5 -- python train.py --epochs 3
  colocate run --priority opportunistic --on-cap error --stats-file s.json -- python -m mypkg.train
  colocate run --node ipc:///tmp/colocate-$UID/node.sock --gpus 1 -- python train.py
  colocate run --gpus 0,1 -- torchrun --nproc-per-node 2 train.py
  colocate run --node ipc:///tmp/colocate-$UID/node.sock --partition --sm-share 0.5 --gpu-mem 8GiB -- python train.py

--gpus lists the job's GPUs. A job of several processes (torchrun's workers) is one job:
the worker with LOCAL_RANK=i runs on GPU number i of the list (its cuda:i; on CUDA,
CUDA_VISIBLE_DEVICES lists the job's GPUs in this order), and under a node it registers
as JOB/RANK on its own GPU.

The command is not modified: every Python process it starts gets the runtime
through an injected sitecustomize and the COLOCATE_* variables (`colocate env`).
Under a node (--node), --gpu-mem and --sm-share are the job's request: the node's
policy never gives the job more than them (it may give less to an opportunistic job).
Exit code: the command's own (128+N if it died of signal N); 2 on bad options; 127 when the command is not found
and 126 when it cannot be run, as a shell says.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a training command under the co-location runtime",
        description="Run an unmodified training command with a GPU memory cap and a compute share "
        "that can change while it runs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                   help="device kind: cuda, sim (a simulated GPU on one CPU core), or auto (cuda when available; default)")
    p.add_argument("--gpus", type=GPU_LIST, default=(0,), metavar="LIST",
                   help="the job's GPUs, comma-separated indices, e.g. 0,1 (default 0); a torchrun worker with "
                        "LOCAL_RANK=i uses GPU number i of the list")
    p.add_argument("--gpu", dest="gpus", type=ONE_GPU, metavar="INDEX", help="one GPU: the same as --gpus INDEX")
    p.add_argument("--gpu-mem", type=MEMORY, default=None, metavar="SIZE",
                   help="device memory cap, e.g. 2GiB, 512MiB, 4GB (default: the whole device); under a node, "
                        "the most the node will give")
    p.add_argument("--sm-share", type=SHARE, default=1.0, metavar="F",
                   help="compute share 0..1 (0, with --node only: paused until the node's operator raises it): the "
                        "job's device busy fraction is held at or below F (default 1); under a node, the most the "
                        "node will give")
    p.add_argument("--priority", choices=JOB_CLASSES, default=JobClass.GUARANTEED,
                   help="guaranteed (default) or opportunistic")
    p.add_argument("--partition", action="store_true",
                   help="guaranteed only: hold a fixed partition of the GPU, --gpu-mem and --sm-share, which the "
                        "node never changes; several partitions share a GPU while their shares sum to at most 1 "
                        "and their caps to at most its memory (a partition that does not fit exits with one line)")
    p.add_argument("--on-cap", choices=ON_CAP, default=OnCap.HOST,
                   help="over the memory cap: serve from host memory (default) or stop with an error")
    p.add_argument("--job-id", default=None, help="job identifier (default: job-<launcher pid>)")
    p.add_argument("--stats-file", default=None, metavar="PATH",
                   help="write a JSON summary of the job here at exit (iterations, busy fraction, memory peaks)")
    p.add_argument("--node", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="node coordinator endpoint to register with (e.g. ipc:///tmp/colocate-$UID/node.sock)")
    p.add_argument("--sim-gpu-mem", type=MEMORY, default=None, metavar="SIZE",
                   help="sim only: total memory of the simulated GPU (default 16GiB)")
    p.add_argument("--iterations", type=POSITIVE_INT, default=None, metavar="N",
                   help="the job's total mini-batches, if known: reported to the node and scheduler (COLOCATE_ITERATIONS)")
    p.add_argument("--epochs", type=POSITIVE_INT, default=None, metavar="E",
                   help="the job's epochs, if known: the total is then len(DataLoader) x E (COLOCATE_EPOCHS)")
    p.add_argument("--log", default="warning", choices=LOG_LEVELS, help="runtime log level inside the job")
    p.add_argument("--exit-file", default=None, metavar="PATH",
                   help="write the exit code to PATH when the command ends (how `colocate node` learns the exit "
                        "code of a worker it re-adopted after a restart)")
    p.add_argument("--lease-file", default=None, metavar="PATH",
                   help="a node's lease file (`colocate node` sets it for the workers it places): when the lease "
                        "lapses, the command's process group gets SIGTERM, then SIGKILL after the lease's grace")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.gpus import resolve
    from colocate.launcher import LaunchError, RunSpec, check_exit_file, launch, write_exit_file

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        if args.partition and (args.gpu_mem is None or args.priority != JobClass.GUARANTEED):
            raise LaunchError("--partition needs --gpu-mem and a guaranteed job")
        if args.sm_share == 0 and not args.node:  # nothing could ever raise it: the job would wait for ever
            raise LaunchError("--sm-share 0 pauses the job until a node's operator raises its share: give --node "
                              "ENDPOINT, or a share above 0")
        spec = RunSpec(
            command=tuple(command), device=resolve(args.device), gpus=tuple(args.gpus), gpu_mem=args.gpu_mem,
            sm_share=args.sm_share, klass=args.priority, on_cap=args.on_cap, stats_file=args.stats_file,
            job_id=args.job_id, node=args.node, sim_gpu_mem=args.sim_gpu_mem, log=args.log, exit_file=args.exit_file,
            lease_file=args.lease_file, partition=args.partition, iterations=args.iterations, epochs=args.epochs,
        )
        return launch(spec)
    except (LaunchError, ValueError) as exc:
        print(f"colocate run: error: {exc}", file=sys.stderr)
        code = exc.code if isinstance(exc, LaunchError) else 2
        try:
            check_exit_file(args.exit_file)
        except LaunchError:
            return code  # the exit file itself is what was refused: said once above
        write_exit_file(args.exit_file, code)
        return code
