"""``genetic``: seed 004's GA placement (Kwon & Bahn, JIIBC 2024): at every cycle it plans which
pending job goes to which node next, by a genetic search over (node, job) pairs.

A solution is a pair [m, t] (two genes: a node row and a pending job). Its fitness is the GPU
utilization the pair adds to that machine: the job's worker demand (GPUs x milli) over the
machine's GPU capacity (its GPUs x 1000), so a task on a small machine raises that machine's
utilization more; 0 for a CPU-only worker that fits, -1 when the worker does not fit (model
constraint, CPU, host memory, whole GPUs or one GPU's free milli, on the planning copy).
``fitness = "after"`` reads the paper's "increased GPU utilization" as the machine's utilization
with the task (allocated + demand over capacity) instead: it prefers fuller machines (packing),
where "gain" is blind to a machine's load and spreads tasks over machines of one size.
One search: ``population`` random pairs (100); per generation ``replace`` (40%) of the population
is replaced, its lowest-fitness members, by children; each child takes its machine from one
parent and its job from another (one-point crossover: the only cut of a two-gene chromosome),
each parent the fittest of a tournament over ``tournament`` (20%) of the population (members
drawn with replacement, as PyGAD does); each gene of a child is then reset at random with
probability ``mutation_above`` (0.25) if the child's fitness exceeds the population's mean
fitness, else ``mutation_below`` (0.1) (adaptive mutation, as the paper's text states it). After
``generations`` the fittest pair [m*, t*] is planned (ties: lowest population index), applied to
the planning copy of free capacity (GPUs by first fit) and the search repeats for the remaining
jobs, until none is left, the best fitness is -1, or ``max_plan`` jobs are planned (a search
is skipped, as -1, when no remaining job fits any node: the common case in a full cluster).

Steering: ``queue_order`` examines the planned jobs first, in plan order, then the rest in the
queue's own order (the FIFO walk and its blocking apply to those); ``node_order`` offers the
planned node first, then every fitting node in join order (first fit); GPUs by first fit, as
on the planning copy. A gang's workers all prefer the planned node. Randomness: one numpy
generator per cycle seeded from the framework's ``rng``, so the same events give the same plan.
Own implementation, not PyGAD: PyGAD's adaptive mutation gives the higher rate to the
below-average solutions (the opposite of the paper's text) and it keeps no planning copy between
searches; the loop is 30 lines. Cost: per cycle, the fitness of every (job, node) pair once
(O(pending jobs x nodes) vectorized, looked up afterwards; computed per pair instead above 2M
pairs); per planned job ``generations`` x O(population) vectorized steps (~2-3 ms for 30) and
O(pending jobs) to update the planning copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cluster.jobs import Job, Request
from cluster.params import Param
from cluster.plugins._numpy import np  # imported at first use
from cluster.plugins.nodetable import TablePlugin, pick_first
from cluster.points import register
from cluster.spec import MILLI, JobSpec
from cluster.state import NodeState
from colocate.base.vocab import JobClass

PROB = (lambda v: 0 <= v <= 1, "a probability 0..1")


class Search:
    """The GA's view of one cycle: pending workers (arrays over jobs) and a planning copy of the
    node table (arrays over rows), with the fitness of pairs vectorized."""

    def __init__(self, table, specs: list[JobSpec], after: bool = False) -> None:
        n = table.rows
        self.after = after
        self.free = table.free[:n].copy()
        self.whole = table.whole[:n].copy()
        self.cpu = table.cpu[:n].copy()
        self.mem = table.mem[:n].copy()
        self.ngpu = table.ngpu[:n]
        self.maxfree = self.free.max(axis=1) if self.free.shape[1] else np.zeros(n, dtype=np.int32)
        self.used = (self.ngpu * MILLI - self.free.sum(axis=1)).astype(float)  # GPU milli allocated
        self.matrix: np.ndarray | None = None  # jobs x rows fitness, when tabulated
        self.up_rows = np.flatnonzero(table.up[:n])
        self.gpus = np.array([s.gpus for s in specs], dtype=np.int64)
        self.milli = np.array([s.gpu_milli for s in specs], dtype=np.int64)
        self.tcpu = np.array([s.cpu_milli for s in specs], dtype=float)
        self.tmem = np.array([s.mem_mib for s in specs], dtype=float)
        self.demand = (self.gpus * self.milli).astype(float)
        constraints = sorted({s.gpu_model for s in specs})
        cid = {c: i for i, c in enumerate(constraints)}
        self.cidx = np.array([cid[s.gpu_model] for s in specs], dtype=np.int64)
        self.okm = np.ones((len(constraints), n), dtype=bool)
        for c, i in cid.items():
            m = table.model_ok(c)
            if m is not None:
                self.okm[i] = m

    MATRIX = 1 << 21  # pairs up to which every fitness is computed once, then looked up

    def fitness(self, m: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Fitness of the pairs (rows ``m``, jobs ``t``), arrays of one shape (or broadcasting)."""
        if self.matrix is not None:
            return self.matrix[t, m]
        return self._fitness(m, t)

    def tabulate(self) -> None:
        """Compute every pair's fitness once (jobs x rows, when at most ``MATRIX``); ``place``
        keeps the changed column current."""
        n_t, n_m = len(self.gpus), len(self.ngpu)
        if 0 < n_t * n_m <= self.MATRIX:
            self.matrix = self._fitness(np.arange(n_m)[None, :], np.arange(n_t)[:, None])

    def _fitness(self, m: np.ndarray, t: np.ndarray) -> np.ndarray:
        g, milli = self.gpus[t], self.milli[t]
        ok = self.okm[self.cidx[t], m] & (self.cpu[m] >= self.tcpu[t]) & (self.mem[m] >= self.tmem[t])
        ok &= (g == 0) | np.where(milli >= MILLI, self.whole[m] >= g, self.maxfree[m] >= milli)
        cap = self.ngpu[m] * float(MILLI)
        gained = self.demand[t] + self.used[m] if self.after else self.demand[t]
        gain = np.where(cap > 0, gained / np.where(cap > 0, cap, 1.0), 0.0)
        return np.where(ok, gain, -1.0)

    def any_fit(self, tasks: np.ndarray) -> bool:
        """Whether a worker of some job in ``tasks`` fits some up node of the copy (when none
        does, every search returns -1: it is skipped). O(distinct shapes x nodes)."""
        shapes = np.unique(np.stack([self.gpus[tasks], self.milli[tasks], self.tcpu[tasks], self.tmem[tasks],
                                     self.cidx[tasks]], axis=1), axis=0)
        rows = self.up_rows
        for g, milli, cpu, mem, c in shapes.tolist():
            ok = self.okm[int(c), rows] & (self.cpu[rows] >= cpu) & (self.mem[rows] >= mem)
            if g:
                ok &= (self.whole[rows] >= g) if milli >= MILLI else (self.maxfree[rows] >= milli)
            if ok.any():
                return True
        return False

    def place(self, m: int, t: int, workers: int) -> bool:
        """Apply ``workers`` workers of job ``t`` to row ``m`` of the copy (GPUs by first fit);
        False (copy unchanged) when they do not all fit there."""
        g, milli = int(self.gpus[t]), int(self.milli[t])
        row = self.free[m].copy()
        if self.cpu[m] < self.tcpu[t] * workers or self.mem[m] < self.tmem[t] * workers:
            return False
        for _ in range(workers):
            if g:
                idx = np.flatnonzero(row >= (MILLI if milli >= MILLI else milli))[:g]
                if len(idx) < g:
                    return False
                row[idx] -= milli
        self.used[m] += float(self.free[m].sum() - row.sum())
        self.free[m] = row
        self.whole[m] = int((row[:self.ngpu[m]] == MILLI).sum())
        self.maxfree[m] = row.max() if len(row) else 0
        self.cpu[m] -= self.tcpu[t] * workers
        self.mem[m] -= self.tmem[t] * workers
        if self.matrix is not None:
            self.matrix[:, m] = self._fitness(np.array([m]), np.arange(len(self.gpus)))
        return True


def mutation_rate(child_fit: np.ndarray, mean_fit: float, p: dict) -> np.ndarray:
    """The paper's adaptive mutation: ``mutation_above`` for a child fitter than the population's
    mean, ``mutation_below`` otherwise (per gene)."""
    return np.where(child_fit > mean_fit, p["mutation_above"], p["mutation_below"])


def evolve(s: Search, tasks: np.ndarray, rng: np.random.Generator, p: dict) -> tuple[int, int, float]:
    """One GA search over pairs (row in ``s.up_rows``, job in ``tasks``): the fittest pair."""
    size = p["population"]
    rows = s.up_rows
    pm = rows[rng.integers(len(rows), size=size)]
    pt = tasks[rng.integers(len(tasks), size=size)]
    fit = s.fitness(pm, pt)
    k = max(1, round(p["tournament"] * size))
    nrep = max(1, round(p["replace"] * size))
    gens = p["generations"]
    # every draw of the search at once (fewer numpy calls): tournaments (PyGAD's: members drawn
    # with replacement), mutation coins per gene, and the genes a mutation would bring
    tours = rng.integers(size, size=(gens, 2 * nrep, k))
    coins = rng.random((gens, 2, nrep))
    new_m = rows[rng.integers(len(rows), size=(gens, nrep))]
    new_t = tasks[rng.integers(len(tasks), size=(gens, nrep))]
    pick = np.arange(2 * nrep)
    for g in range(gens):
        sample = tours[g]
        winners = sample[pick, fit[sample].argmax(axis=1)]
        cm, ct = pm[winners[:nrep]], pt[winners[nrep:]]
        rate = mutation_rate(s.fitness(cm, ct), fit.mean(), p)
        cm = np.where(coins[g, 0] < rate, new_m[g], cm)
        ct = np.where(coins[g, 1] < rate, new_t[g], ct)
        worst = np.argsort(fit, kind="stable")[:nrep]
        pm[worst], pt[worst], fit[worst] = cm, ct, s.fitness(cm, ct)
    best = int(fit.argmax())
    return int(pm[best]), int(pt[best]), float(fit[best])


@register
class Genetic(TablePlugin):
    name = "genetic"
    PARAMS = {
        "population": Param(100, "int", lambda v: v >= 2, "solutions per population, >= 2"),
        "tournament": Param(0.2, "float", lambda v: 0 < v <= 1, "tournament size as a share of the population"),
        "replace": Param(0.4, "float", lambda v: 0 < v <= 1, "share of the population replaced per generation"),
        "mutation_above": Param(0.25, "float", *PROB),
        "mutation_below": Param(0.1, "float", *PROB),
        "generations": Param(30, "int", lambda v: v >= 0, "generations per search, >= 0"),
        "max_plan": Param(0, "int", lambda v: v >= 0, "jobs planned per cycle at most (0: no limit)"),
        "fitness": Param("gain", "str", doc="gain: utilization the task adds to the machine; after: the "
                         "machine's utilization with the task", choices=("gain", "after")),
    }

    def bind(self, fw) -> None:
        super().bind(fw)
        self.plan: dict[str, int] = {}  # job id -> planned row, in plan order
        self.searches = 0

    def cycle_start(self, now: float) -> None:
        self.plan = {}
        jobs = [j for lst in self.fw.queues.values() for j in lst if j.spec.klass == JobClass.GUARANTEED]
        if not jobs:
            return
        self.table.sync(self.fw.state)
        s = Search(self.table, [j.spec for j in jobs], self.p["fitness"] == "after")
        s.tabulate()
        if not len(s.up_rows):
            return
        rng = np.random.default_rng(self.fw.rng.getrandbits(64))
        left = np.arange(len(jobs))
        limit = self.p["max_plan"] or len(jobs)
        while len(left) and len(self.plan) < limit and s.any_fit(left):
            self.searches += 1
            m, t, f = evolve(s, left, rng, self.p)
            if f < 0:
                break
            if s.place(m, t, jobs[t].spec.workers):
                self.plan[jobs[t].job_id] = m
            left = left[left != t]

    def queue_order(self, queue: str, jobs: list[Job]) -> Iterable[Job]:
        if not self.plan:
            return jobs
        planned = [j for j in jobs if j.job_id in self.plan]
        if not planned:
            return jobs
        rank = {jid: i for i, jid in enumerate(self.plan)}
        planned.sort(key=lambda j: rank[j.job_id])
        return planned + [j for j in jobs if j.job_id not in self.plan]

    def node_order(self, req: Request) -> Iterator[NodeState]:
        ok = self.candidates(req)
        rows = np.flatnonzero(ok)
        m = self.plan.get(req.job.job_id)
        if m is not None and m < len(ok) and ok[m]:
            rows = np.concatenate(([m], rows[rows != m]))
        return self.table.yield_rows(rows)

    def pick_gpus(self, req: Request, node: NodeState) -> tuple[int, ...] | None:
        return pick_first(node, req.gpus, req.milli, req.mem)
