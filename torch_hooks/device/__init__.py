"""The device as one job process sees it: ``job_device(env)`` returns the ``JobDevice`` that owns
this process's memory cap, allocator statistics and device busy clock (``sim`` or ``cuda``).
Imports torch lazily, when the device is installed."""

from __future__ import annotations

from colocate.base.vocab import DeviceKind
from torch_hooks.device.base import JobDevice, MemoryStats


def job_device(env) -> JobDevice:
    """The in-job device for a parsed ``JobEnv``."""
    if env.device == DeviceKind.CUDA:
        from torch_hooks.device.cuda import CudaJobDevice

        return CudaJobDevice(env)
    from torch_hooks.device.sim import SimJobDevice

    return SimJobDevice(env)


__all__ = ["JobDevice", "MemoryStats", "job_device"]
