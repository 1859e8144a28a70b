"""What the known nodes could ever hold: the test behind "a request no node could ever hold is refused
at submit, and a pending job that no known node could hold is set aside".

Pure, no clock, no I/O. "Known nodes" are every node that has joined, up or down, each with the spec
it last registered (``ClusterState.shapes``), as if the cluster were empty: a job refused here cannot
start until the cluster itself changes, whatever else ends. Cost: O(distinct node shapes).

Per node shape, the workers of one job it could hold at once is the least of, for each resource the
node and the worker both state: its GPUs (whole GPUs: ``gpus // worker gpus``; a guaranteed
fractional share: ``1000 // milli`` per GPU; opportunistic workers take no share, but two ranks of
one gang never share a GPU, as the opportunistic plugin places them), GPU memory per GPU, CPU and
host memory. A resource a node does not state never limits it, as in placement.
"""

from __future__ import annotations

import math

from cluster.spec import MILLI, JobSpec, model_allows
from colocate.base.vocab import JobClass

INF = math.inf


def _per_node(spec: JobSpec, klass: str, gpus: int, gpu_mem: int, cpu: int, host_mem: int) -> float:
    """Workers of ``spec`` one empty node of this shape holds at once."""
    n = INF
    g = spec.gpus
    if g:
        if gpus < g:
            return 0
        per_gpu = 1 if klass != JobClass.GUARANTEED or spec.gpu_milli >= MILLI else MILLI // spec.gpu_milli
        if spec.gpu_mem and gpu_mem:
            per_gpu = min(per_gpu, gpu_mem // spec.gpu_mem)
        n = (gpus * per_gpu) // g
    if spec.cpu_milli and cpu:
        n = min(n, cpu // spec.cpu_milli)
    if spec.mem_mib and host_mem:
        n = min(n, host_mem // spec.mem_mib)
    return n


def _size(n: int) -> str:
    for unit, k in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= k:
            return f"{n / k:.4g} {unit}"
    return f"{n} bytes"


def never_fits(shapes: dict[tuple[int, str, int, int, int], int], spec: JobSpec, klass: str) -> str | None:
    """Why no placement of ``spec``'s gang as ``klass`` could ever be made on nodes of ``shapes``
    (``ClusterState.shapes``), or None when one could, or when no node is known (nothing to judge by).
    The reason is one line naming the request and what the largest known node offers."""
    if not shapes:
        return None
    model = f" {spec.gpu_model}" if spec.gpu_model else ""
    allowed = [(s, c) for s, c in shapes.items() if model_allows(spec.gpu_model, s[1])]
    if not allowed:
        return f"no known node has{model} GPUs (models: {', '.join(sorted({s[1] or 'unnamed or mixed' for s in shapes}))})"
    total = 0.0
    for (gpus, _, gpu_mem, cpu, host_mem), count in allowed:
        total += count * _per_node(spec, klass, gpus, gpu_mem, cpu, host_mem)
        if total >= spec.workers:
            return None
    g = spec.gpus
    largest = max(s[0] for s, _ in allowed)
    if g > largest:
        return f"a worker needs {g}{model} GPUs on one node; the largest node has {largest}"
    big = [s for s, _ in allowed if s[0] >= g]
    checks = (
        ("GPU memory per GPU", spec.gpu_mem if g else 0, [s[2] for s in big], _size),
        ("milli-CPU", spec.cpu_milli, [s[3] for s in big], str),
        ("MiB of host memory", spec.mem_mib, [s[4] for s in big], str),
    )
    for what, want, offered, fmt in checks:
        if want and all(o and o < want for o in offered):
            most = max(offered)
            return f"a worker needs {fmt(want)} {what}; the largest{model} node has {fmt(most)}"
    if total == 0:
        return f"no known{model} node can hold one worker ({g} GPUs" + (
            f", {spec.gpu_milli} milli" if spec.gpu_milli < MILLI else "") + ")"
    cap = sum(s[0] * c for s, c in allowed)
    if g and spec.gpu_milli >= MILLI and spec.workers * g > cap:
        return f"the gang needs {spec.workers * g}{model} GPUs; the cluster has {cap}"
    return f"the gang needs {spec.workers} workers at once; the known{model} nodes can hold {int(total)}"
