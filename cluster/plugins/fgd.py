"""``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23).

Definitions (as in the paper and its simulator's ``NodeGpuShareFragAmount``; GPU amounts in milli):
  * a task type m = (CPU milli-cores, GPUs, milli per GPU, GPU-model constraint), popularity p_m;
  * F_n(m), the GPU resource of node n that task type m cannot use:
      - m needs no GPU: every free GPU milli on n (such a task can use none of it);
      - n's model is not allowed by m, or n has fewer than m.gpus GPUs with >= m.milli free, or
        less free CPU than m.cpu: every free GPU milli on n;
      - otherwise: the free milli of the GPUs with less than m.milli free
        (for whole-GPU types: of every partially allocated GPU);
  * F_n(M) = sum_m p_m F_n(m); the cluster's fragmentation is sum_n F_n(M).
FGD places a worker where F_n(M) grows least: for every node that fits and, for a share, every
GPU there with enough free milli, it computes Delta = F_n(M) after - before, and takes the
smallest (ties: the earlier-joined node, then the lower GPU index). Whole GPUs: the lowest-indexed
free ones (which free GPUs does not change F). Host memory and GPU memory take no part in F
(the simulator's task types have none), though the ``fit`` filter still enforces them.

The workload M: ``popularity`` (a table ``"CPU:GPUS:MILLI[:MODELS]" = weight``) when given,
else learned online from every job submitted so far (pre_enqueue). The most popular types are
kept until they cover ``coverage`` of the jobs, weights renormalized; the default keeps them all.
(The simulator's "typical pods" stop at 95%: on the openb trace that drops every 2/4/8-GPU type,
0.9% of the pods but 7% of the GPU demand, and FGD then spreads single-GPU pods over the 8-GPU
nodes: 90.7% allocation instead of 94.7% in ``benchmarks/placement.py c``.) Departures from the
simulator: Delta is used exactly (it squashes it through a sigmoid into an integer 0..100 score
and breaks ties at random; both tried, no better).

Cost per worker: O(nodes x K) vectorized for whole GPUs and CPU-only workers, O(nodes x GPUs
per node x K) for a share, K = number of task types kept (35 for the openb default trace).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import NodeTable, TablePlugin, pick_first
from cluster.points import SUCCESS, Status, register
from cluster.spec import MILLI, JobSpec, model_allows
from cluster.state import NodeState

TypeKey = tuple[int, int, int, str]  # (cpu_milli, gpus, milli per GPU (0: no GPU), model constraint)


def type_of(spec: JobSpec) -> TypeKey:
    """A job's task type: one worker's CPU, GPUs, milli per GPU and model constraint."""
    return (spec.cpu_milli, spec.gpus, spec.gpu_milli if spec.gpus else 0, spec.gpu_model)


def parse_type(text: str) -> TypeKey:
    """``"CPU:GPUS:MILLI"`` or ``"CPU:GPUS:MILLI:MODELS"`` -> a type key; ValueError if malformed."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"task type {text!r}: expected CPU:GPUS:MILLI[:MODELS]")
    cpu, gpus, milli = (int(x) for x in parts[:3])
    if cpu < 0 or gpus < 0 or not (0 <= milli <= MILLI) or (gpus and not milli) or (milli < MILLI and gpus > 1):
        raise ValueError(f"task type {text!r}: bad numbers")
    return (cpu, gpus, milli if gpus else 0, parts[3] if len(parts) == 4 else "")


def typical(counts: Mapping[TypeKey, float], coverage: float) -> list[tuple[TypeKey, float]]:
    """The most popular types until they cover ``coverage`` of the total, weights renormalized to
    sum 1; ordered by weight descending, then key (deterministic)."""
    total = float(sum(counts.values()))
    if total <= 0:
        return []
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out, cum = [], 0.0
    for key, w in ranked:
        if cum >= coverage * total - 1e-9:
            break
        out.append((key, w))
        cum += w
    return [(k, w / cum) for k, w in out]


def node_fragment(free: list[int], cpu_free: float, model: str, types: list[tuple[TypeKey, float]]) -> float:
    """F_n(M) for one node, plainly (the reference the vectorized code is tested against):
    ``free`` is the free milli of each GPU, ``cpu_free`` the free milli-cores (inf: not tracked)."""
    total = sum(free)
    out = 0.0
    for (cpu, gpus, milli, constraint), p in types:
        usable = (gpus > 0 and model_allows(constraint, model) and cpu_free >= cpu
                  and sum(1 for f in free if f >= milli) >= gpus)
        out += p * (sum(f for f in free if f < milli) if usable else total)
    return out


class TypicalWorkload:
    """Task types as arrays for the vectorized measure."""

    def __init__(self, types: list[tuple[TypeKey, float]]) -> None:
        self.types = types
        self.cpu = np.array([k[0] for k, _ in types], dtype=float)
        self.gpus = np.array([k[1] for k, _ in types], dtype=np.int64)
        self.milli = np.array([k[2] if k[1] else MILLI + 1 for k, _ in types], dtype=np.int64)
        self.p = np.array([w for _, w in types], dtype=float)
        self.constraints = [k[3] for k, _ in types]
        self._okm: tuple | None = None

    def model_ok(self, table: NodeTable) -> np.ndarray:
        """(rows, K): the node may run type k (model allowed and the type needs a GPU)."""
        key = (table.rows, len(table.models), table.version)
        if self._okm is None or self._okm[0] != key:
            okm = np.zeros((table.rows, len(self.types)), dtype=bool)
            for k, c in enumerate(self.constraints):
                if self.gpus[k] > 0:
                    m = table.model_ok(c)
                    okm[:, k] = True if m is None else m
            self._okm = (key, okm)
        return self._okm[1]


def _measure(wl: TypicalWorkload, okm, cnt, part, tot, cpu) -> np.ndarray:
    """sum_k p_k F(k) given per-type counts of GPUs with enough free milli, the free milli of the
    GPUs without, the node's total free milli and free CPU (shapes broadcast over a last K axis)."""
    sat = okm & (wl.gpus > 0) & (cnt >= wl.gpus) & (cpu[..., None] >= wl.cpu)
    return (np.where(sat, part, tot[..., None]) * wl.p).sum(axis=-1)


def fragmentation(table: NodeTable, wl: TypicalWorkload, rows: np.ndarray | None = None) -> np.ndarray:
    """F_n(M) for ``rows`` (default: every row), in milli-GPUs."""
    if rows is None:
        rows = np.arange(table.rows)
    if not len(wl.types):
        return np.zeros(len(rows))
    free = table.free[rows].astype(np.int64)
    ge = free[:, :, None] >= wl.milli
    cnt = ge.sum(axis=1)
    part = np.where(ge, 0, free[:, :, None]).sum(axis=1)
    return _measure(wl, wl.model_ok(table)[rows], cnt, part, free.sum(axis=1), table.cpu[rows])


def deltas(table: NodeTable, wl: TypicalWorkload, rows: np.ndarray, gpus: int, milli: int, cpu: int) -> tuple[np.ndarray, np.ndarray]:
    """Increase of F_n(M) if one worker (``gpus`` x ``milli``, ``cpu``) is placed on each of
    ``rows`` (all of which fit it), and for a share the GPU index that gives it."""
    free = table.free[rows].astype(np.int64)
    best_gpu = np.full(len(rows), -1, dtype=np.int64)
    if not len(wl.types) or not len(rows):
        return np.zeros(len(rows)), best_gpu
    okm = wl.model_ok(table)[rows]
    c = table.cpu[rows]
    tot = free.sum(axis=1)
    ge = free[:, :, None] >= wl.milli  # (R, G, K)
    cnt = ge.sum(axis=1)
    part = np.where(ge, 0, free[:, :, None]).sum(axis=1)
    before = _measure(wl, okm, cnt, part, tot, c)
    if gpus == 0 or milli >= MILLI:
        after = _measure(wl, okm, cnt - gpus, part, tot - gpus * milli, c - cpu)
        return after - before, best_gpu
    r, j = np.nonzero(free >= milli)  # the (node, GPU) pairs that can take the share
    f = free[r, j]
    f2 = f - milli
    ge1, ge2 = f[:, None] >= wl.milli, f2[:, None] >= wl.milli  # (V, K)
    cnt2 = cnt[r] - ge1 + ge2
    part2 = part[r] - np.where(ge1, 0, f[:, None]) + np.where(ge2, 0, f2[:, None])
    d = _measure(wl, okm[r], cnt2, part2, tot[r] - milli, c[r] - cpu) - before[r]
    first = np.lexsort((j, d, r))  # per node: the smallest increase, then the lowest GPU index
    keep = first[np.r_[True, r[first][1:] != r[first][:-1]]]
    out = np.full(len(rows), np.inf)
    out[r[keep]] = d[keep]
    best_gpu[r[keep]] = j[keep]
    return out, best_gpu

def _parse_popularity(v: dict) -> bool:
    try:
        for k, w in v.items():
            parse_type(k)
            if w < 0:
                return False
    except ValueError:
        return False
    return True


@register
class FGD(TablePlugin):
    name = "fgd"
    PARAMS = {
        "popularity": Param({}, "dict[str,float]", _parse_popularity,
                            'task type "CPU:GPUS:MILLI[:MODELS]" = weight >= 0 (empty: learn from submitted jobs)'),
        "coverage": Param(1.0, "float", lambda v: 0 < v <= 1, "share of jobs the kept task types cover, 0 < c <= 1"),
    }

    def __init__(self, params) -> None:
        super().__init__(params)
        self._fixed = {parse_type(k): w for k, w in params["popularity"].items()}
        self._counts: Counter = Counter(self._fixed)
        self._dirty = True
        self.workload = TypicalWorkload([])
        self._choice: tuple | None = None  # (pid, rank, rows -> best GPU) of the last ranking

    def pre_enqueue(self, job: Job) -> Status:
        if not self._fixed and job.seq >= 0:  # seq -1: a validation probe, not a submit
            self._counts[type_of(job.spec)] += 1
            self._dirty = True
        return SUCCESS

    def current_workload(self) -> TypicalWorkload:
        if self._dirty:
            self.workload = TypicalWorkload(typical(self._counts, self.p["coverage"]))
            self._dirty = False
        return self.workload

    def node_order(self, req: Request) -> Iterator[NodeState]:
        rows = np.flatnonzero(self.candidates(req))
        d, gpu = deltas(self.table, self.current_workload(), rows, req.gpus, req.milli, req.cpu)
        order = np.argsort(d, kind="stable")
        self._choice = (req.pid, req.rank, dict(zip(rows.tolist(), gpu.tolist())))
        return self.table.yield_rows(rows[order])

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        if req.gpus == 0 or req.milli >= MILLI:
            return pick_first(node, req.gpus, req.milli, req.mem)
        row = self.table.row_of[node.node_id]
        j = -1
        if self._choice is not None and self._choice[:2] == (req.pid, req.rank):
            j = self._choice[2].get(row, -1)
        if j < 0:
            _, g = deltas(self.table, self.current_workload(), np.array([row]), req.gpus, req.milli, req.cpu)
            j = int(g[0])
        gpu = node.gpus[j] if 0 <= j < len(node.gpus) else None
        if gpu is None or gpu.milli + req.milli > MILLI or (req.mem and gpu.mem_free() < req.mem):
            return pick_first(node, req.gpus, req.milli, req.mem)
        return (j,)
