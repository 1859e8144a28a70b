"""What resources a job should get, from the history of the same job (exact fingerprint) or of its family (the same
script and arguments with other numbers: a sweep). Pure: records in, figures out; every figure says the history
level it came from and how many ended runs are behind it, and a figure that cannot be given says why (``why_not``).

  * **memory cap** (bytes per GPU, rounded up to a MiB), times ``margin``: exact level, the ``quantile`` (p95,
    nearest rank: the largest peak of fewer than 20 runs) of the runs' peak reserved memory, a run that ran out of
    memory counting as needing at least its cap. Family level: each earlier run bounds this job's need, on two
    assumptions about a number of the arguments (a batch size, a width, ...): memory never shrinks as it grows, and
    grows at most with its square (a layer's weights with its width); a run's peak, times ``(x / x_run)^2`` for
    each number of this job above the run's, is a bound, and the tightest bound is taken. A number above every
    earlier run's is not extrapolated: no figure (the job is learning). (A least-squares fit of the family's
    elasticities was tried and dropped: carried downward it under-estimated a run's fixed memory, an
    out-of-memory restart in 30 runs of ``benchmarks/recommend_memory.py``);
  * **compute share**: the smallest multiple of ``share_step`` whose predicted slowdown ``max(1, busy / share)``
    stays under ``slowdown``, from the ``busy_quantile`` of the runs' busy fractions (runs held at their share,
    busy above 0.9 of it, say nothing of their need and are left out);
  * **GPU count**: only from runs of the same arguments (exact level) at two or more GPU counts: ``T(g) = a + b/g``
    fitted to the median run time per count (least squares, a and b >= 0); the largest count up to twice the
    largest measured whose efficiency ``T(1) / (g T(g))`` is at least ``efficiency``;
  * **GPU type**: among the types with enough free GPUs (``Offer``), the fastest by predicted time: the median
    time per iteration measured on that type, else one measured on another type carried across by the types'
    relative speeds (where the nodes declare them), else the fastest declared speed. The times are those of the
    runs that reported a time per iteration; only when none of the level's runs did are run times compared, and
    the figure's value is then 0 (a run's time is not a time per iteration: the type is given, no time).
Run-time quantiles are the predictor's (``cluster.predict.predictor``); the caller adds them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.predict.history import Exit, HistoryRecord

MIB = 1 << 20
FIGURES = ("gpu_mem", "sm_share", "gpus", "gpu_type")


@dataclass(frozen=True)
class Figure:
    value: float  # bytes (gpu_mem), a share (sm_share), a count (gpus), seconds per iteration (gpu_type; 0: none)
    level: str  # the history level behind it ("exact", "family", "speed": declared speeds only)
    history: int  # ended runs behind it
    label: str = ""  # the GPU type, for gpu_type


@dataclass(frozen=True)
class Offer:
    """A GPU type the cluster has: its model, free GPUs now, and relative speed (0: not declared)."""

    model: str
    free: int
    speed: float = 0.0


@dataclass(frozen=True)
class Params:
    margin: float = 1.2
    quantile: float = 0.95
    slowdown: float = 1.1  # the bound on max(1, busy / share)
    busy_quantile: float = 0.9
    share_step: float = 0.05
    efficiency: float = 0.7

    def __post_init__(self) -> None:
        if not (self.margin >= 1 and 0 < self.quantile <= 1 and self.slowdown >= 1 and 0 < self.busy_quantile <= 1
                and 0 < self.share_step <= 1 and 0 < self.efficiency <= 1):
            raise ValueError("margin >= 1, quantile in (0, 1], slowdown >= 1, busy_quantile in (0, 1], "
                             "share_step in (0, 1], efficiency in (0, 1]")


@dataclass(frozen=True)
class Advice:
    gpu_mem: Figure | None = None
    sm_share: Figure | None = None
    gpus: Figure | None = None
    gpu_type: Figure | None = None
    why_not: dict[str, str] = field(default_factory=dict)  # figure -> why it is not given


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank (``ceil(q n)``-th smallest)."""
    v = sorted(values)
    return v[max(0, min(len(v), math.ceil(q * len(v))) - 1)]


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _need(r: HistoryRecord) -> float | None:
    """The memory a run showed it needs: its peak, or at least its cap when it ran out of memory."""
    if r.exit == Exit.OOM and r.mem_cap:
        return float(max(r.peak_mem or 0, r.mem_cap))
    return float(r.peak_mem) if r.peak_mem else None


def _bounded(runs: list[tuple[tuple[float, ...], float]], numbers: tuple[float, ...]) -> tuple[float | None, str]:
    """The family's runs as bounds on the need of a job of ``numbers`` (module docstring): (bytes before the margin,
    or None, and why)."""
    varying = [i for i in range(len(numbers)) if len({x[i] for x, _ in runs} | {numbers[i]}) > 1]
    for i in varying:
        seen = [x[i] for x, _ in runs]
        if numbers[i] <= 0 or min(seen) <= 0:
            return None, f"number {i + 1} of its arguments changes and is not positive: its effect is not known"
        if numbers[i] > max(seen):
            return None, (f"number {i + 1} of its arguments ({numbers[i]:g}) is above every earlier run's "
                          f"(at most {max(seen):g}): its memory is not known yet")

    def bound(x: tuple[float, ...], need: float) -> float:
        for i in varying:
            if numbers[i] > x[i]:
                need *= (numbers[i] / x[i]) ** 2  # at most with the square (a layer's weights with its width)
        return need  # never less for a smaller number

    return min(bound(x, need) for x, need in runs), ""


def memory(exact: list[HistoryRecord], family: list[HistoryRecord], numbers: tuple[float, ...] | None,
           p: Params, whole: int = 0) -> tuple[Figure | None, str]:
    """The memory cap (module docstring), at most ``whole`` (bytes of the GPU; 0: not known); (figure, why not)."""
    def figure(need: float, level: str, n: int) -> Figure:
        cap = math.ceil(need * p.margin / MIB) * MIB
        return Figure(float(min(cap, whole) if whole else cap), level, n)

    needs = [n for n in (_need(r) for r in exact) if n]
    if needs:
        return figure(nearest_rank(needs, p.quantile), "exact", len(needs)), ""
    if numbers is None:
        return None, "its arguments' numbers are not known"
    runs = [(r.numbers, float(r.peak_mem)) for r in family if r.numbers is not None and len(r.numbers) == len(numbers)
            and r.peak_mem and r.exit != Exit.OOM]  # a run out of memory says only that it needed more: no bound
    if not runs:
        return None, "no earlier run of this job or its family reported its memory"
    need, why = _bounded(runs, numbers)
    if need is None:
        return None, why
    return figure(need, "family", len(runs)), ""


def share(exact: list[HistoryRecord], family: list[HistoryRecord], p: Params) -> tuple[Figure | None, str]:
    """The compute share (module docstring); (figure, why not)."""
    for level, records in (("exact", exact), ("family", family)):
        busy = [r.busy for r in records if r.busy is not None and r.busy > 0
                and (r.sm_share is None or r.busy < 0.9 * r.sm_share)]
        if busy:
            need = nearest_rank(busy, p.busy_quantile) / p.slowdown
            steps = math.ceil(round(need / p.share_step, 9))
            return Figure(min(1.0, max(p.share_step, steps * p.share_step)), level, len(busy)), ""
    return None, "no earlier run of this job or its family reported its busy fraction unthrottled"


def gpu_count(exact: list[HistoryRecord], p: Params) -> tuple[Figure | None, str]:
    """The GPU count (module docstring); (figure, why not)."""
    by: dict[int, list[float]] = {}
    for r in exact:
        if r.exit == Exit.SUCCEEDED and r.wall_s > 0 and r.gpus > 0:
            by.setdefault(r.gpus, []).append(r.wall_s)
    if len(by) < 2:
        return None, (f"runs at one GPU count only ({next(iter(by))})" if by else
                      "no ended run of these arguments") + ", a scaling fit needs two or more"
    pts = [(1.0 / g, _median(t)) for g, t in by.items()]
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / sxx) if sxx > 0 else 0.0
    a = my - b * mx
    if a < 0:  # no serial part: fit b alone (through the origin)
        a, b = 0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    runs = sum(len(t) for t in by.values())
    if b <= 0:
        return Figure(float(min(by)), "exact", runs), ""  # more GPUs never helped: the fewest measured
    t1 = a + b
    best, g = 1, 1
    while g <= 2 * max(by):
        if t1 / (g * (a + b / g)) >= p.efficiency:
            best = g
        g *= 2
    return Figure(float(best), "exact", runs), ""


def gpu_type(exact: list[HistoryRecord], family: list[HistoryRecord], offers: Sequence[Offer],
             gpus: int) -> tuple[Figure | None, str]:
    """The GPU type (module docstring) for a job of ``gpus`` GPUs; (figure: predicted seconds per iteration, 0 when
    the level's runs reported none and the type was chosen by run time, labelled with the type; why not)."""
    free = [o for o in offers if o.model and o.free >= max(1, gpus)]
    if not free:
        return None, f"no GPU type has {max(1, gpus)} free GPU(s) now (each worker's GPUs on one node of one model)"
    speeds = {o.model: o.speed for o in offers if o.speed > 0}
    for level, records in (("exact", exact), ("family", family)):
        ok = [r for r in records if r.exit == Exit.SUCCEEDED and r.gpu_type]
        timed = [r for r in ok if r.step_p50_s]  # the runs that reported a time per iteration, if any did
        measured: dict[str, list[float]] = {}
        for r in timed or ok:
            t = r.step_p50_s if timed else r.wall_s
            if t:
                measured.setdefault(r.gpu_type, []).append(float(t))
        if not measured:
            continue
        times = {m: _median(t) for m, t in measured.items()}
        predicted: dict[str, float] = {}
        for o in free:
            if o.model in times:
                predicted[o.model] = times[o.model]
            elif o.model in speeds:
                carried = [t * speeds[m] / speeds[o.model] for m, t in times.items() if m in speeds]
                if carried:
                    predicted[o.model] = _median(carried)
        if predicted:
            model = min(predicted, key=lambda m: (predicted[m], -speeds.get(m, 0.0), m))
            per_iteration = predicted[model] if timed else 0.0  # a run's time is no time per iteration
            return Figure(per_iteration, level, sum(len(t) for t in measured.values()), label=model), ""
    if speeds and any(o.model in speeds for o in free):
        o = max((o for o in free if o.model in speeds), key=lambda o: (o.speed, o.free))
        return Figure(0.0, "speed", 0, label=o.model), ""
    return None, "no run was measured on the free GPU types and their speeds are not declared"


def recommend(exact: list[HistoryRecord], family: list[HistoryRecord], numbers: tuple[float, ...] | None,
              offers: Sequence[Offer] = (), gpus: int = 1, whole: int = 0, p: Params | None = None) -> Advice:
    """Every figure for a job whose exact-level and family-level history (oldest first, as the journal keeps them)
    are ``exact`` and ``family``, whose arguments' numbers are ``numbers``, of ``gpus`` GPUs on GPUs of ``whole``
    bytes, in a cluster offering ``offers``."""
    p = p or Params()
    why: dict[str, str] = {}
    got = {"gpu_mem": memory(exact, family, numbers, p, whole), "sm_share": share(exact, family, p),
           "gpus": gpu_count(exact, p), "gpu_type": gpu_type(exact, family, offers, gpus)}
    for name, (fig, reason) in got.items():
        if fig is None:
            why[name] = reason
    return Advice(gpu_mem=got["gpu_mem"][0], sm_share=got["sm_share"][0], gpus=got["gpus"][0],
                  gpu_type=got["gpu_type"][0], why_not=why)
