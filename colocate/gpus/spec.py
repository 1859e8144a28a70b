"""One GPU as a node coordinator sees it: plain data, no I/O (the node's pure core holds these; finding the
machine's GPUs is ``colocate.gpus``)."""

from __future__ import annotations

from dataclasses import dataclass

from colocate.base.vocab import DeviceKind

SIM_NAME = "colocate-sim"  # the name of an untyped simulated GPU (a typed one is named by its type)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as a node coordinator sees it. ``core`` is the CPU core of a sim GPU."""

    index: int
    kind: DeviceKind
    mem_total: int  # bytes
    name: str = ""
    core: int | None = None
    speed: float = 1.0  # a simulated GPU's speed relative to the fastest type (device time x 1/speed)
