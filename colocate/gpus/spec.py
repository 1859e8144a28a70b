"""``GpuSpec``: one GPU as a node coordinator sees it (data only: ``colocate.gpus`` finds them, its
``nvml`` and ``sim`` modules make them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as a node coordinator sees it. ``core`` is the CPU core of a sim GPU."""

    index: int
    kind: str  # one of colocate.env.DEVICES
    mem_total: int  # bytes
    name: str = ""
    core: int | None = None
