"""``colocate keys generate DIR [--node NAME] [--user NAME] [--operator NAME]``, ``colocate keys list [DIR]``."""

from __future__ import annotations

import argparse

from colocate.cli._common import fail

EPILOG = """\
Who a peer is, and what it may do, comes from its key:
  node-NAME       may register as node NAME (and as no other node)
  user-NAME       submits as user NAME; cancels NAME's jobs only
  operator-NAME   submits as NAME; may cancel any job
Users and operators cannot register as nodes; node keys cannot submit or cancel.

On one machine nothing is needed: the scheduler makes ~/.config/colocate/keys ($XDG_CONFIG_HOME)
on first start, and local nodes and clients make their own keys there as they first need them.

For a cluster:
  colocate keys generate /etc/colocate/keys --node gpu1 --node gpu2 --user alice --operator root
  colocate scheduler --bind tcp://0.0.0.0:5555 --keys /etc/colocate/keys ...
Copy DIR/scheduler.key with a peer's own pair to that peer, e.g. to alice's DIR2:
  scheduler.key, user-alice.key, user-alice.key_secret
  colocate node --scheduler tcp://HOST:5555 --node-id gpu1 --keys DIR2   (node-gpu1.* there)
  colocate submit ... --keys DIR2                                        (or COLOCATE_KEYS=DIR2)
Keep DIR/scheduler.key_secret on the scheduler's machine only. A key added to DIR/authorized/
while the scheduler runs is admitted from the peer's next connection; one removed is refused from
its next connection (a connection already made stays until it drops).
A peer whose public key is not in DIR/authorized/ gets nothing from the scheduler.
"""


def register(sub) -> None:
    p = sub.add_parser("keys", help="create CURVE keys for the scheduler, nodes, users and operators",
                       description="Manage the ZeroMQ CURVE keys that authenticate nodes and clients to the scheduler "
                       "and give each its identity and role.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    g = actions.add_parser("generate", help="create the scheduler's keys (once) and admitted peer keys",
                           description="Create the scheduler's CURVE key pair in DIR (once) and one admitted key "
                           "per --node, --user and --operator, listed in DIR/authorized/.")
    g.add_argument("dir", metavar="DIR")
    g.add_argument("--node", action="append", default=[], metavar="NAME", help="a node's key (repeatable)")
    g.add_argument("--user", action="append", default=[], metavar="NAME", help="a user's key (repeatable)")
    g.add_argument("--operator", action="append", default=[], metavar="NAME",
                   help="an operator's key: a user who may cancel anyone's job (repeatable)")
    ls = actions.add_parser("list", help="the admitted identities of a key folder",
                            description="List the identities a key folder admits (DIR/authorized/): each key's "
                            "role (node, user, operator) and name.")
    ls.add_argument("dir", metavar="DIR", nargs="?", default=None,
                    help="default: $COLOCATE_KEYS, else ~/.config/colocate/keys")
    p.set_defaults(func=main, _parser=p)


def main(args) -> int:
    from colocate.base import keys as K

    if args.action not in ("generate", "list"):
        args._parser.print_usage()
        return fail("keys", "choose an action: generate or list", 2)
    try:
        if args.action == "list":
            return _list(args.dir or K.default_dir())
        peers = [(K.NODE, n) for n in args.node] + [(K.USER, n) for n in args.user] + \
                [(K.OPERATOR, n) for n in args.operator]
        for role, name in peers:  # every name checked before anything is written: a refusal writes no key
            stem = K.cert_name(role, name)
            if K.exists(args.dir, stem):
                raise K.KeyError_(f"key {stem} already exists in {args.dir}: nothing was written")
        written = K.generate_server(args.dir)
        for role, name in peers:
            written += K.generate(args.dir, role, name)
    except (ValueError, OSError) as exc:
        return fail("keys", f"error: {exc}", 2)
    for path in written:
        print(path)
    return 0


def _list(directory: str) -> int:
    import os

    from colocate.base import keys as K

    folder = os.path.join(directory, K.AUTHORIZED)
    if not os.path.isdir(folder):
        return fail("keys", f"error: no folder {folder} of admitted keys", 1)
    for f in sorted(os.listdir(folder)):
        who = K.parse_identity(f[:-4]) if f.endswith(".key") else None
        if who:
            print(f"{who[0]:<9} {who[1]}")
    return 0
