"""How much slower a gang runs when it spans more of the network: the simulator's spread model.

A gang's progress rate (solo seconds of work per second) is multiplied by ``SpreadModel.rate(...)``:
``1 / node`` when its workers sit on more than one node, times ``1 / switch`` when they sit under more
than one switch, times ``1 / rack`` when in more than one rack (step-time factors >= 1, applied once,
whatever the count beyond one). Nodes without labels count as a switch and a rack of their own.

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


@dataclass(frozen=True)
class SpreadModel:
    node: float = 1.0  # step-time factor of a gang on more than one node
    switch: float = 1.0  # further factor when it spans more than one switch
    rack: float = 1.0  # further factor when it spans more than one rack

    def __post_init__(self) -> None:
        for name in ("node", "switch", "rack"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 1.0 <= v < float("inf")):
                raise ValueError(f"spread model: {name} factor must be a number >= 1, got {v!r}")

    def rate(self, nodes: int, switches: int, racks: int) -> float:
        """The rate multiplier (<= 1) of a gang spanning that many nodes, switches and racks."""
        f = (self.node if nodes > 1 else 1.0) * (self.switch if switches > 1 else 1.0) * (self.rack if racks > 1 else 1.0)
        return 1.0 / f

    def __str__(self) -> str:
        return f"node x{self.node:g}, switch x{self.switch:g}, rack x{self.rack:g}"


NONE = SpreadModel()
PUBLISHED = SpreadModel(node=1.46, switch=1.2, rack=1.0)


def span(specs: list[NodeSpec]) -> tuple[int, int, int]:
    """Distinct nodes, switches and racks among ``specs`` (an unlabelled node: its own switch and rack)."""
    ids = {s.node_id: s for s in specs}
    sw = {s.switch or "\0" + i for i, s in ids.items()}
    rk = {s.rack or ("\0" + s.switch if s.switch else "\0" + i) for i, s in ids.items()}
    return len(ids), len(sw), len(rk)


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
