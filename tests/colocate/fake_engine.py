"""A test engine for ``colocate.base.engines``: ``resolve`` turns FAKE_* variables into ``COLOCATE_*`` ones.

Not a test module: ``tests/colocate/base/test_engines.py`` adds it to ``colocate.base.engines.ENGINES`` (in a child
process, before ``import torch``) to prove the runtime's hook without Ray or Slurm.
"""
from __future__ import annotations

CALLBACKS: list = []  # what the runtime asked to be called back with, when the worker deferred


def resolve(environ):
    fraction = environ.get("FAKE_FRACTION")
    if fraction == "defer":  # a worker whose facts come later: the test calls CALLBACKS back once it set them
        from colocate.base.engines import Deferred

        raise Deferred("fake engine: later", CALLBACKS.append)
    if not fraction:
        raise ValueError("fake engine: FAKE_FRACTION is not set\n(a second line that must not be printed)")
    if fraction == "bad-key":
        return {"PATH": "/nowhere"}
    return {
        "COLOCATE_JOB_ID": "fake-job",
        "COLOCATE_SM_SHARE": fraction,
        "COLOCATE_GPU_MEM": str(int(float(fraction) * (1 << 30))),
        "COLOCATE_SIM_GPU_MEM": "1GiB",
        "COLOCATE_RANK": "1",
        "COLOCATE_WORLD_SIZE": "2",
        "COLOCATE_PRIORITY": environ.get("FAKE_PRIORITY", "guaranteed"),
    }
