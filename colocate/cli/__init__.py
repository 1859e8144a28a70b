"""The ``colocate`` command line: one entry point, one thin module per command.

``COMMANDS`` is the table of commands: name -> module. Each module exposes
``register(subparsers)``, which adds its parser with ``set_defaults(func=main)``, and
``main(args) -> int``, the exit code: it parses nothing more, calls the library and prints.
A command never imports another command; what several share lives in ``_common`` and
``_tables``. The name of the command run is ``args.cli_command``, a dest no command uses for its own arguments
(``run``, ``submit`` and ``recommend`` call the command line they take ``command``). Usage errors exit 2 with one
clear line, never a traceback; so does a request a command builds from the user's input that the protocol
refuses (``ProtocolError``: a field out of range), whichever command let it through.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from colocate import __version__

COMMANDS = {
    "run": "colocate.cli.run",
    "node": "colocate.cli.node",
    "ctl": "colocate.cli.ctl",
    "top": "colocate.cli.top",
    "env": "colocate.cli.env",
    "demo": "colocate.cli.demo",
    "simulate": "colocate.cli.simulate",
    "scheduler": "colocate.cli.scheduler",
    "submit": "colocate.cli.submit",
    "status": "colocate.cli.status",
    "queue": "colocate.cli.queue",
    "nodes": "colocate.cli.nodes",
    "cancel": "colocate.cli.cancel",
    "logs": "colocate.cli.logs",
    "recommend": "colocate.cli.recommend",
    "keys": "colocate.cli.keys",
    "ray": "colocate.cli.ray",
    "slurm": "colocate.cli.slurm",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` (a name in ``COMMANDS``) just that command's parser under
    ``colocate``: ``main`` imports only the module of the command it runs, so a launcher the node starts per
    job does not pay for every command's imports."""
    parser = argparse.ArgumentParser(
        prog="colocate",
        description="Co-locate deep-learning jobs on shared GPUs: memory caps and compute shares "
        "that grow and shrink while jobs run (AntMan for PyTorch).",
    )
    parser.add_argument("--version", action="version", version=f"colocate {__version__}")
    sub = parser.add_subparsers(dest="cli_command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # the command is the first word (the top level has only --help and --version); anything else gets the
    # whole parser, whose help and errors list every command
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra  # a command that passes options on (``colocate ray start``) sets ``passthrough``
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (``colocate queue | head``): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit cannot raise again
        return 141  # 128 + SIGPIPE, what a shell reports for a command stopped by a closed pipe
    except KeyboardInterrupt:
        print("colocate: interrupted", file=sys.stderr)
        return 130
    except ValueError as exc:
        from colocate.protocol import ProtocolError

        if not isinstance(exc, ProtocolError):
            raise
        print(f"colocate {args.cli_command}: error: {exc}", file=sys.stderr)
        return 2
