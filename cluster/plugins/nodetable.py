"""``NodeTable``: a numpy mirror of every node's free capacity, for placement plugins that rank
all nodes at once (first_fit, round_robin, best_fit, tetris, fgd, genetic). Not a plugin.

Rows are nodes in the order they first joined (``ClusterState.nodes`` order; a node that
rejoins keeps its row). Per row: free guaranteed milli of each GPU (``free``, shape rows x
widest node, 0 past the node's GPU count), free whole GPUs, free CPU and host memory (``inf``
when the node does not state them), GPU count, capacities, GPU-model id and the up flag. GPU
memory is not mirrored (the trace formats never state it); the framework's ``fit`` filter still
checks every resource on the real state, so a stale row can cost a worse choice, never an
over-allocation.

Freshness contract (``sync`` at the top of every ``node_order``; ``touch`` from ``reserve`` /
``unreserve`` marks rows to re-read at the next sync): rows are re-read
  * for nodes added since the last sync, and for every node whose signature (object, up, free
    whole GPUs, CPU and memory allocated, slot count) changed, whenever ``state.version`` moved
    (joins, releases and a node going down bump it);
  * for the nodes of a placement the owning plugin reserved or unreserved (``touch``);
  * for the nodes holding earlier workers of the gang being placed, and those of the previous
    attempt (a failed gang is discarded without any notice).
Allocations made by other plugins within a cycle (opportunistic slots) are seen after the next
release or join. Cost: O(rows) vectorized per query; O(rows) signatures in Python only when the
version moved.
"""

from __future__ import annotations

from cluster.jobs import Request
from cluster.plugins._numpy import np  # imported at first use
from cluster.points import SUCCESS, Plugin, Status
from cluster.spec import MILLI, allowed_models
from cluster.state import ClusterState, NodeState
from cluster.statement import Statement
from colocate.base.vocab import JobClass

INF = float("inf")


class NodeTable:
    def __init__(self) -> None:
        self.rows = 0
        self.width = 1
        self.nodes: list[NodeState] = []
        self.row_of: dict[str, int] = {}
        self.models: dict[str, int] = {"": 0}
        self._sig: list[tuple] = []
        self.version = -1
        self._last_gang: list[NodeState] = []
        self._pending: dict[str, None] = {}
        self._masks: dict[str, tuple[int, np.ndarray]] = {}
        cap = 16
        self.free = np.zeros((cap, 1), dtype=np.int32)
        self.whole = np.zeros(cap, dtype=np.int32)
        self.ngpu = np.zeros(cap, dtype=np.int32)
        self.cpu = np.zeros(cap)
        self.mem = np.zeros(cap)
        self.cpu_cap = np.zeros(cap)
        self.mem_cap = np.zeros(cap)
        self.model = np.zeros(cap, dtype=np.int32)
        self.up = np.zeros(cap, dtype=bool)

    # ------------------------------------------------------------------ upkeep

    def _grow(self, rows: int, width: int) -> None:
        cap = len(self.whole)
        if rows > cap or width > self.width:
            new = max(cap, 16)
            while new < rows:
                new *= 2
            w = max(width, self.width)
            free = np.zeros((new, w), dtype=np.int32)
            free[:cap, :self.width] = self.free
            self.free, self.width = free, w
            for name in ("whole", "ngpu", "cpu", "mem", "cpu_cap", "mem_cap", "model", "up"):
                old = getattr(self, name)
                arr = np.zeros(new, dtype=old.dtype)
                arr[:cap] = old
                setattr(self, name, arr)

    @staticmethod
    def _signature(node: NodeState) -> tuple:
        return (id(node), node.up, node.free, node.cpu, node.host_mem, len(node.slots))

    def refresh(self, node: NodeState) -> None:
        """Re-read one node's row from the state."""
        i = self.row_of[node.node_id]
        self.nodes[i] = node
        spec = node.spec
        g = spec.gpus
        self._grow(self.rows, g)
        row = self.free[i]
        row[:] = 0
        for gpu in node.gpus:
            row[gpu.index] = MILLI - gpu.milli
        self.whole[i] = node.free
        self.ngpu[i] = g
        self.cpu[i] = spec.cpu_milli - node.cpu if spec.cpu_milli else INF
        self.mem[i] = spec.mem_mib - node.host_mem if spec.mem_mib else INF
        self.cpu_cap[i] = spec.cpu_milli
        self.mem_cap[i] = spec.mem_mib
        m = self.models.get(node.model)
        if m is None:
            m = self.models[node.model] = len(self.models)
        self.model[i] = m
        self.up[i] = node.up
        self._sig[i] = self._signature(node)

    def sync(self, state: ClusterState, gang: dict | None = None) -> None:
        """Bring the table up to date (see the module docstring); ``gang``: the request's
        ``gang_nodes`` (nodes holding workers placed earlier in this attempt)."""
        if len(state.nodes) != self.rows or state.version != self.version:
            if len(state.nodes) > self.rows:
                self._grow(len(state.nodes), 1)
                for node_id in list(state.nodes)[self.rows:]:
                    self.row_of[node_id] = len(self.nodes)
                    self.nodes.append(state.nodes[node_id])
                    self._sig.append(())
                self.rows = len(self.nodes)
            sig = self._signature
            for i, node in enumerate(state.nodes.values()):
                if sig(node) != self._sig[i]:
                    self.refresh(node)
            self.version = state.version
        if self._pending:
            for node_id in self._pending:
                pending = state.nodes.get(node_id)
                if pending is not None and node_id in self.row_of:
                    self.refresh(pending)
            self._pending.clear()
        for node in self._last_gang:
            self.refresh(node)
        self._last_gang = list(gang) if gang else []
        for node in self._last_gang:
            self.refresh(node)

    def touch(self, node_ids) -> None:
        """Re-read the rows of ``node_ids`` at the next ``sync`` (after a reserve/unreserve: an
        unreserved statement is discarded only after the notice)."""
        for node_id in node_ids:
            self._pending[node_id] = None

    # ------------------------------------------------------------------ queries

    def model_ok(self, constraint: str) -> np.ndarray | None:
        """Rows whose GPU model satisfies ``constraint`` (``model_allows``); None: every row."""
        if not constraint:
            return None
        got = self._masks.get(constraint)
        if got is None or got[0] != len(self.models):
            allowed = allowed_models(constraint)
            lut = np.zeros(len(self.models), dtype=bool)
            for name, k in self.models.items():
                lut[k] = name in allowed
            got = self._masks[constraint] = (len(self.models), lut)
        return got[1][self.model[:self.rows]]

    def fits(self, gpus: int, milli: int, cpu: int, mem: int, model: str) -> np.ndarray:
        """Rows where one worker (``gpus`` GPUs of ``milli`` each, ``cpu`` milli-cores, ``mem``
        MiB, model constraint) fits now: boolean array of length ``rows``."""
        n = self.rows
        ok = self.up[:n].copy()
        if cpu:
            ok &= self.cpu[:n] >= cpu
        if mem:
            ok &= self.mem[:n] >= mem
        mm = self.model_ok(model)
        if mm is not None:
            ok &= mm
        if gpus:
            if milli >= MILLI:
                ok &= self.whole[:n] >= gpus
            else:
                ok &= (self.free[:n] >= milli).any(axis=1)
        return ok

    def request_fits(self, req) -> np.ndarray:
        return self.fits(req.gpus, req.milli, req.cpu, req.host_mem, req.model)

    def yield_rows(self, rows):
        """The up NodeStates of ``rows`` (an index array), lazily, in that order."""
        nodes = self.nodes
        for i in rows.tolist():
            node = nodes[i]
            if node.up:
                yield node


def pick_first(node: NodeState, gpus: int, milli: int, mem: int) -> tuple[int, ...] | None:
    """GPU indices for one guaranteed worker by first fit: the lowest-indexed free GPUs (whole
    GPUs), or the lowest-indexed GPU with ``milli`` free (a share); None when none fit."""
    if gpus == 0:
        return ()
    got = []
    for gpu in node.gpus:
        if gpu.milli + milli <= MILLI and (not mem or gpu.mem_free() >= mem):
            got.append(gpu.index)
            if len(got) == gpus:
                return tuple(got)
    return None


class TablePlugin(Plugin):
    """Base of the placement plugins that rank every node through a ``NodeTable``: places
    guaranteed workers, keeps ``self.table`` fresh (reserve/unreserve mark the statement's
    nodes). Subclasses implement ``node_order`` (usually ``self.candidates(req)`` then an
    order) and ``pick_gpus``; they define no ``score``, so the framework takes the first
    candidate that passes the filters and ``feasible_nodes`` never truncates the ranking."""

    serves = frozenset((JobClass.GUARANTEED,))

    def bind(self, fw) -> None:
        super().bind(fw)
        self.table = NodeTable()

    def candidates(self, req: Request) -> np.ndarray:
        """Sync the table; the rows where ``req``'s worker fits (boolean)."""
        self.table.sync(self.fw.state, req.gang_nodes)
        return self.table.request_fits(req)

    def reserve(self, req: Request, stmt: Statement) -> Status:
        self.table.touch(stmt.nodes())
        return SUCCESS

    def unreserve(self, req: Request, stmt: Statement) -> None:
        self.table.touch(stmt.nodes())
