"""``colocate ray start [options] [ray start options]`` / ``colocate ray stop``: a Ray node with colocate.

``start`` runs a ``colocate node`` and, once it answers, ``ray start --block`` with the ``colocate``
runtime_env plugin registered (``RAY_RUNTIME_ENV_PLUGINS``), the node's endpoint and device in its environment
(``colocate.ray.node.node_environment``) and the per-node ``colocate_opportunistic`` resource advertised. Options
it does not know go to ``ray start`` as they are. Without ``--block`` both run in the background, their process
ids in ``STATE_DIR/ray.json``, and the command returns once Ray has started; with ``--block`` it stays in the
foreground (systemd, a KubeRay container) and SIGTERM stops both. ``stop`` stops the two processes it recorded,
by process id (SIGTERM, SIGKILL after a grace), Ray first. Exit codes: 0 done, 1 a start failed (one line, the
log named), 2 bad options.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from colocate.cli._common import ENDPOINT, add_device_options

EPILOG = """\
examples:
  colocate ray start --head --port 6379                      # a head node (GPUs: Ray's and NVML's)
  colocate ray start --address HEAD:6379                     # a worker node
  colocate ray start --device sim --sim-gpus 2 --head --node-ip-address 127.0.0.1   # simulated GPUs
  colocate ray start --block --address HEAD:6379             # in the foreground (systemd, KubeRay)
  colocate ray stop

Then ask for colocate in a task's runtime_env (docs/ray.md):
  @ray.remote(**colocate.ray.options(num_gpus=0.5))
"""

def register(sub) -> None:
    p = sub.add_parser("ray", help="run a Ray node with colocate (start / stop)",
                       description="A Ray node whose fractional GPUs are enforced: a colocate node beside the "
                       "raylet, and Ray's runtime_env plugin `colocate`.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = p.add_subparsers(dest="ray_action", metavar="ACTION")
    s = acts.add_parser("start", help="start a colocate node and `ray start` (other options go to `ray start`)",
                        description="Start a colocate node (the node coordinator of this machine's GPUs), wait until "
                        "it answers, then `ray start` with the runtime_env plugin `colocate` registered and the "
                        "`colocate_opportunistic` resource advertised. Options this command does not know go to "
                        "`ray start` unchanged.",
                        allow_abbrev=False, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_options(s, "sim: simulated GPUs, also Ray's --num-gpus unless given (default 1)")
    s.add_argument("--endpoint", default=None, type=ENDPOINT,
                   help="the colocate node's job endpoint (default: the node's default, where `colocate top` looks)")
    s.add_argument("--opportunistic-slots", type=int, default=None, metavar="N",
                   help="units of the colocate_opportunistic resource this node advertises (default: one per GPU)")
    s.add_argument("--state-dir", default=None, metavar="DIR",
                   help="process ids and logs (default: $XDG_STATE_HOME/colocate/ray)")
    s.add_argument("--block", action="store_true", help="stay in the foreground; SIGTERM stops both")
    s.set_defaults(func=main, passthrough=True)
    t = acts.add_parser("stop", help="stop what `colocate ray start` started (by process id)",
                        description="Stop what `colocate ray start` started on this machine: `ray stop`, then the "
                        "colocate node, by the process ids in the state folder.")
    t.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where `colocate ray start` wrote its process ids (default: $XDG_STATE_HOME/colocate/ray)")
    t.set_defaults(func=main)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.ray.launch import Interrupted, NodeSetup, StartFailed, start, stop

    state_dir = args.state_dir if getattr(args, "state_dir", None) else default_state_dir()
    if args.ray_action == "stop":
        print(stop(state_dir))
        return 0
    if args.ray_action != "start":
        print("colocate ray: give an action: start or stop", file=sys.stderr)
        return 2
    try:
        setup = NodeSetup.from_args(args, list(getattr(args, "extra", [])), state_dir)
        return start(setup, block=args.block, out=sys.stdout)
    except ValueError as exc:
        print(f"colocate ray start: error: {exc}", file=sys.stderr)
        return 2
    except StartFailed as exc:
        print(f"colocate ray start: {exc}", file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"colocate ray start: interrupted ({signal.Signals(signum).name}) while starting: stopped what it had "
              "started", file=sys.stderr)
        return 128 + signum


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "colocate", "ray")

