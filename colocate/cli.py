"""The ``colocate`` command line: one entry point, one module per subcommand.

Every subcommand module exposes ``register(subparsers)`` which adds its parser
and sets ``func``; ``func(args) -> int`` is the exit code. Usage errors exit 2
with one clear line, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from colocate import __version__

SUBCOMMANDS = ("colocate.cmd_run", "colocate.cmd_node", "colocate.cmd_env", "colocate.cmd_demo",
               "colocate.cmd_ctl", "colocate.cmd_top")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="colocate",
        description="Co-locate deep-learning jobs on shared GPUs: memory caps and compute shares "
        "that grow and shrink while jobs run (AntMan for PyTorch).",
    )
    parser.add_argument("--version", action="version", version=f"colocate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("colocate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
