"""The trace-driven simulator: the scheduler's own policy core on simulated time.

``cluster.sim`` drives a real ``cluster.core.SchedulerCore`` (with the configured plugins) from
a trace, turning its decisions into future events as the nodes would (``engine``), with job
progress rates from measured co-location speeds (``colocation``). The policy core never imports
this package (an import-linter contract checks it): it cannot know it is simulated.

Modules: ``engine`` (``Simulation``, ``SimConfig``), ``colocation`` (``LucidTable``,
``ColocationModel``), ``workload`` (``load_workload``, ``JobInput``), ``metrics`` (per-job rows,
summary), ``plots`` (PNGs), ``runner`` (``simulate``, ``SimOptions``, ``run_policy``).
See docs/simulator.md.
"""

from __future__ import annotations

from cluster.sim.colocation import ADAPTIVE_FILL, ADAPTIVE_KEEP, SHARING_MODES, ColocationModel, LucidTable
from cluster.sim.engine import SimConfig, Simulation
from cluster.sim.metrics import job_rows, summarize
from cluster.sim.runner import SimOptions, resolve_policies, run_policy, simulate
from cluster.sim.workload import ESTIMATES, JobInput, Workload, load_workload

__all__ = [
    "ADAPTIVE_FILL", "ADAPTIVE_KEEP", "ESTIMATES", "SHARING_MODES", "ColocationModel", "JobInput", "LucidTable",
    "SimConfig", "SimOptions", "Simulation", "Workload", "job_rows", "load_workload", "resolve_policies",
    "run_policy", "simulate", "summarize",
]
