"""``colocate ctl``: list a node's GPUs and jobs, and override a job's limits by hand.

    colocate ctl [--node ENDPOINT | --ctl ENDPOINT] list [--json]
    colocate ctl [--node ENDPOINT | --ctl ENDPOINT] set JOB_ID [--gpu-mem SIZE] [--sm-share F]

Talks to the node's operator endpoint (the job endpoint + ``.ctl`` unless ``--ctl`` names it).
Exit codes: 0 done; 1 the node did not answer or refused (one line on stderr); 2 bad arguments.
An override pins the job's cap and/or share until the job leaves the node.
"""

from __future__ import annotations

import argparse
import json
import sys

from colocate.cmd_run import _arg
from colocate.units import parse_fraction, parse_size

EPILOG = """\
examples:
  colocate ctl list
  colocate ctl --node ipc:///tmp/colocate/node.sock list --json
  colocate ctl set job-1234 --sm-share 0.3
  colocate ctl set job-1234 --gpu-mem 2GiB
"""


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and value < 3600):
        raise ValueError(f"must be a number of seconds in (0, 3600), got {text}")
    return value


def add_node_options(p: argparse.ArgumentParser) -> None:
    """``--node``/``--ctl``/``--timeout``, shared with ``colocate top``."""
    p.add_argument("--node", default=None, metavar="ENDPOINT",
                   help="the node's job endpoint (default: the one `colocate node` uses by default)")
    p.add_argument("--ctl", default=None, metavar="ENDPOINT",
                   help="the node's operator endpoint (default: the job endpoint + '.ctl')")
    p.add_argument("--timeout", type=_arg(_positive_seconds, "seconds"), default=2.0, metavar="S",
                   help="seconds to wait for the node's answer (default 2)")


def register(sub) -> None:
    p = sub.add_parser(
        "ctl", help="list a node's jobs or set a job's memory cap / compute share by hand",
        description="Operator commands for a running node coordinator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_node_options(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    lp = actions.add_parser("list", help="GPUs and jobs with their limits, usage and throughput")
    lp.add_argument("--json", action="store_true", help="machine-readable output")
    sp = actions.add_parser("set", help="pin a job's memory cap and/or compute share")
    sp.add_argument("job_id", metavar="JOB_ID")
    sp.add_argument("--gpu-mem", type=_arg(parse_size, "size"), default=None, metavar="SIZE",
                    help="memory cap, e.g. 2GiB or 512MiB")
    sp.add_argument("--sm-share", type=_arg(lambda t: parse_fraction(t, "--sm-share"), "share"), default=None,
                    metavar="F", help="compute share 0..1 (0 pauses the job at its next mini-batch)")
    p.set_defaults(func=run, _parser=p, _set_parser=sp)


def _fail(text: str, code: int = 1) -> int:
    print(f"colocate ctl: {text}", file=sys.stderr)
    return code


def run(args) -> int:
    from colocate import ctl_client as C
    from colocate import protocol as P

    if args.action is None:
        args._parser.print_usage(sys.stderr)
        return _fail("choose an action: list or set", 2)
    if args.action == "set" and args.gpu_mem is None and args.sm_share is None:
        args._set_parser.print_usage(sys.stderr)
        return _fail("set: give --gpu-mem and/or --sm-share", 2)
    try:
        endpoint = C.resolve_ctl_endpoint(args.node, args.ctl)
    except C.BadEndpoint as exc:
        return _fail(str(exc), 2)

    try:
        if args.action == "list":
            listing = C.list_jobs(endpoint, args.timeout)
            if args.json:
                print(json.dumps(C.listing_dict(listing), indent=2))
            else:
                print(render_listing(listing))
            return 0
        try:
            msg = P.CtlSet(job_id=args.job_id, mem_cap=args.gpu_mem, sm_share=args.sm_share)
        except P.ProtocolError as exc:
            return _fail(f"set: {exc}", 2)
        reply = C.request(endpoint, msg, args.timeout)
    except C.BadEndpoint as exc:
        return _fail(str(exc), 2)
    except C.CtlClientError as exc:
        return _fail(str(exc), 1)
    if isinstance(reply, P.CtlOk):
        print(reply.message)
        return 0
    if isinstance(reply, P.Error):
        return _fail(f"{reply.code}: {reply.message}", 1)
    return _fail(f"unexpected reply {reply.TYPE!r} from the node", 1)


def render_listing(listing) -> str:
    from colocate import ctl_client as C

    gpus = C.text_table(C.GPU_HEADERS, [C.gpu_columns(g, listing.jobs) for g in listing.gpus])
    if listing.jobs:
        jobs = C.text_table(C.JOB_HEADERS, [C.job_columns(j) for j in sorted(listing.jobs, key=lambda j: (j.gpu, j.job_id))])
    else:
        jobs = "no jobs"
    return f"{gpus}\n\n{jobs}"
