"""What the nodes' hellos say of their GPUs, kept by the live scheduler: each GPU's model (a node may hold several:
``--sim-gpus 2:V100,2:T4@0.6``), and one relative speed per model (``NodeGpu.speed``, what recommendations compare).

``NodeGpus.hello(node_id, gpus)`` records a hello. ``models`` (node id -> GPU index -> model) is kept while a node is
away, like the node's spec: a run's history record names the model of the GPUs it ran on
(``cluster.server.learning.gpu_type``). A model's speed is the first declared for it in this scheduler's life,
whoever declares it again: another speed for it (a second node, or the same one again) is ignored, with one warning
per model and node, so that a recommendation compares one speed per model whatever order the nodes come back in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from colocate import protocol as P

log = logging.getLogger("colocate.scheduler")


class NodeGpus:
    def __init__(self) -> None:
        self.models: dict[str, dict[int, str]] = {}  # node id -> GPU index -> model, as its hello listed them
        self.speeds: dict[str, float] = {}  # GPU model -> the relative speed first declared for it
        self._by: dict[str, str] = {}  # GPU model -> the node that declared its speed first
        self._warned: set[tuple[str, str]] = set()  # (model, node) whose other speed was logged

    def hello(self, node_id: str, gpus: Iterable[P.NodeGpu]) -> None:
        gpus = list(gpus)
        self.models[node_id] = {g.index: g.model for g in gpus}
        for g in gpus:
            if g.speed <= 0:  # none declared
                continue
            first = self.speeds.setdefault(g.model, g.speed)
            self._by.setdefault(g.model, node_id)
            if first != g.speed and (g.model, node_id) not in self._warned:
                self._warned.add((g.model, node_id))
                log.warning("node %s declares GPU model %s at speed %g; node %s declared it at %g first: kept %g",
                            node_id, g.model, g.speed, self._by[g.model], first, first)


def node_model(models: dict[int, str]) -> str:
    """The GPU model a node registers with in the policy core (``NodeSpec.gpu_model``), from its GPUs' models
    (``NodeGpus.models[node_id]``): their one model, or "" for a node of several models (or none). The core places by
    one model per node: a job that names a model is never placed on a node of several, where its workers could get
    GPUs of another model (jobs that name none may be)."""
    names = set(models.values())
    return names.pop() if len(names) == 1 else ""


def shown_models(models: dict[int, str]) -> str:
    """A node's GPU models (``NodeGpus.models[node_id]``) for people, in GPU order: ``V100`` or ``V100+T4``."""
    return "+".join(dict.fromkeys(models[i] for i in sorted(models)))
