"""numpy for the table plugins (``nodetable`` and the seed policies on it), imported at their first use.

``np`` stands in for the module: the first attribute read imports numpy and copies its names onto ``np``, so
later reads are plain attribute lookups. Importing ``cluster.plugins`` registers every plugin, and a policy
that uses no table plugin (every preset but the seeds') then starts without numpy's import (about 80 ms of a
replay's start-up on the reference machine). Only attribute access is supported (``np.zeros``, ``np.int64``);
annotations stay strings (``from __future__ import annotations`` in every user). Type checkers see numpy
itself, so ``np.ndarray`` in an annotation is numpy's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["np"]


class _Numpy:
    def __getattr__(self, name: str):
        module = importlib.import_module("numpy")
        self.__dict__.update(vars(module))
        return getattr(module, name)

    def __repr__(self) -> str:
        return "<numpy, imported at first use>"


if TYPE_CHECKING:
    import numpy as np
else:
    np = _Numpy()
