"""``best_fit``: the FGD paper's Best-fit baseline (ATC'23, after Panigrahy et al.; its simulator's
BestFitScore): a guaranteed worker goes to the node that would have the least left over,
measured as ``0.5 * (free CPU - request) / max CPU + 0.5 * (free GPU milli - request) / max GPU
milli``, where free GPU milli is the sum over the node's GPUs and the maxima are those of the
largest node in the cluster (not of this node); ties go to the earlier-joined node. Within the
node a share goes to the GPU with the least free milli that fits, whole GPUs to free ones by index.
A node that does not state its CPU contributes no CPU term.

Why not ``binpack``: binpack ranks by free whole GPUs only (closest count, CPU ignored) and sends
a share to the fullest partially used GPU cluster-wide; the FGD paper's best-fit mixes CPU and the
node's total free GPU milli. The two agree only on GPU-only whole-GPU workloads.
Cost per worker: O(nodes) vectorized.
"""

from __future__ import annotations

from collections.abc import Iterator

from cluster.fitting import pick_guaranteed
from cluster.jobs import Request
from cluster.params import Param
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import TablePlugin
from cluster.points import register
from cluster.state import NodeState


def leftover(table, rows: np.ndarray, cpu: int, demand_milli: int, w_cpu: float) -> np.ndarray:
    """The best-fit measure of ``rows`` for a worker of ``cpu`` milli-cores and ``demand_milli``
    GPU milli in all (lower is a better fit)."""
    n = table.rows
    max_cpu = float(table.cpu_cap[:n].max(initial=0))
    max_gpu = float(table.ngpu[:n].max(initial=0)) * 1000.0
    score = np.zeros(len(rows))
    if max_cpu > 0:
        tracked = table.cpu_cap[rows] > 0
        score += np.where(tracked, (np.where(tracked, table.cpu[rows], 0) - cpu) / max_cpu, 0.0) * w_cpu
    if max_gpu > 0:
        score += (table.free[rows].sum(axis=1) - demand_milli) / max_gpu * (1.0 - w_cpu)
    return score


@register
class BestFit(TablePlugin):
    name = "best_fit"
    PARAMS = {"cpu_weight": Param(0.5, "float", lambda v: 0 <= v <= 1, "weight of the CPU term, 0..1 (GPU: 1 - it)")}

    def node_order(self, req: Request) -> Iterator[NodeState]:
        rows = np.flatnonzero(self.candidates(req))
        score = leftover(self.table, rows, req.cpu, req.gpus * req.milli, self.p["cpu_weight"])
        return self.table.yield_rows(rows[np.argsort(score, kind="stable")])

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_guaranteed(node, req.gpus, req.milli, req.mem, best_fit=True)
