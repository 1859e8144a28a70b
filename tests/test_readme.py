"""The README's and docs' reference tables are generated from their one source; endpoints are the defaults.

Each ``<!-- generated: NAME -->`` ... ``<!-- /generated -->`` block of ``DOCS`` must equal what
``SOURCES[NAME]`` makes from the code (the ``COLOCATE_*`` table, the node config fields, both metric tables,
the policy presets, the scheduler's policy reference). After changing a source, rewrite the blocks with
``python -m tests.test_readme --update``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = (README, REPO / "docs" / "scheduler.md")
BLOCK = re.compile(r"(<!-- generated: (?P<name>[^>]+?) -->\n)(?P<body>.*?)(^[ \t]*<!-- /generated -->)", re.S | re.M)


def _doc_table(module) -> str:
    lines = module.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| metric |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _env() -> str:
    from colocate.base.env import markdown_table

    return markdown_table()


def _node_config() -> str:
    from colocate.node.config import markdown_table

    return markdown_table()


def _node_metrics() -> str:
    from colocate.node import metrics

    return _doc_table(metrics)


def _scheduler_metrics() -> str:
    from cluster.server import metrics

    return _doc_table(metrics)


def _presets() -> str:
    from cluster.config import PRESETS

    return "  " + ", ".join(f"`{name}`" for name in PRESETS)


def _policy_reference() -> str:
    from cluster.config import reference_markdown

    return reference_markdown()


SOURCES = {"colocate env": _env, "node config": _node_config, "node metrics": _node_metrics,
           "scheduler metrics": _scheduler_metrics, "presets": _presets, "policy reference": _policy_reference}


def render(text: str) -> str:
    def sub(m):
        return m.group(1) + SOURCES[m.group("name")]().rstrip("\n") + "\n" + m.group(4)
    return BLOCK.sub(sub, text)


def blocks() -> dict[str, str]:
    return {m.group("name"): m.group("body") for doc in DOCS for m in BLOCK.finditer(doc.read_text())}


def test_every_generated_block_has_a_source_and_every_source_a_block():
    names = [m.group("name") for doc in DOCS for m in BLOCK.finditer(doc.read_text())]
    assert sorted(names) == sorted(SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_generated_block_matches_its_source(name):
    assert blocks()[name].rstrip("\n") == SOURCES[name]().rstrip("\n"), (
        f"the generated block {name!r} is stale: run `python -m tests.test_readme --update`")


def test_one_default_endpoint_everywhere():
    """Every node or scheduler endpoint the README, the docs and the commands' help name is the default
    (or a placeholder HOST), so a user copying one never meets another."""
    from colocate.base.endpoints import SCHEDULER_ENDPOINT
    from colocate.cli import build_parser

    texts = {"README.md": README.read_text()}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in (REPO / "docs").glob("*.md")})
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    texts.update({f"colocate {name} --help": p.format_help() for name, p in sub.choices.items()})
    node_default = re.compile(r"ipc:///tmp/colocate-(\$UID|\d+)/node\.sock(\.ctl)?")  # endpoints.node_endpoint()
    for where, text in texts.items():
        for ep in re.findall(r"ipc:///tmp/[^\s`'\")]+", text):
            assert node_default.fullmatch(ep.rstrip(".,;")), (where, ep)
        for ep in re.findall(r"tcp://127\.0\.0\.1:\d+", text):
            assert ep == SCHEDULER_ENDPOINT, (where, ep)


if __name__ == "__main__" and "--update" in sys.argv:
    for doc in DOCS:
        doc.write_text(render(doc.read_text()))
        print(f"rewrote the generated blocks of {doc}")
