"""``colocate env``: print the table of COLOCATE_* variables."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("env", help="list the COLOCATE_* environment variables a job sees",
                       description="Print the table of COLOCATE_* variables that `colocate run` sets for a job "
                       "(markdown, the same table as the README's).")
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.base.env import markdown_table

    print(markdown_table())
    return 0
