"""``colocate keys generate DIR [--name NAME]``: CURVE keys for the scheduler link."""

from __future__ import annotations

import argparse

from colocate.cli._common import fail

EPILOG = """\
examples:
  colocate keys generate ~/.colocate/keys              # the scheduler's keys and a "client" key
  colocate keys generate ~/.colocate/keys --name node7  # one more admitted key

Then: colocate scheduler --bind tcp://0.0.0.0:5555 --keys DIR ...
      colocate node --scheduler tcp://HOST:5555 --keys DIR     (or COLOCATE_KEYS=DIR)
      colocate submit ... (with COLOCATE_KEYS=DIR)
A peer whose public key is not in DIR/authorized/ gets nothing from the scheduler.
Copy DIR/scheduler.key, DIR/NAME.key and DIR/NAME.key_secret to each peer; keep
DIR/scheduler.key_secret on the scheduler's machine only.
"""


def register(sub) -> None:
    p = sub.add_parser("keys", help="create CURVE keys for the scheduler, nodes and clients",
                       description="Manage the ZeroMQ CURVE keys that authenticate nodes and clients to the scheduler.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    g = actions.add_parser("generate", help="create the scheduler's keys (once) and an admitted peer key",
                           description="Create the scheduler's CURVE key pair in DIR (once) and the key of one "
                           "admitted peer (--name), listed in DIR/authorized/.")
    g.add_argument("dir", metavar="DIR")
    g.add_argument("--name", default="client", help="the peer key's name (default client)")
    p.set_defaults(func=main, _parser=p)


def main(args) -> int:
    from colocate import keys as K

    if args.action != "generate":
        args._parser.print_usage()
        return fail("keys", "choose an action: generate", 2)
    try:
        written = K.generate(args.dir, args.name)
    except (ValueError, OSError) as exc:
        return fail("keys", f"error: {exc}", 2)
    for path in written:
        print(path)
    return 0
