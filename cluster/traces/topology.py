"""Network topology of a cluster: which switch and rack each node sits under.

Two sources, for the scheduler (``colocate scheduler --topology FILE``) and the simulator
(``colocate simulate --topology FILE|SxN``):
  * a CSV file with the header ``node_id,switch,rack`` (``rack`` optional; columns in any order, each
    once; a UTF-8 byte order mark ignored; empty cells mean not stated: no label at that level), one row
    per node; ``#`` lines and blank lines are comments; a line ends at ``\n``, ``\r`` or ``\r\n`` only;
  * a shape ``SxN`` for the simulator: S switches of N consecutive nodes each, in node order
    (``16x8``: nodes 0-7 under ``sw00``, 8-15 under ``sw01``...); ``SxN/R`` also groups R consecutive
    switches per rack.
Labels follow ``colocate.protocol.parse_topology`` (1-64 letters, digits or ``._-:/``). Every error
is a ``ValueError`` of one line naming the file and its line (comments counted), values cut
(``colocate.base.text.quoted``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re

from cluster.spec import NodeSpec
from cluster.traces.common import csv_error, table_lines
from colocate.base.text import quoted

Topology = dict[str, tuple[str, str]]  # node id -> (switch, rack)
_SHAPE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(?:/\s*(\d+)\s*)?")
MAX_ROWS = 1_000_000
MAX_CHARS = 64 << 20  # of a topology file: more is refused


def parse_topology_csv(text: str, name: str = "<topology>") -> Topology:
    """The node -> (switch, rack) table of a topology CSV's text (a UTF-8 byte order mark at its start is
    ignored). Errors name the file's line (comment and blank lines counted)."""
    # the wire's label and id rules, imported here: a replay without a topology file never loads the protocol (its
    # codec and messages are a tenth of the simulator's start-up)
    from colocate.protocol import parse_topology
    from colocate.protocol.codec import MAX_ID_CHARS

    numbers: list[int] = []  # the file line of each line the csv reader is given

    def lines():  # the file's lines but comments and blank ones; a line ends at \n, \r or \r\n only (not at U+2028)
        for n, line in enumerate(table_lines(io.StringIO(text.removeprefix("\ufeff"), newline=""), name), start=1):
            if line.strip(" \t\r\n") and not line.lstrip().startswith("#"):
                numbers.append(n)
                yield line

    reader = csv.reader(lines())
    try:
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise ValueError(f"{name}: empty topology file (expected a header node_id,switch[,rack])")
        where = f"{name}:{numbers[reader.line_num - 1]}"
        if "node_id" not in header or "switch" not in header or not set(header) <= {"node_id", "switch", "rack"}:
            raise ValueError(f"{where}: header must be node_id,switch[,rack], got {quoted(','.join(header))}")
        twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
        if twice is not None:
            raise ValueError(f"{where}: column {twice!r} appears twice in the header")
        col = {h: i for i, h in enumerate(header)}
        out: Topology = {}
        for row in reader:
            where = f"{name}:{numbers[reader.line_num - 1]}"
            if len(row) != len(header):
                raise ValueError(f"{where}: {len(row)} fields, expected {len(header)} ({','.join(header)})")
            node = row[col["node_id"]].strip()
            if not node:
                raise ValueError(f"{where}: empty node_id")
            if len(node) > MAX_ID_CHARS or not node.isprintable():
                raise ValueError(f"{where}: node id {quoted(node)} must be 1-{MAX_ID_CHARS} printable characters")
            if node in out:
                raise ValueError(f"{where}: node {quoted(node)} listed twice")
            if len(out) >= MAX_ROWS:
                raise ValueError(f"{name}: more than {MAX_ROWS:,} nodes")
            labels = ",".join(f"{k}={row[col[k]].strip()}" for k in ("switch", "rack") if k in col and row[col[k]].strip())
            try:
                got = dict(parse_topology(labels))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            out[node] = (got.get("switch", ""), got.get("rack", ""))
    except csv.Error as e:
        raise csv_error(name, numbers[reader.line_num - 1] if reader.line_num else 1, e) from None
    return out


def read_topology(path: str) -> Topology:
    """A topology CSV file by path (one-line ValueError when unreadable, over 64 MiB or malformed)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read(MAX_CHARS + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the topology file ({getattr(e, 'strerror', None) or e})") from None
    if len(text) > MAX_CHARS:
        raise ValueError(f"{path}: a topology file of more than {MAX_CHARS >> 20} MiB (one line per node: "
                         f"at most {MAX_ROWS:,} nodes)")
    return parse_topology_csv(text, str(path))


def shape_topology(shape: str, nodes: list[NodeSpec]) -> Topology:
    """``SxN`` (or ``SxN/R``) over ``nodes`` in order; the shape must cover exactly as many nodes."""
    m = _SHAPE.fullmatch(shape)
    if not m:
        raise ValueError(f"malformed topology shape {shape!r}: expected SxN (S switches of N nodes) or SxN/R "
                         "(and R switches per rack), e.g. 16x8")
    s, n, r = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if s < 1 or n < 1 or (m.group(3) is not None and r < 1):
        raise ValueError(f"topology shape {shape!r}: counts must be >= 1")
    if s * n != len(nodes):
        raise ValueError(f"topology shape {shape!r} covers {s * n} nodes, the cluster has {len(nodes)}")
    ws, wr = len(str(s - 1)), len(str(max(0, (s - 1) // r) if r else 0))
    return {node.node_id: (f"sw{i // n:0{max(2, ws)}d}", f"rack{i // n // r:0{max(2, wr)}d}" if r else "")
            for i, node in enumerate(nodes)}


def label_nodes(nodes: list[NodeSpec], topo: Topology, name: str = "topology") -> list[NodeSpec]:
    """``nodes`` with the switch and rack ``topo`` gives them (a node it does not list keeps none; a listed
    node the cluster lacks is an error, which names the cluster's node ids: a ``--cluster`` shape's are
    ``node-0000``, ``node-0001``... (``cluster.traces.nodes.parse_shape``))."""
    ids = {n.node_id for n in nodes}
    unknown = [k for k in topo if k not in ids]
    if unknown:
        raise ValueError(f"{name}: {len(unknown)} node(s) not in the cluster, e.g. {quoted(unknown[0])}; "
                         f"the cluster's nodes are {_id_range(nodes)}")
    return [dataclasses.replace(n, switch=topo[n.node_id][0], rack=topo[n.node_id][1]) if n.node_id in topo else n
            for n in nodes]


def _id_range(nodes: list[NodeSpec]) -> str:
    """The nodes' ids in a few words: all of up to three, else the first and the last (``node-0000..node-0015``)."""
    ids = [n.node_id[:64] for n in nodes]
    if len(ids) <= 3:
        return ", ".join(ids) or "none"
    return f"{ids[0]}..{ids[-1]} ({len(ids)} nodes)"


def load_topology(source: str, nodes: list[NodeSpec]) -> list[NodeSpec]:
    """``nodes`` labelled from a shape (``16x8``) or a CSV file path."""
    if _SHAPE.fullmatch(source):
        return label_nodes(nodes, shape_topology(source, nodes), source)
    return label_nodes(nodes, read_topology(source), source)
