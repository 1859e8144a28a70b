"""``tetris`` (Grandl et al., "Multi-resource Packing for Cluster Schedulers", SIGCOMM'14; seed
004's Tetris baseline): a guaranteed worker goes to the node with the largest alignment
``sum_r (demand_r / capacity_r) * (free_r / capacity_r)`` over r in (GPU, CPU, host memory),
both vectors normalized by that node's capacity (GPU: the worker's GPUs x milli over the node's
GPUs x 1000, free = the sum of its GPUs' free milli). A resource the node does not state adds
nothing. Ties go to the earlier-joined node. Within the node, a share goes to the GPU with the
least free milli that fits, whole GPUs to free ones by index. (Tetris's remaining-time and
fairness knobs are not modelled: the seed paper compares packing only.)
Cost per worker: O(nodes) vectorized.
"""

from __future__ import annotations

from collections.abc import Iterator

from cluster.fitting import pick_guaranteed
from cluster.jobs import Request
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import TablePlugin
from cluster.points import register
from cluster.state import NodeState


def alignment(table, rows: np.ndarray, gpu_milli: int, cpu: int, mem: int) -> np.ndarray:
    """Tetris's dot product for ``rows`` (higher is better aligned)."""
    score = np.zeros(len(rows))
    gcap = table.ngpu[rows] * 1000.0
    has = gcap > 0
    if gpu_milli:
        safe = np.where(has, gcap, 1.0)
        score += np.where(has, (gpu_milli / safe) * (table.free[rows].sum(axis=1) / safe), 0.0)
    for demand, free, cap in ((cpu, table.cpu, table.cpu_cap), (mem, table.mem, table.mem_cap)):
        if demand:
            c = cap[rows]
            tracked = c > 0
            safe = np.where(tracked, c, 1.0)
            score += np.where(tracked, (demand / safe) * (np.where(tracked, free[rows], 0.0) / safe), 0.0)
    return score


@register
class Tetris(TablePlugin):
    name = "tetris"

    def node_order(self, req: Request) -> Iterator[NodeState]:
        rows = np.flatnonzero(self.candidates(req))
        score = alignment(self.table, rows, req.gpus * req.milli, req.cpu, req.host_mem)
        return self.table.yield_rows(rows[np.argsort(-score, kind="stable")])

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_guaranteed(node, req.gpus, req.milli, req.mem, best_fit=True)
