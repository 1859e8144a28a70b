"""Policy plugins, one module each, selected by name from the config (``REGISTRY``).

Importing this package registers every plugin below; a new plugin is a new module here plus
one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib

from cluster.points import REGISTRY

_MODULES = ("fit", "fifo", "multi_queue", "gang", "binpack", "spread", "opportunistic", "preemption",
            "promotion", "quota", "predictor", "backfill", "first_fit", "round_robin", "best_fit", "tetris",
            "fgd", "genetic", "topology")

for _m in _MODULES:
    importlib.import_module(f"{__name__}.{_m}")

__all__ = ["REGISTRY"]
