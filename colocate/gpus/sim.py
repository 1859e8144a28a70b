"""Simulated GPUs on the node side: which CPU core is each one's compute.

A simulated GPU is one CPU core of compute and a byte budget of memory. Jobs placed on the same
simulated GPU are pinned to the same core (``torch_hooks.device.sim``), so their device work
time-shares it as kernels of different processes time-share a GPU. Daemons and launchers keep
off those cores (``keep_off_cores``) so host-side work does not steal simulated device time.
"""

from __future__ import annotations

import os

from colocate.base.vocab import DeviceKind
from colocate.gpus.spec import SIM_NAME, GpuSpec


def default_core(index: int, ncores: int | None = None) -> int:
    """CPU core of sim GPU ``index``: counted down from the last core."""
    n = ncores or os.cpu_count() or 1
    return (n - 1 - index) % n


_claimed: list[int] = []  # descriptors of the core files this process holds (released when it ends)


def claim_cores(cores: dict[int, int], folder: str) -> list[str]:
    """Hold each simulated GPU's core for this node (``cores``: GPU index -> core; a file per core in ``folder``,
    the user's private runtime folder, flocked while the process lives); the warnings, one per core another node of this
    user on this machine holds already: their jobs would time-share that core, each slowed by the other's."""
    import fcntl

    warnings = []
    for gpu, core in sorted(cores.items()):
        path = os.path.join(folder, f"sim-core-{core}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            warnings.append(f"simulated GPU {gpu}'s core {core} is the core of another node's simulated GPU (pid "
                            f"{holder}): jobs on both share it, each slowed by the other's")
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _claimed.append(fd)
    return warnings


def core_of(env) -> int:
    """The core a job with this ``JobEnv`` runs on: COLOCATE_SIM_CORE, else its GPU's."""
    return env.sim_core if env.sim_core is not None else default_core(env.gpu)


# Relative speeds of simulated GPU types (the fastest = 1): the median, over the 26 single-GPU (model, batch
# size) configurations of Gavel's artifact (Narayanan et al., OSDI'20, scheduler/simulation_throughputs.json),
# of each type's throughput over the V100's (docs/simulator.md). Other types are declared: ``T4@0.6``.
SIM_TYPES = {"V100": 1.0, "P100": 0.81, "K80": 0.25}
MAX_SIM_GPUS = 64  # a node's GPUs (colocate.protocol.MAX_NODE_GPUS)
MIN_SIM_SPEED = 0.001  # the slowest type a node may declare (the protocol's SIM_SPEED)
_TYPE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def parse_sim_gpus(text: str) -> list[tuple[str, float]]:
    """``--sim-gpus``: ``N`` (N untyped GPUs of speed 1) or ``N:TYPE[@SPEED],...`` (e.g. ``2:V100,2:T4@0.6``),
    one (type, speed) per GPU in index order. A known type (``SIM_TYPES``) takes its table speed unless given;
    another needs ``@SPEED`` in [0.001, 1]; a type has one speed on a node. Raises ValueError with one line."""
    text = str(text).strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= MAX_SIM_GPUS:
            raise ValueError(f"must be a positive integer of at most {MAX_SIM_GPUS}, got {text}")
        return [("", 1.0)] * n
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in text.split(",")):
        count, colon, kind = part.partition(":")
        name, at, speed_s = kind.partition("@")
        name = name.strip()
        if not colon or not count.strip().isdigit() or not name or not set(name) <= _TYPE_CHARS or len(name) > 32:
            raise ValueError(f"expected N or N:TYPE[@SPEED] groups separated by commas (e.g. 2:V100,2:T4@0.6), "
                             f"got {part[:40]!r}")
        if at:
            try:
                speed = float(speed_s)
            except ValueError:
                raise ValueError(f"{name}: speed {speed_s[:20]!r} is not a number") from None
            if not MIN_SIM_SPEED <= speed <= 1:
                raise ValueError(f"{name}: speed must be in [{MIN_SIM_SPEED:g}, 1] (relative to the fastest type), "
                                 f"got {speed_s[:20]}")
        elif name in SIM_TYPES:
            speed = SIM_TYPES[name]
        else:
            raise ValueError(f"unknown GPU type {name!r}: give its speed as {name}@SPEED, or use one of "
                             f"{', '.join(f'{k} ({v:g})' for k, v in SIM_TYPES.items())}")
        said = next((sp for t, sp in out if t == name), speed)
        if said != speed:
            raise ValueError(f"{name}: one type, two speeds ({said:g} and {speed:g}): give each type one speed")
        out += [(name, speed)] * int(count)
    if not 1 <= len(out) <= MAX_SIM_GPUS:
        raise ValueError(f"1 to {MAX_SIM_GPUS} simulated GPUs in all, got {len(out)}")
    return out


def node_gpus(count: int | list[tuple[str, float]], mem_total: int) -> list[GpuSpec]:
    """The node's simulated GPUs: ``count`` untyped ones, or one per (type, speed) of ``parse_sim_gpus``."""
    types = [("", 1.0)] * count if isinstance(count, int) else list(count)
    if not types:
        raise ValueError(f"need at least one simulated GPU, got {count}")
    return [
        GpuSpec(index=i, kind=DeviceKind.SIM, mem_total=mem_total, name=t or SIM_NAME, core=default_core(i),
                speed=s)
        for i, (t, s) in enumerate(types)
    ]


def keep_off_cores(cores: set[int]) -> None:
    """Pin the calling process to the cores that are not simulated GPUs (if any are left)."""
    try:
        allowed = os.sched_getaffinity(0) - set(cores)
        if allowed:
            os.sched_setaffinity(0, allowed)
    except (AttributeError, OSError):
        pass


def release_for_exit(pids) -> int:
    """Before a stop signal reaches a job on a simulated GPU: every thread of ``pids`` moves to this process's own
    cores (the host's, off the simulated GPUs') and, where the OS allows, out of the idle scheduling class. An
    opportunistic job yields the GPU's core by that class, so on a busy core it would get almost no CPU time to end
    or to save its checkpoint (measured: a SIGTERMed job paused beside a busy guaranteed one still ran 10 s later).
    Returns the threads moved; never raises."""
    try:
        host = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return 0
    moved = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{int(pid)}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, host)
                moved += 1
            except OSError:  # gone, or not ours
                continue
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            except OSError:  # an unprivileged thread may not leave the idle class: its cores are enough
                pass
    return moved


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc; [] where it cannot be read)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:  # after "pid (comm)": state, ppid, pgrp
                out.append(int(e))
        except (OSError, IndexError, ValueError):
            continue
    return out


def declared(mem_total: int, core: int = 0, type_name: str = "", speed: float = 1.0) -> dict:
    """The declared spec of a simulated GPU, as ``HardwareFeatures`` fields: one CPU core of this host is its
    compute (``sm_count`` 1, ``sm_clock_mhz`` that core's maximum clock where sysfs says, else 0) and
    ``mem_total`` its byte budget; a simulated GPU has no memory clock, bandwidth or peak rate of its own
    (0: unknown). Its type (``--sim-gpus 1:K80``: ``type_name``, "" untyped) is its ``name``, and its
    relative ``speed`` its ``sim_speed``. Reads one small file; never raises."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{int(core)}/cpufreq/cpuinfo_max_freq") as f:
            mhz = int(f.read().strip()) // 1000  # kHz
    except (OSError, ValueError):  # no cpufreq in this container or VM
        mhz = 0
    return {"name": type_name or SIM_NAME, "mem_total": int(mem_total), "sm_count": 1, "sm_clock_mhz": mhz,
            "mem_clock_mhz": 0, "mem_bandwidth": 0.0, "peak_flops": 0.0, "sim_speed": float(speed)}
