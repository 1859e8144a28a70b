"""``colocate ctl``: list a node's GPUs and jobs, and override a job's limits by hand.

    colocate ctl [--node ENDPOINT | --ctl ENDPOINT] list [--json]
    colocate ctl [--node ENDPOINT | --ctl ENDPOINT] set JOB_ID [--gpu-mem SIZE] [--sm-share F]
    colocate ctl [--node ENDPOINT | --ctl ENDPOINT] clear JOB_ID

Exit codes: 0 done; 1 the node did not answer or refused (one line on stderr); 2 bad arguments.
An override pins the job's cap and/or share until the job leaves the node, or until ``clear`` lifts it.
"""

from __future__ import annotations

import argparse
import json
import sys

from colocate.cli._common import SHARE, SIZE, add_node_options, fail

EPILOG = """\
examples:
  colocate ctl list
  colocate ctl --node ipc:///tmp/colocate-$UID/node.sock list --json
  colocate ctl set job-1234 --sm-share 0.3
  colocate ctl set job-1234 --gpu-mem 2GiB
  colocate ctl clear job-1234          (the node's policy decides its limits again)

Talks to the node's operator endpoint (the job endpoint + '.ctl' unless --ctl names it).
Exit code: 0 done; 1 the node did not answer or refused; 2 bad arguments.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "ctl", help="list a node's jobs, or set (and clear) a job's memory cap / compute share by hand",
        description="Operator commands for a running node coordinator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_node_options(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    lp = actions.add_parser("list", help="GPUs and jobs with their limits, usage and throughput",
                            description="List the node's GPUs and its jobs: each job's memory cap and compute "
                            "share, what it uses, and its throughput.")
    lp.add_argument("--json", action="store_true", help="machine-readable output")
    sp = actions.add_parser("set", help="pin a job's memory cap and/or compute share",
                            description="Pin a job's memory cap and/or compute share on this node until the job "
                            "leaves it (an operator override of the node's policy).")
    sp.add_argument("job_id", metavar="JOB_ID",
                    help="the job as `ctl list` shows it: a scheduler's job runs here as JOB/RANK (e.g. 3/0); its "
                         "bare id (3) names its worker when it has one on this node")
    sp.add_argument("--gpu-mem", type=SIZE, default=None, metavar="SIZE", help="memory cap, e.g. 2GiB or 512MiB")
    sp.add_argument("--sm-share", type=SHARE, default=None, metavar="F",
                    help="compute share 0..1 (0 pauses the job at its next mini-batch)")
    cp = actions.add_parser("clear", help="lift a job's overrides: the node's policy decides its limits again",
                            description="Lift every override `ctl set` put on a job: its node's policy decides its "
                            "memory cap and compute share again from its next plan.")
    cp.add_argument("job_id", metavar="JOB_ID", help="the job as `ctl list` shows it (or its bare scheduler id)")
    p.set_defaults(func=main, _parser=p, _set_parser=sp)


def main(args) -> int:
    from colocate import protocol as P
    from colocate.clients import node as C

    if args.action is None:
        args._parser.print_usage(sys.stderr)
        return fail("ctl", "choose an action: list, set or clear", 2)
    if args.action == "set" and args.gpu_mem is None and args.sm_share is None:
        args._set_parser.print_usage(sys.stderr)
        return fail("ctl", "set: give --gpu-mem and/or --sm-share", 2)
    try:
        endpoint = C.resolve_ctl_endpoint(args.node, args.ctl)
        if args.action == "list":
            listing = C.list_jobs(endpoint, args.timeout)
            if args.json:
                print(json.dumps(C.listing_dict(listing), indent=2))
            else:
                print_listing(listing)
            return 0
        try:
            if args.action == "clear":
                msg = P.CtlSet(job_id=args.job_id, clear=True)
            else:
                msg = P.CtlSet(job_id=args.job_id, mem_cap=args.gpu_mem, sm_share=args.sm_share)
        except P.ProtocolError as exc:
            return fail("ctl", f"{args.action}: {exc}", 2)
        reply = C.request(endpoint, msg, args.timeout)
    except C.BadEndpoint as exc:
        return fail("ctl", str(exc), 2)
    except C.CtlClientError as exc:
        return fail("ctl", str(exc), 1)
    if isinstance(reply, P.CtlOk):
        print(reply.message)
        return 0
    if isinstance(reply, P.Error):
        return fail("ctl", f"{reply.code}: {reply.message}", 1)
    return fail("ctl", f"unexpected reply {reply.TYPE!r} from the node", 1)


def print_listing(listing) -> None:
    from colocate.cli import _tables as T

    out = T.console()
    out.print(T.gpu_table(listing))
    if listing.jobs:
        out.print(T.job_table(listing))
    else:
        out.print("no jobs")
