"""Resource fit on one node and the choice of GPUs there: the helpers placement plugins share.

Pure functions over ``NodeState``/``GpuState``; O(GPUs on the node). "Guaranteed fit" counts
guaranteed milli and allocated memory (opportunistic workers' memory included: a guaranteed
worker that states memory must find it allocatable); "opportunistic fit" and pick follow AntMan, in the one
rule the node shares (``colocate.base.pick``): the GPU's reported utilization is under a threshold, its free
memory (by the larger of allocation and report) fits, and it holds fewer than ``max_per_gpu``
opportunistic workers.
"""

from __future__ import annotations

from cluster.spec import MILLI
from cluster.state import GpuState, NodeState
from colocate.base.pick import fits, pick


def node_host_fits(node: NodeState, cpu: int, host_mem: int) -> bool:
    return (not cpu or node.cpu_free() >= cpu) and (not host_mem or node.host_mem_free() >= host_mem)


def gpu_fits_guaranteed(gpu: GpuState, milli: int, mem: int) -> bool:
    return gpu.milli + milli <= MILLI and (not mem or gpu.mem_free() >= mem)


def fits_guaranteed(node: NodeState, gpus: int, milli: int, mem: int) -> bool:
    """Whether ``gpus`` GPUs of ``milli`` each (and ``mem`` bytes each) are free on ``node``."""
    if gpus == 0:
        return True
    if milli >= MILLI:
        if node.free < gpus:
            return False
        if not mem or not node.spec.gpu_mem:
            return True
        n = 0
        for gpu in node.gpus:
            if gpu.milli == 0 and gpu.mem_free() >= mem:
                n += 1
                if n >= gpus:
                    return True
        return False
    for gpu in node.gpus:
        if gpu.milli + milli <= MILLI and (not mem or gpu.mem_free() >= mem):
            return True
    return False


def pick_guaranteed(node: NodeState, gpus: int, milli: int, mem: int, best_fit: bool = True) -> tuple[int, ...] | None:
    """GPU indices for one guaranteed worker, or None. Whole GPUs: free ones, those without
    opportunistic workers first, then by index. A fractional share: the GPU whose free milli is
    closest to the share (``best_fit``) or the emptiest one."""
    if gpus == 0:
        return ()
    if milli >= MILLI:
        if node.free < gpus:
            return None
        if mem:
            avail = [gpu for gpu in node.gpus if gpu.milli == 0 and gpu.mem_free() >= mem]
        else:
            avail = [gpu for gpu in node.gpus if gpu.milli == 0]
        clean = [gpu.index for gpu in avail if not gpu.o]
        if len(clean) >= gpus:
            return tuple(clean[:gpus])
        got = clean + [gpu.index for gpu in avail if gpu.o]
        return tuple(sorted(got[:gpus])) if len(got) >= gpus else None
    best = None
    for gpu in node.gpus:
        free = MILLI - gpu.milli
        if free >= milli and (not mem or gpu.mem_free() >= mem):
            if best is None or (free < best[0] if best_fit else free > best[0]):
                best = (free, gpu.index)
    return None if best is None else (best[1],)


def gpu_fits_opportunistic(gpu: GpuState, mem: int, max_util: float, max_per_gpu: int, pid: str | None = None) -> bool:
    """``colocate.base.pick.fits``, and the GPU holds no worker of placement ``pid`` yet (a gang's ranks need
    distinct GPUs)."""
    return fits(gpu, mem, max_util, max_per_gpu) and (pid is None or pid not in gpu.o)


def pick_opportunistic(node: NodeState, gpus: int, mem: int, max_util: float, max_per_gpu: int,
                       pid: str | None = None) -> tuple[int, ...] | None:
    """GPU indices for one opportunistic worker (``colocate.base.pick.pick``: least utilized first, beside a
    guaranteed worker on ties), none already holding a worker of placement ``pid``; None when fewer than
    ``gpus`` qualify."""
    rooms = node.gpus if pid is None else [g for g in node.gpus if pid not in g.o]
    return pick(rooms, gpus, mem, max_util, max_per_gpu)
