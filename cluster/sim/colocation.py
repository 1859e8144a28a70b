"""The co-location model: how fast jobs that share a GPU progress, and how busy that GPU is.

Inputs (measurements, not assumptions):
  * Lucid's measured pairs (ASPLOS'23 artifact, ``lucid_colocate_info.csv``): 1,388 pairs of
    single-GPU training jobs of 11 models x batch size x AMP (56 configurations) sharing one GPU,
    each job's speed relative to running alone (``speed1``/``speed2``) and the pair's GPU
    utilization (``gpu_util``, percent). Speeds above 1 (a fifth of the values, up to 1.5) are
    read as measurement noise and capped at 1: sharing never speeds a job up.
  * colocate's own node measurements (``benchmarks/colocation.py``, 2026-11-22, the AIMD control
    of the time): under the ``adaptive`` node policy the guaranteed job kept 0.971 / 1.002 / 0.988
    of its solo speed (median ``ADAPTIVE_KEEP`` = 0.988) and the opportunistic job filled 0.658 /
    0.767 / 0.738 of the device time the guaranteed job leaves idle (median ``ADAPTIVE_FILL`` =
    0.738). Pause-or-full, the control since then for jobs yielding by device priority, fills more (see
    ``benchmarks/RESULTS.md``); the model keeps these older, more conservative figures so that the
    results in ``docs/evaluation.md`` stand (changing them means re-running its commands).

Solo busy fraction. Lucid's file gives only the *pair's* utilization, so each configuration's
solo busy fraction ``u`` is fitted to it: a job running at speed ``s`` keeps the device busy
``s * u`` of the time, so an unsaturated pair (``gpu_util`` < 95%) gives one equation
``s1 * u1 + s2 * u2 = gpu_util / 100``; ``u`` is the non-negative least-squares solution over
the 1,169 such pairs (coordinate descent, deterministic; median absolute residual 0.03).

Rates on one GPU (``gpu_rates``), for the jobs resident there (each with its busy fraction
``busy``, class ``klass`` and Lucid configuration ``cfg``):
  * one job: rate 1 (solo), utilization ``busy``;
  * only guaranteed jobs (fractional shares, Alibaba): rate 1 each, the node enforces the shares
    and the trace's durations were measured under them;
  * ``adaptive`` (colocate's node policy) with guaranteed and opportunistic jobs: each
    guaranteed job runs at ``keep``; the idle time they leave, ``I = 1 - sum(busy_g * keep)``,
    is filled to ``fill * I`` by the opportunistic jobs together, split by their busy fractions:
    each runs at ``min(1, fill * I / sum(busy_o))``; opportunistic jobs with no guaranteed job
    beside them share the GPU unmanaged (as ``pack``);
  * ``pack`` (unmanaged sharing, Gandiva-style): two jobs run at their measured Lucid pair
    speeds (the pair by configuration, else the median over the two models' measured variants,
    else ``min(1, 1 / (busy_a + busy_b))``); with more than two, a job's rate is the product of
    its pairwise speeds (an extrapolation: Lucid measured pairs only); if the busy fractions at
    those rates add up to more than 1, every rate is scaled down until they fit.
Utilization of the GPU: ``min(1, sum(busy * rate))``.

Without Lucid data (``LucidTable.empty()``) every job is busy 1.0 and ``pack`` uses the
saturation rule only: utilization then equals occupancy. Pure: no clock, no randomness.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
import zlib
from pathlib import Path

from cluster.traces.common import csv_error, table_lines
from colocate.base.vocab import JobClass

ADAPTIVE_KEEP = 0.988  # guaranteed job's speed beside an opportunistic one (RESULTS.md, adaptive)
ADAPTIVE_FILL = 0.738  # share of the guaranteed job's idle device time the opportunistic one uses
SHARING_MODES = ("adaptive", "pack")
UNSATURATED = 0.95  # pairs at or above this utilization are capped and left out of the fit
LUCID_ENV = "COLOCATE_LUCID_CSV"
LUCID_NAME = "lucid_colocate_info.csv"
REQUIRED = ("model1", "dataset1", "batchsize1", "amp1", "speed1", "model2", "dataset2", "batchsize2", "amp2",
            "speed2", "gpu_util")


def default_lucid_path() -> Path | None:
    """``$COLOCATE_LUCID_CSV``, else ``shared/traces/measured/lucid_colocate_info.csv`` beside
    or above the repository or the working directory; None when none exists."""
    env = os.environ.get(LUCID_ENV)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2]
    for base in (here, here.parent, Path.cwd(), Path.cwd().parent):
        p = base / "shared" / "traces" / "measured" / LUCID_NAME
        if p.exists():
            return p
    return None


class LucidTable:
    """Lucid's measured pairs, indexed: configurations (model, dataset, batch size, amp), their
    fitted solo busy fractions, pair speeds by configuration and by model."""

    def __init__(self, configs: list[tuple[str, str, str, str]], solo: list[float],
                 pairs: dict[tuple[int, int], float], model_pairs: dict[tuple[str, str], float],
                 path: str = "", residual: float = 0.0, rows: int = 0) -> None:
        self.configs = configs
        self.solo = solo
        self.pairs = pairs  # (i, j) -> speed of configuration i beside j (capped at 1)
        self.model_pairs = model_pairs  # (model i, model j) -> median speed of i beside j
        self.path, self.residual, self.rows = path, residual, rows
        models = sorted({c[0] for c in configs})
        self.models = models
        self.by_model = [[i for i, c in enumerate(configs) if c[0] == m] for m in models]

    @classmethod
    def empty(cls) -> LucidTable:
        return cls([], [], {}, {})

    def __bool__(self) -> bool:
        return bool(self.configs)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LucidTable:
        """Read and fit a Lucid pair file; ValueError naming the file (and missing columns)."""
        p = Path(path)
        try:
            with open(p, newline="", encoding="utf-8-sig") as f:
                reader = csv.DictReader(table_lines(f, str(p)))
                header = [h.strip() for h in (reader.fieldnames or [])]
                missing = [c for c in REQUIRED if c not in header]
                if missing:
                    raise ValueError(f"{p}: not a Lucid co-location file, missing column(s) {', '.join(missing)}")
                raw = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
        except OSError as e:
            raise ValueError(f"{p}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise ValueError(f"{p}: not a UTF-8 text file") from None
        except csv.Error as e:
            raise csv_error(str(p), reader.reader.line_num, e) from None
        rows = []
        for n, r in enumerate(raw, start=2):
            try:
                a = (r["model1"], r["dataset1"], r["batchsize1"], r["amp1"])
                b = (r["model2"], r["dataset2"], r["batchsize2"], r["amp2"])
                s1, s2, u = float(r["speed1"]), float(r["speed2"]), float(r["gpu_util"]) / 100
            except (KeyError, ValueError):
                raise ValueError(f"{p}:{n}: bad row (speeds and gpu_util must be numbers)") from None
            if not all(map(math.isfinite, (s1, s2, u))) or s1 <= 0 or s2 <= 0 or u < 0:
                raise ValueError(f"{p}:{n}: bad row (speeds must be > 0, gpu_util >= 0)")
            rows.append((a, min(1.0, s1), b, min(1.0, s2), u))
        if not rows:
            raise ValueError(f"{p}: no measured pairs")
        configs = sorted({r[0] for r in rows} | {r[2] for r in rows})
        idx = {c: i for i, c in enumerate(configs)}
        pairs: dict[tuple[int, int], float] = {}  # as Lucid looks a pair up: the row (i, j) first,
        reverse: dict[tuple[int, int], float] = {}  # else the row (j, i) read backwards
        by_model: dict[tuple[str, str], list[float]] = {}
        for a, s1, b, s2, _ in rows:
            i, j = idx[a], idx[b]
            pairs.setdefault((i, j), s1)
            reverse.setdefault((j, i), s2)
            by_model.setdefault((a[0], b[0]), []).append(s1)
            by_model.setdefault((b[0], a[0]), []).append(s2)
        for k, v in reverse.items():
            pairs.setdefault(k, v)
        model_pairs = {k: statistics.median(v) for k, v in by_model.items()}
        eqs = [(idx[a], s1, idx[b], s2, u) for a, s1, b, s2, u in rows if u < UNSATURATED]
        solo, residual = fit_solo(len(configs), eqs)
        return cls(configs, solo, pairs, model_pairs, str(p), residual, len(rows))

    def speed(self, i: int, j: int, busy_i: float, busy_j: float) -> float:
        """Speed of configuration ``i`` beside ``j`` (1 = solo)."""
        s = self.pairs.get((i, j))
        if s is None and i >= 0 and j >= 0:
            s = self.model_pairs.get((self.configs[i][0], self.configs[j][0]))
        if s is None:
            s = min(1.0, 1.0 / (busy_i + busy_j)) if busy_i + busy_j > 0 else 1.0
        return s

    def assign(self, job_id: str, seed: int) -> int:
        """The configuration a trace job is mapped to (-1 without data): a model uniformly, then
        one of that model's measured variants uniformly, from a hash of ``seed`` and the job id
        (independent of trace order, limit and policy)."""
        if not self.configs:
            return -1
        h = zlib.crc32(f"{seed}:{job_id}".encode())
        cands = self.by_model[h % len(self.by_model)]
        return cands[(h // len(self.by_model)) % len(cands)]

    def busy(self, cfg: int) -> float:
        return self.solo[cfg] if cfg >= 0 else 1.0


def fit_solo(n: int, eqs: list[tuple[int, float, int, float, float]], sweeps: int = 500,
             tol: float = 1e-9) -> tuple[list[float], float]:
    """Non-negative least squares for ``s1*u[i] + s2*u[j] = U`` by coordinate descent (each
    ``u`` in [0, 1]); returns (u, median absolute residual). Deterministic."""
    per: list[list[tuple[float, int, float, float]]] = [[] for _ in range(n)]  # (coef, other, coef_other, U)
    for i, si, j, sj, u in eqs:
        if i == j:
            per[i].append((si + sj, -1, 0.0, u))
        else:
            per[i].append((si, j, sj, u))
            per[j].append((sj, i, si, u))
    x = [0.5] * n
    for _ in range(sweeps):
        moved = 0.0
        for k in range(n):
            num = den = 0.0
            for c, o, co, u in per[k]:
                rest = co * x[o] if o >= 0 else 0.0
                num += c * (u - rest)
                den += c * c
            if den:
                v = min(1.0, max(0.0, num / den))
                moved = max(moved, abs(v - x[k]))
                x[k] = v
        if moved < tol:
            break
    res = [abs(si * x[i] + sj * x[j] - u) for i, si, j, sj, u in eqs]
    return x, (statistics.median(res) if res else 0.0)


class ColocationModel:
    """Rates of the jobs on one GPU under a node sharing mode (``adaptive`` or ``pack``)."""

    __slots__ = ("sharing", "table", "keep", "fill")

    def __init__(self, table: LucidTable, sharing: str = "adaptive", keep: float = ADAPTIVE_KEEP,
                 fill: float = ADAPTIVE_FILL) -> None:
        if sharing not in SHARING_MODES:
            raise ValueError(f"unknown sharing mode {sharing!r} (use {' or '.join(SHARING_MODES)})")
        if not (0 < keep <= 1 and 0 <= fill <= 1):
            raise ValueError("keep must be in (0, 1] and fill in [0, 1]")
        self.sharing, self.table, self.keep, self.fill = sharing, table, keep, fill

    def gpu_rates(self, jobs: list) -> tuple[list[float], float]:
        """(rate of each job, GPU utilization) for the resident ``jobs`` (objects with ``busy``,
        ``klass`` and ``cfg``). Rates are relative to each job's solo speed, in [0, 1]."""
        n = len(jobs)
        if n == 0:
            return [], 0.0
        if n == 1:
            b = jobs[0].busy
            return [1.0], (b if b < 1.0 else 1.0)
        nopp = sum(1 for j in jobs if j.klass != JobClass.GUARANTEED)
        if nopp == 0:
            rates = [1.0] * n
        elif self.sharing == "adaptive" and nopp < n:
            rates = self._adaptive(jobs)
        else:
            rates = self._pack(jobs)
        util = sum(j.busy * r for j, r in zip(jobs, rates))
        return rates, (util if util < 1.0 else 1.0)

    def _adaptive(self, jobs: list) -> list[float]:
        keep = self.keep
        g_busy = sum(j.busy for j in jobs if j.klass == JobClass.GUARANTEED) * keep
        idle = 1.0 - g_busy if g_busy < 1.0 else 0.0
        o_busy = sum(j.busy for j in jobs if j.klass != JobClass.GUARANTEED)
        o_rate = min(1.0, self.fill * idle / o_busy) if o_busy > 0 else 1.0
        return [keep if j.klass == JobClass.GUARANTEED else o_rate for j in jobs]

    def _pack(self, jobs: list) -> list[float]:
        speed = self.table.speed
        rates = []
        for a in jobs:
            r = 1.0
            for b in jobs:
                if b is not a:
                    r *= speed(a.cfg, b.cfg, a.busy, b.busy)
            rates.append(r)
        load = sum(j.busy * r for j, r in zip(jobs, rates))
        if load > 1.0:
            rates = [r / load for r in rates]
        return rates
