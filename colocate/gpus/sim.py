"""Simulated GPUs on the node side: which CPU core is each one's compute.

A simulated GPU is one CPU core of compute and a byte budget of memory. Jobs placed on the same
simulated GPU are pinned to the same core (``torch_hooks.device.sim``), so their device work
time-shares it as kernels of different processes time-share a GPU. Daemons and launchers keep
off those cores (``keep_off_cores``) so host-side work does not steal simulated device time.
"""

from __future__ import annotations

import os

from colocate.gpus.spec import GpuSpec
from colocate.vocab import DeviceKind

SIM_NAME = "colocate-sim"  # the name of every simulated GPU (its declared spec: ``declared``)


def default_core(index: int, ncores: int | None = None) -> int:
    """CPU core of sim GPU ``index``: counted down from the last core."""
    n = ncores or os.cpu_count() or 1
    return (n - 1 - index) % n


def core_of(env) -> int:
    """The core a job with this ``JobEnv`` runs on: COLOCATE_SIM_CORE, else its GPU's."""
    return env.sim_core if env.sim_core is not None else default_core(env.gpu)


def node_gpus(count: int, mem_total: int) -> list[GpuSpec]:
    if count < 1:
        raise ValueError(f"need at least one simulated GPU, got {count}")
    return [
        GpuSpec(index=i, kind=DeviceKind.SIM, mem_total=mem_total, name=SIM_NAME, core=default_core(i))
        for i in range(count)
    ]


def keep_off_cores(cores: set[int]) -> None:
    """Pin the calling process to the cores that are not simulated GPUs (if any are left)."""
    try:
        allowed = os.sched_getaffinity(0) - set(cores)
        if allowed:
            os.sched_setaffinity(0, allowed)
    except (AttributeError, OSError):
        pass


def declared(mem_total: int, core: int = 0) -> dict:
    """The declared spec of a simulated GPU, as ``HardwareFeatures`` fields: one CPU core of this host is its
    compute (``sm_count`` 1, ``sm_clock_mhz`` that core's maximum clock where sysfs says, else 0) and
    ``mem_total`` its byte budget; a simulated GPU has no memory clock, bandwidth or peak rate of its own
    (0: unknown). Reads one small file; never raises."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{int(core)}/cpufreq/cpuinfo_max_freq") as f:
            mhz = int(f.read().strip()) // 1000  # kHz
    except (OSError, ValueError):  # no cpufreq in this container or VM
        mhz = 0
    return {"name": SIM_NAME, "mem_total": int(mem_total), "sm_count": 1, "sm_clock_mhz": mhz, "mem_clock_mhz": 0,
            "mem_bandwidth": 0.0, "peak_flops": 0.0}
