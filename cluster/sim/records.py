"""The engine's records: its configuration (``SimConfig``) and its view of GPUs, nodes and jobs.

Owned by one ``Simulation``; nothing else changes them. ``SimJob`` keeps a job's remaining solo
work (seconds at rate 1), its current rate and the version of its completion event; ``SimGpu`` the
jobs resident on a GPU, their rates there and the modelled utilization with the changes inside
the last report window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.sim.network import NONE, SpreadModel
from cluster.spec import NodeSpec, Placement

REPORT_MODES = ("auto", "always", "never")


@dataclass
class SimConfig:
    start_delay_s: float = 0.0  # StartWorkers -> RankStarted
    stop_delay_s: float = 0.0  # StopWorkers -> RankExited(143)
    restart_overhead_s: float = 0.0  # solo work added to a job at each restart after a stop
    tick_s: float | None = None  # tick period when a policy needs ticks (None: 30 s); 0: never
    report_s: float = 10.0  # NodeReport grid and utilization window
    reports: str = "auto"  # auto | always | never
    idle_horizon_s: float = 86400.0
    record: bool = False  # keep (time, events, decisions) of every batch in ``log``
    samples: int = 2000  # time-series points over the submission span (plots)
    spread: SpreadModel = NONE  # how much slower a gang runs across nodes, switches, racks (cluster.sim.network)
    # Progress reports (``JobProgressed``), sent only when some plugin reads them (``on_progress``): a running job
    # reports ``progress_s`` seconds after its workers start, then each time its run time doubles (a node reports
    # every period; the doubling keeps a weeks-long replay's events to a few per job). 0: none.
    progress_s: float = 600.0
    step_s: float = 1.0  # solo seconds per iteration: a job of duration D has round(D / step_s) iterations
    known_total: float = 0.5  # share of jobs whose total iteration count the runtime knows (a hint, or a DataLoader's
    # length x epochs); traces do not say which, so each job is in it or not by a hash of its id. Others report 0.

    def __post_init__(self) -> None:
        for name in ("start_delay_s", "stop_delay_s", "restart_overhead_s", "idle_horizon_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.tick_s is not None and not self.tick_s >= 0:
            raise ValueError("tick_s must be >= 0")
        if not self.report_s > 0:
            raise ValueError("report_s must be > 0")
        if not (self.progress_s >= 0 and math.isfinite(self.progress_s)):
            raise ValueError("progress_s must be a finite number >= 0")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise ValueError("step_s must be a finite number > 0")
        if not 0 <= self.known_total <= 1:
            raise ValueError("known_total must be between 0 and 1")
        if self.reports not in REPORT_MODES:
            raise ValueError(f"reports must be one of {', '.join(REPORT_MODES)}")


class SimGpu:
    __slots__ = ("node", "index", "jobs", "rates", "util", "u0", "hist")

    def __init__(self, node: SimNode, index: int) -> None:
        self.node, self.index = node, index
        self.jobs: list[SimJob] = []  # resident (running) jobs
        self.rates: list[float] = []  # their rates here, same order
        self.util = 0.0  # modelled busy fraction now
        self.u0 = 0.0  # utilization before the first change kept in ``hist``
        self.hist: list[tuple[float, float]] = []  # (time, utilization from then), last report window

    def window(self, now: float, period: float) -> float:
        """Mean modelled utilization over ``[now - period, now]``; forgets older changes."""
        a = now - period
        hist = self.hist
        k = 0
        while k < len(hist) and hist[k][0] <= a:
            self.u0 = hist[k][1]
            k += 1
        if k:
            del hist[:k]
        if not hist:
            return self.u0
        total, pt, pu = 0.0, a, self.u0
        for tc, u in hist:
            total += pu * (tc - pt)
            pt, pu = tc, u
        total += pu * (now - pt)
        return total / period


class SimNode:
    __slots__ = ("spec", "node_id", "gpus", "live", "report_at")

    def __init__(self, spec: NodeSpec) -> None:
        self.spec, self.node_id = spec, spec.node_id
        self.gpus = [SimGpu(self, i) for i in range(spec.gpus)]
        self.live: dict[SimJob, None] = {}  # jobs with started workers here (reports only)
        self.report_at: float | None = None


class SimJob:
    """The simulator's view of one job: its remaining work and current placement."""

    __slots__ = ("spec", "job_id", "duration", "work", "busy", "cfg", "klass", "label", "submit", "placement",
                 "pid", "gpus", "nodes", "held", "live", "milli", "rate", "t_rate", "version", "due", "state",
                 "first_start", "running_at", "end", "pending_since", "wait", "requeues", "preemptions", "starts",
                 "run_s", "queue", "reason", "spread_f", "span", "reported", "starting")

    def __init__(self, spec, duration: float | None, cfg: int, busy: float, label: str) -> None:
        self.spec, self.job_id, self.duration = spec, spec.job_id, duration
        self.work = duration if duration is not None else math.inf  # solo seconds left
        self.busy, self.cfg, self.label = busy, cfg, label
        self.klass = spec.klass
        self.submit = spec.submit_time
        self.placement: Placement | None = None  # the current one, set with ``pid`` at each start
        self.pid: str | None = None
        self.gpus: list[SimGpu] = ()  # type: ignore[assignment]
        self.nodes: list[SimNode] = ()  # type: ignore[assignment]
        self.held: tuple[int, ...] | range = ()  # ranks of the current placement not yet exited
        self.live = False  # workers started and progressing
        self.milli = 0  # guaranteed milli the placement holds per GPU
        self.rate = 0.0
        self.t_rate = 0.0
        self.version = 0
        self.due = False  # a current completion event is scheduled
        self.state = ""
        self.first_start: float | None = None
        self.running_at = 0.0  # when the workers last started: read only while ``live``
        self.end: float | None = None
        self.pending_since = 0.0
        self.wait = 0.0  # total time pending
        self.requeues = 0
        self.preemptions = 0
        self.starts = 0
        self.run_s = 0.0  # time with workers started
        self.queue = ""
        self.reason = ""  # why it ended, when it ended other than by succeeding (the core's reason)
        self.spread_f = 1.0  # the spread model's rate multiplier for the current placement
        self.span = (0, 0, 0)  # nodes, switches, racks of the latest placement
        self.reported = 0  # progress reports sent since the workers last started
        self.starting: str | None = None  # the placement whose start event is pending and counted as live work
