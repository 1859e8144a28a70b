"""A cycle that provably decides nothing (no job pending, no cycle hook: ``Framework.idle``) is counted,
not run: the same events, decisions, per-job rows and summary (cycle counts included) as running it, on
synthetic workloads and on a slice of the Philly trace, for several policies."""

from __future__ import annotations

import pytest

from cluster.core import SchedulerCore
from cluster.framework import Framework
from cluster.sim import ColocationModel, LucidTable, SimConfig, load_workload, run_policy
from tests.cluster.sim.helpers import GIB, PHILLY, node_specs, run, stable, synth_jobs

POLICIES = ["fifo", "gang-binpack", "backfill", "multi-queue", "antman", "quota"]
NODES = node_specs("3x4", gpu_mem=16 * GIB, cpu_milli=16000, mem_mib=65536)


def counted_skips(monkeypatch) -> list:
    skips: list = []
    real = Framework.skip_cycle

    def skip(self, now):
        skips.append(now)
        real(self, now)

    monkeypatch.setattr(Framework, "skip_cycle", skip)
    return skips


def both(monkeypatch, go):
    """``go()`` with idle cycles skipped, then run: (skipped result, run result, cycles skipped)."""
    skips = counted_skips(monkeypatch)
    skipped = go()
    n = len(skips)
    monkeypatch.setattr(SchedulerCore, "skip_idle", False)
    ran = go()
    assert len(skips) == n, "skip_idle off: no cycle skipped"
    return skipped, ran, n


def hooked(policy: str) -> bool:
    """Whether a plugin of ``policy`` has a cycle hook (its cycles are never idle)."""
    import random

    from cluster.config import preset

    pt = SchedulerCore(preset(policy), random.Random(0)).fw.pt
    return bool(pt["cycle_start"] or pt["cycle_end"])


def same(a, b):
    assert [(t, e, o) for t, e, o in a[0].log] == [(t, e, o) for t, e, o in b[0].log]
    assert a[1] == b[1]
    assert stable(a[2]) == stable(b[2])


@pytest.mark.parametrize("policy", POLICIES)
def test_skipping_idle_cycles_changes_nothing(policy, monkeypatch):
    jobs = synth_jobs(90, seed=11, host=True, gpu_mem=True)
    a, b, n = both(monkeypatch, lambda: run(policy, jobs, NODES))
    same(a, b)
    assert (n > 0) != hooked(policy), "skipped cycles: none where the scheduler was idle, or some under a hook"


@pytest.mark.parametrize("policy", ["fifo", "gang-binpack", "backfill", "antman"])
def test_philly_slice_same_with_skipped_cycles(policy, monkeypatch):
    if not PHILLY.exists():
        pytest.skip(f"no Philly trace at {PHILLY}")
    wl = load_workload(str(PHILLY), cluster="6x8", limit=400, opportunistic_fraction=0.3, seed=2)
    model = ColocationModel(LucidTable.empty())
    cfg = __import__("cluster.config", fromlist=["preset"]).preset(policy)
    a, b, n = both(monkeypatch, lambda: run_policy(wl, policy, cfg, model, SimConfig(record=True, tick_s=600.0)))
    same(a, b)
    assert (n > 0) != hooked(policy)
