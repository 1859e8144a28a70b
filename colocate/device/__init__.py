"""The device interface: one shape, two implementations (``sim`` and ``cuda``).

Two sides use it:

* the node side (daemons, no torch): ``node_gpus(kind, ...)`` lists the GPUs a
  machine offers as ``GpuSpec`` records (index, kind, total memory, core);
* the job side (inside the training process, torch imported lazily):
  ``job_device(env)`` returns a ``JobDevice`` that owns the memory cap, the
  allocator statistics and the device busy clock of this process.

``resolve(kind)`` turns ``auto`` into ``cuda`` when a CUDA device is usable and
``sim`` otherwise.
"""

from __future__ import annotations

from colocate.device.base import GpuSpec, JobDevice, MemoryStats

KINDS = ("auto", "cuda", "sim")


def cuda_available() -> bool:
    """True when NVML reports at least one NVIDIA GPU (no torch import)."""
    from colocate.device import cuda

    return cuda.nvml_device_count() > 0


def resolve(kind: str) -> str:
    """Map ``auto|cuda|sim`` to a concrete kind; ValueError on anything else."""
    if kind not in KINDS:
        raise ValueError(f"unknown device {kind!r}: use one of {', '.join(KINDS)}")
    if kind == "auto":
        return "cuda" if cuda_available() else "sim"
    if kind == "cuda" and not cuda_available():
        raise ValueError("--device cuda: no CUDA GPU is visible (NVML found none); use --device sim or auto")
    return kind


def node_gpus(kind: str, sim_gpus: int = 1, sim_gpu_mem: int = 16 << 30) -> list[GpuSpec]:
    """The GPUs of this machine for a node coordinator."""
    kind = resolve(kind)
    if kind == "cuda":
        from colocate.device import cuda

        return cuda.node_gpus()
    from colocate.device import sim

    return sim.node_gpus(sim_gpus, sim_gpu_mem)


def job_device(env) -> JobDevice:
    """The in-job device for a parsed ``JobEnv`` (imports torch)."""
    if env.device == "cuda":
        from colocate.device.cuda import CudaJobDevice

        return CudaJobDevice(env)
    from colocate.device.sim import SimJobDevice

    return SimJobDevice(env)


__all__ = ["GpuSpec", "JobDevice", "MemoryStats", "KINDS", "resolve", "node_gpus", "job_device", "cuda_available"]
