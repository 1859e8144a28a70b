"""The GPUs of this machine, as the node side sees them (no torch).

``resolve(kind)`` turns ``auto`` into ``cuda`` when NVML sees a GPU and ``sim`` otherwise;
``node_gpus(kind, ...)`` lists the GPUs a node coordinator owns as ``GpuSpec`` records (plain data:
``colocate.gpus.spec``). The
job side (memory caps, busy clocks inside the training process) is ``torch_hooks.device``.
"""

from __future__ import annotations

from colocate.base.env import DEVICE_CHOICES, DEVICES
from colocate.base.vocab import DeviceKind
from colocate.gpus.spec import GpuSpec


def cuda_available() -> bool:
    """True when NVML reports at least one NVIDIA GPU."""
    from colocate.gpus import nvml

    return nvml.device_count() > 0


def resolve(kind: str) -> DeviceKind:
    """Map ``auto|cuda|sim`` to a concrete kind; ValueError on anything else.

    ``auto`` on a machine with an NVIDIA driver but without ``nvidia-ml-py`` is an error too: it
    would otherwise fall back to simulated GPUs without a word."""
    from colocate.gpus import nvml

    if kind not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {kind!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if kind != DeviceKind.SIM and nvml.missing_binding():
        raise ValueError(f"--device {kind}: this machine has an NVIDIA driver but nvidia-ml-py is not installed: "
                         "pip install 'nvidia-ml-py>=12' (the gpu extra), or use --device sim")
    if kind == "auto":
        return DeviceKind.CUDA if cuda_available() else DeviceKind.SIM
    if kind == DeviceKind.CUDA and not cuda_available():
        raise ValueError("--device cuda: no CUDA GPU is visible (NVML found none); use --device sim or auto")
    return DeviceKind(kind)


def node_gpus(kind: str, sim_gpus: int | list[tuple[str, float]] = 1, sim_gpu_mem: int = 16 << 30) -> list[GpuSpec]:
    """The GPUs of this machine for a node coordinator; ``sim_gpus``: a count, or (type, speed) per GPU
    (``colocate.gpus.sim.parse_sim_gpus``)."""
    kind = resolve(kind)
    if kind == DeviceKind.CUDA:
        from colocate.gpus import nvml

        return nvml.node_gpus()
    from colocate.gpus import sim

    return sim.node_gpus(sim_gpus, sim_gpu_mem)


__all__ = ["GpuSpec", "DEVICES", "DEVICE_CHOICES", "resolve", "node_gpus", "cuda_available"]
