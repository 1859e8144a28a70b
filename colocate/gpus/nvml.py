"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), for the node side.

Every function degrades quietly where NVML is missing or fails: counts and totals become 0 and
``visible_device`` falls back to the index. Indices are NVML's (the order ``nvidia-smi`` shows).
"""

from __future__ import annotations

from colocate.base.vocab import DeviceKind
from colocate.gpus.spec import GpuSpec


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def device_count() -> int:
    try:
        return int(_nvml().nvmlDeviceGetCount())
    except Exception:
        return 0


def missing_binding() -> bool:
    """True when this machine has an NVIDIA driver but ``nvidia-ml-py`` is not installed
    (the CUDA path then cannot see the GPUs: install the ``gpu`` extra, ``nvidia-ml-py``)."""
    import importlib.util
    import os

    return importlib.util.find_spec("pynvml") is None and os.path.exists("/dev/nvidiactl")


def node_gpus() -> list[GpuSpec]:
    pynvml = _nvml()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name = pynvml.nvmlDeviceGetName(h)
        if isinstance(name, bytes):  # older nvidia-ml-py
            name = name.decode(errors="replace")
        out.append(GpuSpec(index=i, kind=DeviceKind.CUDA, mem_total=int(mem.total), name=str(name)))
    return out


def memory_total(index: int) -> int:
    """Total memory of NVML device ``index`` in bytes; 0 when NVML cannot tell."""
    try:
        pynvml = _nvml()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total)
    except Exception:
        return 0


def visible_device(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES value that selects NVML device ``index``.

    CUDA numbers devices fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
    NVML in its own order: the UUID names the same GPU for both. Falls back to
    the index when NVML cannot tell."""
    try:
        pynvml = _nvml()
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        return str(uuid) if uuid else str(index)
    except Exception:
        return str(index)


def utilization(index: int) -> float:
    """Device utilization 0..1 over NVML's last sample period."""
    pynvml = _nvml()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0


def memory_used(index: int) -> int:
    """Bytes in use on NVML device ``index`` (every process on it); 0 when NVML cannot tell."""
    try:
        pynvml = _nvml()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
    except Exception:
        return 0


def hardware(index: int) -> dict:
    """What NVML says of device ``index`` that a run-time model needs, as ``HardwareFeatures`` fields:
    ``name``, ``mem_total`` (bytes), ``sm_clock_mhz``/``mem_clock_mhz`` (maximum clocks), ``mem_bandwidth``
    (bytes/s: memory clock x 2 (double data rate) x bus width; HBM reports its own clock, so this is its
    bandwidth too) and ``peak_flops`` (FP32: CUDA cores x 2 x SM clock, where this NVML reports cores). A
    field NVML cannot give is 0 (an empty name); never raises."""
    out: dict = {"name": "", "mem_total": 0, "sm_clock_mhz": 0, "mem_clock_mhz": 0, "mem_bandwidth": 0.0,
                 "peak_flops": 0.0}
    try:
        pynvml = _nvml()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return out

    def ask(fn, *args):
        try:
            return fn(h, *args)
        except Exception:
            return None

    name = ask(pynvml.nvmlDeviceGetName)
    out["name"] = (name.decode(errors="replace") if isinstance(name, bytes) else str(name or ""))[:128]
    mem = ask(pynvml.nvmlDeviceGetMemoryInfo)
    out["mem_total"] = int(mem.total) if mem is not None else 0
    out["sm_clock_mhz"] = int(ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM) or 0)
    out["mem_clock_mhz"] = int(ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM) or 0)
    bus_bits = int(ask(pynvml.nvmlDeviceGetMemoryBusWidth) or 0) if hasattr(pynvml, "nvmlDeviceGetMemoryBusWidth") else 0
    out["mem_bandwidth"] = out["mem_clock_mhz"] * 1e6 * 2 * bus_bits / 8
    cores = int(ask(pynvml.nvmlDeviceGetNumGpuCores) or 0) if hasattr(pynvml, "nvmlDeviceGetNumGpuCores") else 0
    out["peak_flops"] = cores * 2.0 * out["sm_clock_mhz"] * 1e6
    return out
