"""Cluster shapes: node lists read from files, and ``NxG`` shapes, as lists of ``NodeSpec``.

Formats (``load_nodes`` guesses from the header, ``detect_node_format``):
  * ``alibaba2023`` — ``openb_node_list_*.csv``: ``sn,cpu_milli,memory_mib,gpu,model`` ->
    node_id, cpu_milli, mem_mib, gpus, gpu_model.
  * ``pai2020`` — ``pai_machine_spec_with_header.csv``: ``machine,gpu_type,cap_cpu,cap_mem,cap_gpu``;
    ``cap_cpu`` in cores (x1000 -> cpu_milli), ``cap_mem`` in GiB (x1024 -> mem_mib), gpu_type ->
    gpu_model (``CPU`` is the type of GPU-less machines; ``MISC`` is kept as a model name).
  * ``csv`` — generic: ``gpu_count`` required; optional ``gpu_model``, ``cpu`` (cores, may be
    fractional), ``memory`` (host memory, a size WITH a unit such as ``512GiB``), ``gpu_mem``
    (per GPU, a size; bare number = bytes), ``count`` (repeat the row, >= 1), ``node_id``
    (default ``node-NNNN`` by position; with ``count`` > 1 it becomes ``ID-0``, ``ID-1``...).
    Empty cells mean not stated (0 / "").
  * shapes (``parse_shape``): ``64x8`` = 64 nodes of 8 GPUs; ``64x8:V100`` names the model,
    ``64x8:V100:32GiB`` also the memory per GPU; ``+`` joins groups (``32x8:V100+16x2:T4``).

GPU-less machines (``gpus`` 0) are kept, with model "", since CPU-only pods need them; pass
``gpu_only=True`` to leave them out (counted as "cpu-only node"). A node's model is "" whenever
it has no GPUs. Node ids must be unique ("duplicate node_id"). Memory per GPU is 0 (not stated)
for the trace formats: the traces do not give it.
"""

from __future__ import annotations

import re

from cluster.spec import NodeSpec, SpecError
from cluster.traces.common import (
    BadRow,
    NodeResult,
    RowLog,
    columns,
    data_rows,
    detect_node_format,
    open_table,
    to_float,
    to_int,
    to_size,
)
from colocate.base.text import quoted
from colocate.base.units import parse_size

MIB = 1 << 20
FORMATS = {
    "alibaba2023": (("sn", "cpu_milli", "memory_mib", "gpu", "model"), ()),
    "pai2020": (("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu"), ()),
    "csv": (("gpu_count",), ("gpu_model", "cpu", "memory", "gpu_mem", "count", "node_id")),
}
_SHAPE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([^:+\s]*)\s*)?(?::\s*([^:+\s]+)\s*)?")
# a GPU model in a shape: at most 64 characters, as a node's model may be, of the characters of a live node's
# simulated GPU types (colocate node --sim-gpus): ASCII letters, digits and ._- (no |, @, spaces or commas)
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MODEL_RULE = "1-64 letters, digits or ._-"


def load_nodes(path, *, format: str | None = None, gpu_only: bool = False,
               max_problems: int | None = None) -> NodeResult:
    """Read a node list in ``format`` (guessed from the header when None)."""
    path = str(path)
    fmt = format or detect_node_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown node list format {fmt!r}: use one of {', '.join(FORMATS)}")
    required, optional = FORMATS[fmt]
    what = f"a {fmt} node list"
    log = RowLog(path, max_problems)
    result = NodeResult(path, fmt)
    parse = {"alibaba2023": _alibaba, "pai2020": _pai, "csv": _generic}[fmt]
    seen: set[str] = set()
    with open_table(path, what) as (reader, names):
        index, result.ignored_columns = columns(path, names, what, required, optional)
        width = len(names)
        pick = [(c, index[c]) for c in required + optional if c in index]
        for line, row in data_rows(reader, width, result, log):
            try:
                nodes = parse({c: row[i].strip() for c, i in pick}, len(result.nodes))
                for node in nodes:
                    if node.node_id in seen:
                        raise BadRow("duplicate node_id", node.node_id)
                if gpu_only and nodes and nodes[0].gpus == 0:
                    raise BadRow("cpu-only node")
            except BadRow as e:
                log.skip(line, e.reason, e.detail)
                continue
            except SpecError as e:
                log.skip(line, "bad spec", str(e))
                continue
            seen.update(n.node_id for n in nodes)
            result.nodes.extend(nodes)
    result.skipped, result.problems = log.skipped, log.problems
    return result


def _alibaba(c: dict[str, str], _: int) -> list[NodeSpec]:
    gpus = to_int(c["gpu"], "gpu")
    return [NodeSpec(node_id=c["sn"] or _bad("sn"), gpus=gpus, gpu_model=c["model"] if gpus else "",
                     cpu_milli=to_int(c["cpu_milli"], "cpu_milli"), mem_mib=to_int(c["memory_mib"], "memory_mib"))]


def _pai(c: dict[str, str], _: int) -> list[NodeSpec]:
    gpus = to_int(c["cap_gpu"], "cap_gpu")
    if gpus and c["gpu_type"].upper() in ("CPU", ""):
        raise BadRow("bad gpu_type", f"{c['gpu_type']!r} with cap_gpu {gpus}")
    return [NodeSpec(node_id=c["machine"] or _bad("machine"), gpus=gpus, gpu_model=c["gpu_type"] if gpus else "",
                     cpu_milli=round(to_float(c["cap_cpu"], "cap_cpu", 0.0) * 1000),
                     mem_mib=round(to_float(c["cap_mem"], "cap_mem", 0.0) * 1024))]


def _generic(c: dict[str, str], position: int) -> list[NodeSpec]:
    gpus = to_int(c["gpu_count"], "gpu_count")
    count = to_int(c["count"], "count", 1) if c.get("count") else 1
    cpu_milli = round(to_float(c["cpu"], "cpu", 0.0) * 1000) if c.get("cpu") else 0
    mem_mib = 0
    if c.get("memory"):
        if re.fullmatch(r"[0-9.]+", c["memory"]):
            raise BadRow("bad memory", f"{c['memory']!r} needs a unit, e.g. 512GiB")
        mem_mib = to_size(c["memory"], "memory") // MIB
    gpu_mem = to_size(c["gpu_mem"], "gpu_mem") if c.get("gpu_mem") else 0
    model = c.get("gpu_model", "") if gpus else ""
    base = c.get("node_id", "")
    if base:
        ids = [base] if count == 1 else [f"{base}-{k}" for k in range(count)]
    else:
        ids = [f"node-{position + k:04d}" for k in range(count)]
    return [NodeSpec(node_id=i, gpus=gpus, gpu_model=model, gpu_mem=gpu_mem, cpu_milli=cpu_milli, mem_mib=mem_mib)
            for i in ids]


def _bad(col: str) -> str:
    raise BadRow(f"bad {col}", "empty")


MAX_SHAPE_NODES = 100_000  # a shape's nodes in all (the largest real traces have about 1,500)
MAX_SHAPE_GPUS = 64  # GPUs of one node (as a live node: colocate.protocol MAX_NODE_GPUS)


def parse_shape(text: str) -> list[NodeSpec]:
    """Nodes of a shape such as ``64x8``, ``64x8:V100``, ``64x8:V100:32GiB``, ``64x8::32GiB`` (no model stated) or
    ``32x8:V100+16x2:T4``; ids ``node-0000``... in order. A GPU model is ``MODEL_RULE`` (``|``, ``@``, a comma,
    an empty one are refused). Raises ``ValueError`` when malformed."""
    groups = []
    text = str(text)
    if "," in text:
        raise ValueError(f"cluster shape {quoted(text)}: groups are joined by +, not by commas (e.g. "
                         "32x8:V100+16x2:T4)")
    for part in text.split("+"):
        m = _SHAPE.fullmatch(part)
        if not m:
            raise ValueError(f"malformed cluster shape {quoted(text)}: expected NxG[:MODEL[:GPU_MEM]] groups joined "
                             "by +, e.g. 64x8 or 32x8:V100:32GiB+16x2:T4")
        n, g, model, mem = int(m.group(1)), int(m.group(2)), m.group(3) or "", m.group(4)
        if m.group(3) is not None and not model and not mem:
            raise ValueError(f"cluster shape {quoted(text)}: no GPU model after ':' (a model is {MODEL_RULE}; "
                             "for GPUs of no stated model leave the ':' out)")
        if model and not MODEL_NAME.fullmatch(model):
            raise ValueError(f"cluster shape {quoted(text, 40)}: GPU model {quoted(model, 40)} must be {MODEL_RULE} "
                             "(one model per group: 32x8:V100+16x2:T4)")
        if n < 1:
            raise ValueError(f"cluster shape {quoted(text)}: the node count must be >= 1")
        if n > MAX_SHAPE_NODES or g > MAX_SHAPE_GPUS:
            raise ValueError(f"cluster shape {text[:40]!r}: at most {MAX_SHAPE_NODES} nodes of at most "
                             f"{MAX_SHAPE_GPUS} GPUs each")
        try:
            gpu_mem = parse_size(mem) if mem else 0
        except ValueError as e:
            raise ValueError(f"cluster shape {quoted(text)}: {e}") from None
        groups.append((n, g, model if g else "", gpu_mem))
    total = sum(n for n, *_ in groups)
    if total > MAX_SHAPE_NODES:
        raise ValueError(f"cluster shape {text[:40]!r}: {total} nodes, over the limit of {MAX_SHAPE_NODES}")
    width = max(4, len(str(total - 1)))
    nodes: list[NodeSpec] = []
    for n, g, model, gpu_mem in groups:
        for _ in range(n):
            nodes.append(NodeSpec(node_id=f"node-{len(nodes):0{width}d}", gpus=g, gpu_model=model, gpu_mem=gpu_mem))
    return nodes
