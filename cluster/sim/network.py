"""How much slower a gang runs when it spans more of the network: the simulator's spread model.

A gang's progress rate (solo seconds of work per second) is multiplied by ``SpreadModel.rate(...)``:
``1 / node`` when its workers sit on more than one node, times ``1 / switch`` when they sit under more
than one switch, times ``1 / rack`` when in more than one rack (step-time factors >= 1, applied once,
whatever the count beyond one). Switches and racks are known only by the nodes' labels (``--topology``): a
gang spans more than one switch when its nodes carry two different switch labels or more; a node without
one is under a switch not known, counted as none (the same for racks). So without labels only the node
factor applies, and ``check_labels`` refuses a factor for a level no node is labelled at.

``PUBLISHED`` (docs/simulator.md gives the sources and how the figures were derived):
  * ``node`` 1.46: Gavel (Narayanan et al., OSDI'20) measured each model's throughput with its
    workers consolidated on one server and unconsolidated (spread over servers); over the 19 (model,
    batch size) configurations of its artifact's ``simulation_throughputs.json`` with 2, 4 and 8 P100s,
    the median consolidated/unconsolidated ratio is 1.46, 1.53 and 1.41 (V100: 1.99, 1.91, 3.35).
  * ``switch`` 1.2 and ``rack`` 1.0: assumed (no public measurement of same-switch vs cross-switch
    training was found); parameters, named in the results.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.spec import NodeSpec

MAX_FACTOR = 100.0  # a step-time factor: far above the largest measured (Gavel: 9.56, LM on 8 V100s spread out)


@dataclass(frozen=True)
class SpreadModel:
    node: float = 1.0  # step-time factor of a gang on more than one node
    switch: float = 1.0  # further factor when it spans more than one switch
    rack: float = 1.0  # further factor when it spans more than one rack

    def __post_init__(self) -> None:
        for name in ("node", "switch", "rack"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 1.0 <= v <= MAX_FACTOR):
                raise ValueError(f"spread model: {name} factor must be a number from 1 to {MAX_FACTOR:g}, got {v!r}")

    def rate(self, nodes: int, switches: int, racks: int) -> float:
        """The rate multiplier (<= 1) of a gang spanning that many nodes, switches and racks."""
        f = (self.node if nodes > 1 else 1.0) * (self.switch if switches > 1 else 1.0) * (self.rack if racks > 1 else 1.0)
        return 1.0 / f

    def __str__(self) -> str:
        return f"node x{self.node:g}, switch x{self.switch:g}, rack x{self.rack:g}"


NONE = SpreadModel()
PUBLISHED = SpreadModel(node=1.46, switch=1.2, rack=1.0)


def span(specs: list[NodeSpec]) -> tuple[int, int, int]:
    """Distinct nodes, and switch and rack labels (at least 1 each: a node without a label is under a switch and
    rack not known, not counted), among ``specs``."""
    ids = {s.node_id: s for s in specs}
    sw = {s.switch for s in ids.values() if s.switch}
    rk = {s.rack for s in ids.values() if s.rack}
    return len(ids), max(1, len(sw)), max(1, len(rk))


def check_labels(model: SpreadModel, nodes: list[NodeSpec]) -> None:
    """A one-line ValueError when ``model`` gives a switch or rack factor (> 1) and no node has a label at that
    level: the factor could never apply (``PUBLISHED``'s assumed switch factor excepted: without labels only its
    node factor applies, as docs/simulator.md says)."""
    if model == PUBLISHED:
        return
    for level in ("switch", "rack"):
        f = getattr(model, level)
        if f != 1.0 and not any(getattr(n, level) for n in nodes):
            how = "--topology SxN or a CSV node_id,switch" if level == "switch" else \
                "--topology SxN/R or a CSV node_id,switch,rack"
            raise ValueError(f"--spread {level}={f:g}: no node has a {level} label, so the factor could never apply "
                             f"(label the nodes with {how})")


def parse_spread(text: str) -> SpreadModel:
    """``published``, ``none`` or ``node=1.5,switch=1.2[,rack=1]`` (one-line ValueError otherwise)."""
    t = text.strip().lower()
    if t == "published":
        return PUBLISHED
    if t == "none":
        return NONE
    vals: dict[str, float] = {}
    for part in t.split(","):
        k, eq, v = (x.strip() for x in part.partition("="))
        if not eq or k not in ("node", "switch", "rack") or k in vals:
            raise ValueError(f"spread model {text!r}: expected published, none or node=F,switch=F[,rack=F]")
        try:
            vals[k] = float(v)
        except ValueError:
            raise ValueError(f"spread model {text!r}: {k} factor {v!r} is not a number") from None
    return SpreadModel(**vals)
