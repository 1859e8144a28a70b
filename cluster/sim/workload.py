"""What a simulation runs: the trace's jobs as the scheduler will see them, the cluster's nodes,
and each job's place in the co-location model.

``load_workload`` reads the trace (``cluster.traces``) and the cluster (``--nodes`` file or
``--cluster`` shape; the node list's bad rows are counted in ``Workload.node_skipped``, never raised) and
prepares every job once, deterministically from ``seed``:
  * queue: with ``queues="default"`` (the default) every job goes to queue ``default``: the
    trace's queue column (Philly's virtual cluster) is dropped, since the presets' queue plugins
    know only that queue (``multi_queue`` rejects other names); ``queues="trace"`` keeps it;
  * class: ``opportunistic_fraction=f`` marks a seeded share of jobs opportunistic (Philly: the
    reader's own draw, one ``random()`` per row in file order; other formats: one draw per job in
    submit order, a job keeps its trace class when not drawn); the trace class is the job's
    label in every report, whatever class a policy runs it in;
  * run-time estimate (``JobSpec.estimate_s``, read by ``backfill``): ``oracle`` = the true
    duration; ``user`` = the trace's estimate when it has one, else the true duration times a
    lognormal factor ``exp(N(ln user_factor, user_noise))`` (users over-estimate: median factor
    2 by default, after Mu'alem & Feitelson, IEEE TPDS 2001, and Tsafrir, Etsion & Feitelson,
    IEEE TPDS 2007, who found actual run times typically a third to a half of the request);
    ``predicted`` = none, so the ``predictor`` plugin estimates from history;
  * co-location: a Lucid configuration (``LucidTable.assign``) and its solo busy fraction; a
    fractional guaranteed share (``gpu_milli`` < 1000) scales it by the share.
A job whose duration the trace does not know (``allow_no_duration``) never finishes.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field

from cluster.sim.colocation import LucidTable
from cluster.sim.engine import collector_paused
from cluster.spec import MILLI, JobSpec, NodeSpec
from cluster.traces import TraceResult, load_nodes, load_trace, parse_shape
from colocate.base.vocab import JobClass

ESTIMATES = ("oracle", "user", "predicted")
QUEUES = ("default", "trace")


@dataclass(slots=True)
class JobInput:
    """One trace job as the simulator runs it."""

    spec: JobSpec  # what the scheduler is told (queue, class and estimate already applied)
    duration: float | None  # solo run time in seconds; None: never finishes
    cfg: int  # Lucid configuration (-1: none)
    busy: float  # solo device busy fraction of each of its GPUs
    label: str  # the trace class (guaranteed | opportunistic), for reports


@dataclass
class Workload:
    jobs: list[JobInput]
    nodes: list[NodeSpec]
    trace: TraceResult
    table: LucidTable
    seed: int = 0
    node_source: str = ""
    node_skipped: dict = field(default_factory=dict)
    load_wall_s: float = 0.0
    options: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def as_guaranteed(self) -> list[JobInput]:
        """The same jobs with every opportunistic one submitted as guaranteed (for a policy that
        places no opportunistic work: it runs them exclusively); labels unchanged."""
        out = []
        for j in self.jobs:
            if j.spec.klass == JobClass.OPPORTUNISTIC:
                j = JobInput(dataclasses.replace(j.spec, klass=JobClass.GUARANTEED), j.duration, j.cfg, j.busy, j.label)
            out.append(j)
        return out


def load_cluster(nodes: str | None = None, cluster: str | None = None) -> tuple[list[NodeSpec], str, dict]:
    """Nodes from a node-list file or a shape (exactly one); (nodes, description, skipped rows: {reason: rows}
    of the node list, empty for a shape). A cluster without a GPU (a shape such as ``8x0``, a node list whose
    nodes all have none) is a ``ValueError``: every job would be dropped."""
    if bool(nodes) == bool(cluster):
        raise ValueError("give exactly one of --nodes PATH and --cluster SHAPE")
    if cluster:
        specs = parse_shape(cluster)
        if not any(n.gpus for n in specs):
            raise ValueError(f"cluster shape {cluster!r}: no GPUs")
        return specs, cluster, {}
    res = load_nodes(nodes)
    if not res.nodes:
        raise ValueError(f"{nodes}: no usable nodes ({sum(res.skipped.values())} bad rows)")
    if not any(n.gpus for n in res.nodes):
        raise ValueError(f"node list {nodes}: no GPUs ({len(res.nodes)} nodes, none with a GPU; "
                         f"{sum(res.skipped.values())} bad rows)")
    return res.nodes, str(nodes), dict(res.skipped)


def oracle_estimate(duration_s: float) -> float:
    """The run-time estimate (s) an ``oracle`` workload gives a job that runs ``duration_s``: its true run
    time, at least 1 s."""
    return max(duration_s, 1.0)


@collector_paused()
def load_workload(trace: str, *, format: str | None = None, nodes: str | None = None, cluster: str | None = None,  # noqa: C901, PLR0912, PLR0913 (every trace format's options meet here, keyword-only)
                  seed: int = 0, limit: int | None = None, node_gpus: int | None = None,
                  opportunistic_fraction: float | None = None, estimates: str = "predicted",
                  user_factor: float = 2.0, user_noise: float = 0.8, queues: str = "default",
                  allow_no_duration: bool = False, table: LucidTable | None = None) -> Workload:
    """Read and prepare a workload; ``ValueError`` (one line) for bad options or files. Bad
    trace rows are counted in ``trace.skipped``, never raised. ``node_gpus``: GPUs per worker when a
    trace job is split into a gang (Philly, csv); None: the GPUs of the cluster's largest node. The collector is
    paused meanwhile (``cluster.sim.engine.collector_paused``)."""
    if estimates not in ESTIMATES:
        raise ValueError(f"--estimates must be one of {', '.join(ESTIMATES)}, got {estimates!r}")
    if queues not in QUEUES:
        raise ValueError(f"--queues must be one of {', '.join(QUEUES)}, got {queues!r}")
    f = opportunistic_fraction
    if f is not None and not (0.0 <= f <= 1.0):
        raise ValueError(f"--opportunistic-fraction must be in [0, 1], got {f}")
    if not (1e-6 <= user_factor <= 1e6 and 0 <= user_noise <= 10):
        raise ValueError("--user-factor must be in [1e-6, 1e6] and --user-noise in [0, 10]")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    if node_gpus is not None and node_gpus < 1:
        raise ValueError(f"--node-gpus must be >= 1, got {node_gpus}")
    t0 = time.perf_counter()
    specs, node_src, node_skipped = load_cluster(nodes, cluster)
    if node_gpus is None:
        node_gpus = max(1, max(n.gpus for n in specs))
    opts: dict = {"limit": limit}
    fmt = format
    if fmt is None:
        from cluster.traces import detect_format
        fmt = detect_format(trace)
    if fmt in ("philly", "csv", "pai2020"):
        opts["node_gpus"] = node_gpus
    if fmt in ("alibaba2023", "csv"):
        opts["allow_no_duration"] = allow_no_duration
    if fmt == "philly" and f:
        opts.update(opportunistic_fraction=f, rng=random.Random(seed))
    if fmt == "philly" and queues == "default":
        opts["queue"] = "default"  # made with it: no copy of each spec below
    res = load_trace(trace, fmt, **opts)
    table = table if table is not None else LucidTable.empty()
    draw = random.Random(f"{seed}:opportunistic") if (f and fmt != "philly") else None
    share = f or 0.0  # the draw's threshold (draw is None unless f > 0)
    noise = random.Random(f"{seed}:user-estimates")
    mu = math.log(user_factor)
    jobs: list[JobInput] = []
    replace = dataclasses.replace
    for tj in res.jobs:
        spec, dur = tj.spec, tj.duration_s
        changes: dict = {}
        if queues == "default" and spec.queue != "default":
            changes["queue"] = "default"
        if draw is not None and draw.random() < share:
            changes["klass"] = JobClass.OPPORTUNISTIC
        if estimates == "oracle":
            est = None if dur is None else oracle_estimate(dur)
        elif estimates == "user":
            est = spec.estimate_s
            if est is None and dur is not None:
                est = max(1.0, dur * math.exp(noise.gauss(mu, user_noise)))
        else:
            est = None
        if est != spec.estimate_s:
            changes["estimate_s"] = est
        if changes:
            spec = replace(spec, **changes)
        cfg = table.assign(spec.job_id, seed)
        busy = table.busy(cfg)
        if spec.gpu_milli < MILLI:
            busy *= spec.gpu_milli / MILLI
        jobs.append(JobInput(spec, dur, cfg, busy, spec.klass))
    return Workload(jobs, specs, res, table, seed, node_src, node_skipped, time.perf_counter() - t0,
                    {"format": res.format, "estimates": estimates, "queues": queues, "opportunistic_fraction": f,
                     "user_factor": user_factor, "user_noise": user_noise, "limit": limit, "node_gpus": node_gpus})
