"""Invariants of every simulated run, on every preset policy: synthetic workloads (gangs, fractional
shares, opportunistic jobs, CPU, host and GPU memory) and a slice of the real Philly trace.

Checked per run: the core's allocation state is consistent and within capacity after every batch
(``state.check_invariants``: GPU milli, GPU memory, CPU and host memory); no job starts before its
submission; every gang starts whole (all ranks, distinct GPUs, started in one batch); every job
with a duration ends exactly once, and the run's figures agree with the per-job rows."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest

from cluster import events as ev
from cluster.config import PRESETS, preset
from cluster.sim import ColocationModel, LucidTable, load_workload, run_policy
from cluster.sim.engine import SimConfig
from tests.cluster.sim.helpers import GIB, LUCID, PHILLY, node_specs, run, synth_jobs, terminal_counts

POLICIES = sorted(PRESETS)
# fewer jobs for the slow presets (the genetic-algorithm placement evolves a population per cycle)
SMALL = {p: 30 for p in POLICIES if "genetic" in PRESETS[p]["plugins"]}


def check_batch(sim, t, events, out):
    sim.core.state.check_invariants()
    cap = sim.capacity
    assert 0 <= sim.alloc_milli <= cap * 1000, f"allocated {sim.alloc_milli} milli of {cap} GPUs at {t}"
    assert 0 <= sim.occupied <= cap
    assert sim.busy_total <= cap + 1e-9
    assert sim.pending >= 0 and sim.running >= 0


def check_log(sim, rows, complete: bool = True):
    """Start times, whole gangs, one end per job (``complete``: every job with a duration ends),
    from the recorded batches."""
    submit = {j.job_id: j.submit for j in sim.jobs}
    started_at: dict[str, dict[int, float]] = defaultdict(dict)
    placements = {}
    for t, events, out in sim.log:
        batch_started = defaultdict(set)
        for e in events:
            if isinstance(e, ev.RankStarted):
                batch_started[e.placement_id].add(e.rank)
                started_at[e.placement_id][e.rank] = t
        for pid, ranks in batch_started.items():  # a gang starts whole, in one batch
            assert ranks == set(range(len(placements[pid].slots))), f"{pid}: ranks {sorted(ranks)} started alone"
        for d in out:
            if isinstance(d, ev.StartWorkers):
                p, spec = d.placement, d.spec
                assert t >= submit[p.job_id], f"{p.job_id} started at {t} before its submission {submit[p.job_id]}"
                assert len(p.slots) == spec.workers and [s.rank for s in p.slots] == list(range(spec.workers))
                used = [(s.node_id, g) for s in p.slots for g in s.gpus]
                if spec.gpu_milli == 1000:
                    assert len(used) == len(set(used)), f"{p.placement_id}: a GPU used twice by one gang"
                assert all(len(s.gpus) == spec.gpus for s in p.slots)
                placements[p.placement_id] = p
    ends = terminal_counts(sim.log)
    for r in rows:
        known = r["duration_s"] is not None
        if known and complete and r["state"] != "failed":
            assert ends[r["job_id"]] == 1, f"{r['job_id']} ended {ends[r['job_id']]} times"
        assert ends[r["job_id"]] <= 1
        if r["start_s"] is not None:
            assert r["start_s"] >= r["submit_s"]
        if r["state"] == "succeeded":
            assert r["end_s"] >= r["start_s"] and math.isclose(r["jct_s"], r["end_s"] - r["submit_s"])
            assert r["run_s"] >= r["duration_s"] * (1 - 1e-9) - 1e-6, f"{r['job_id']} ran less than its work"


@pytest.mark.parametrize("policy", POLICIES)
def test_synthetic_invariants_every_preset(policy):
    nodes = node_specs("4x4", gpu_mem=16 * GIB, cpu_milli=32000, mem_mib=65536)
    jobs = synth_jobs(SMALL.get(policy, 150), seed=3, host=True, gpu_mem=True)
    sim, rows, summary = run(policy, jobs, nodes, observer=check_batch)
    check_log(sim, rows)
    assert summary["succeeded"] + summary["failed"] + summary["unfinished"] == len(jobs)
    assert summary["succeeded"] >= 0.9 * len(jobs)
    assert sim.pending == 0 and sim.running == 0 and sim.alloc_milli == 0 and sim.occupied == 0


@pytest.mark.parametrize("policy", ["gang-binpack", "antman"])
def test_unknown_durations_never_finish_and_the_run_ends(policy):
    nodes = node_specs("4x4")
    jobs = synth_jobs(80, seed=5, unknown=0.1)
    sim, rows, summary = run(policy, jobs, nodes, observer=check_batch)
    check_log(sim, rows, complete=False)  # a job that never ends may block others for good
    for r in rows:
        if r["duration_s"] is None:
            assert r["end_s"] is None and r["state"] in ("running", "pending", "placing")
    assert summary["unfinished"] >= sum(1 for j in jobs if j.duration is None) > 0


@pytest.fixture(scope="module")
def philly_slice():
    if not PHILLY.exists():
        pytest.skip(f"no Philly trace at {PHILLY}")
    table = LucidTable.load(LUCID) if LUCID.exists() else LucidTable.empty()
    return table, load_workload(str(PHILLY), cluster="8x8", limit=600, opportunistic_fraction=0.2, seed=7,
                                table=table)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_philly_slice_invariants_every_preset(policy, philly_slice):
    table, wl = philly_slice
    if policy in SMALL:
        wl = dataclasses.replace(wl, jobs=wl.jobs[:SMALL[policy]])
    n = len(wl.jobs)
    step = [0]

    def sample(sim, t, events, out):  # every 7th batch: the check is O(cluster)
        step[0] += 1
        if step[0] % 7 == 0:
            check_batch(sim, t, events, out)

    # ticks every 10 min: the slice runs for months of simulated time (jobs of up to 53 days)
    config = SimConfig(record=True, tick_s=600.0)
    sim, rows, summary = run_policy(wl, policy, preset(policy), ColocationModel(table), config, observer=sample)
    check_log(sim, rows, complete=policy != "quota")
    assert summary["jobs"] == n and summary["succeeded"] + summary["failed"] + summary["unfinished"] == n
    assert summary["unfinished"] == 0 or policy == "quota"  # quota: Philly has no users, one 8-GPU tenant
