"""Network topology of a cluster: which switch and rack each node sits under.

Two sources, for the scheduler (``colocate scheduler --topology FILE``) and the simulator
(``colocate simulate --topology FILE|SxN``):
  * a CSV file with the header ``node_id,switch,rack`` (``rack`` optional; empty cells mean not
    stated), one row per node; ``#`` lines are comments;
  * a shape ``SxN`` for the simulator: S switches of N consecutive nodes each, in node order
    (``16x8``: nodes 0-7 under ``sw00``, 8-15 under ``sw01``...); ``SxN/R`` also groups R consecutive
    switches per rack.
Labels follow ``colocate.protocol.parse_topology`` (1-64 letters, digits or ``._-:/``). Every error
is a ``ValueError`` of one line naming the file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re

from cluster.spec import NodeSpec
from cluster.traces.common import csv_error

Topology = dict[str, tuple[str, str]]  # node id -> (switch, rack)
_SHAPE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(?:/\s*(\d+)\s*)?")
MAX_ROWS = 1_000_000


def parse_topology_csv(text: str, name: str = "<topology>") -> Topology:
    """The node -> (switch, rack) table of a topology CSV's text."""
    from colocate.protocol import parse_topology  # the wire's label rules; imported here: a replay without a
    # topology file never loads the protocol (its codec and messages are a tenth of the simulator's start-up)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{name}: empty topology file (expected a header node_id,switch[,rack])")
    reader = csv.reader(io.StringIO("\n".join(lines[: MAX_ROWS + 1])))
    try:
        rows = list(reader)
    except csv.Error as e:
        raise csv_error(name, reader.line_num, e) from None
    header = [h.strip() for h in rows[0]]
    if "node_id" not in header or "switch" not in header or not set(header) <= {"node_id", "switch", "rack"}:
        raise ValueError(f"{name}: header must be node_id,switch[,rack], got {','.join(header)[:80]!r}")
    col = {h: i for i, h in enumerate(header)}
    out: Topology = {}
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{name}: row {n}: {len(row)} fields, expected {len(header)}")
        node = row[col["node_id"]].strip()
        if not node:
            raise ValueError(f"{name}: row {n}: empty node_id")
        if node in out:
            raise ValueError(f"{name}: row {n}: node {node[:64]!r} listed twice")
        labels = ",".join(f"{k}={row[col[k]].strip()}" for k in ("switch", "rack") if k in col and row[col[k]].strip())
        try:
            got = dict(parse_topology(labels))
        except ValueError as e:
            raise ValueError(f"{name}: row {n}: {e}") from None
        out[node] = (got.get("switch", ""), got.get("rack", ""))
    if len(rows) > MAX_ROWS + 1:
        raise ValueError(f"{name}: more than {MAX_ROWS:,} nodes")
    return out


def read_topology(path: str) -> Topology:
    """A topology CSV file by path (one-line ValueError when unreadable or malformed)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(64 << 20)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the topology file ({getattr(e, 'strerror', None) or e})") from None
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
        raise ValueError(f"{name}: {len(unknown)} node(s) not in the cluster, e.g. {unknown[0][:64]!r}; "
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
