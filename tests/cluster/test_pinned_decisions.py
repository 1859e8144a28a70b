"""The policies' decisions, pinned: seeded workloads run through every preset, and the digest of every
decision they make (in order, with its reasons) compared with the digest recorded before the core's
speed work (``tests/cluster/pinned_decisions.json``). A change of the core or the state's indexes that
is meant to be only faster must leave every digest as it is; a change meant to alter a policy's
decisions records new digests, on purpose:

    python -m tests.cluster.test_pinned_decisions > tests/cluster/pinned_decisions.json

Two workloads per policy: (1) the simulator on mixed jobs (gangs, fractional shares, opportunistic
jobs, GPU memory, CPU and host memory; delayed starts and stops, node reports), 16 nodes x 8 GPUs; (2)
the core alone at a scale where the indexes' buckets churn (96 nodes x 8 GPUs, 1,500 jobs submitted at
once, rounds of starts, utilization reports and exits; the genetic policies, slow, at 24 nodes and 200 jobs), as
``benchmarks/scheduler_core.py`` drives it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from cluster import events as ev
from cluster.config import PRESETS, preset
from cluster.core import SchedulerCore
from cluster.sim import SimConfig
from cluster.spec import JobSpec, NodeSpec
from tests.cluster.sim.helpers import GIB, node_specs, run, synth_jobs

PINNED = Path(__file__).with_name("pinned_decisions.json")
POLICIES = sorted(PRESETS)
SHAPES = [(1, 1, 40), (1, 2, 12), (2, 1, 6), (1, 4, 8), (2, 2, 4), (1, 8, 8), (2, 4, 3), (2, 8, 5), (4, 4, 2),
          (4, 8, 2)]


_ENUM = re.compile(r"<\w+\.\w+: ('[^']*')>")
_CLASS = re.compile(r"\b(?:klass|priority)=")
_ADDED = re.compile(r", (?:fingerprint|family)=''|, oom=False|, mem_fallback=None|, spec=None")


def canonical(decision) -> str:
    """A decision's repr with what a rename changes spelled one way: an enum member as its value, the job
    class field as ``class=``, and the fields added since the digests were first pinned (the spec's ``fingerprint``,
    ``family``, ``mem_fallback``; ``JobChanged.oom``, ``spec``) left out at their defaults. What a policy decides is all that is left to differ."""
    return _ADDED.sub("", _CLASS.sub("class=", _ENUM.sub(r"\1", repr(decision))))


class Digest:
    """A running sha256 of decisions (their reprs, one a line) and their count."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.n = 0

    def add(self, step: str, decisions) -> None:
        self.h.update(f"@{step}\n".encode())
        for d in decisions:
            self.h.update(canonical(d).encode() + b"\n")
            self.n += 1

    def value(self) -> list:
        return [self.n, self.h.hexdigest()]


def simulated(policy: str) -> list:
    slow = "genetic" in PRESETS[policy]["plugins"]
    jobs = synth_jobs(40 if slow else 260, seed=24, node_gpus=8, host=True, gpu_mem=True, fractional=0.15)
    nodes = node_specs("16x8", gpu_mem=32 * GIB, cpu_milli=64000, mem_mib=262144)
    sim, _, _ = run(policy, jobs, nodes, config=SimConfig(record=True, start_delay_s=2.0, stop_delay_s=1.0,
                                                          reports="always"))
    d = Digest()
    for t, _, out in sim.log:
        d.add(repr(t), out)
    return d.value()


def core_rounds(policy: str) -> list:
    """The benchmark's drive at a small scale: every job submitted at once, then rounds of starts, a
    report of seeded utilizations from every node, and the exits of every placement two rounds old."""
    slow = "genetic" in PRESETS[policy]["plugins"]  # evolves a population per cycle
    nodes, n_jobs, rounds = (24, 200, 6) if slow else (96, 1500, 12)
    rng = random.Random(24)
    core = SchedulerCore(preset(policy), random.Random(0))
    d = Digest()
    d.add("join", core.handle_batch([ev.NodeJoined(NodeSpec(f"n{i:03d}", 8), 1) for i in range(nodes)], 0.0))
    shapes = [(w, g) for w, g, k in SHAPES for _ in range(k)]
    opp = core.fw.places("opportunistic")
    specs = []
    for i in range(n_jobs):
        w, g = rng.choice(shapes)
        kw = {}
        if opp and rng.random() < 0.15:
            w, g, kw = 1, rng.choice((1, 1, 2)), {"klass": "opportunistic"}
        specs.append(JobSpec(f"j{i}", submit_time=i * 1e-3, workers=w, gpus=g, user=f"u{rng.randrange(6)}",
                             estimate_s=float(rng.choice((60, 300, 1800))), **kw))
    d.add("submit", core.handle_batch([ev.JobSubmitted(s) for s in specs], 1.0, schedule=False))
    out = core.schedule(1.0)
    d.add("first", out)
    placed: list[list] = [[x.placement for x in out if isinstance(x, ev.StartWorkers)]]
    now = 1.0
    for r in range(rounds):
        now += 60.0
        starts = [ev.RankStarted(p.job_id, p.placement_id, s.rank) for p in placed[-1] for s in p.slots]
        reports = [ev.NodeReport(nid, 1, tuple(ev.GpuReport(i, rng.choice((0.0, 0.1, 0.5, 0.95)), 0)
                                               for i in range(8)), ()) for nid in core.state.nodes]
        d.add(f"start{r}", core.handle_batch(starts + reports, now))
        old = placed.pop(0) if len(placed) >= 2 else []
        exits = [ev.RankExited(p.job_id, p.placement_id, s.rank, 0) for p in old for s in p.slots]
        out = core.handle_batch(exits, now + 30.0)
        d.add(f"exit{r}", out)
        d.add(f"pass{r}", core.schedule(now + 31.0))
        placed.append([x.placement for x in out if isinstance(x, ev.StartWorkers)])
    core.state.check_invariants()
    return d.value()


def digests() -> dict:
    return {p: {"simulated": simulated(p), "core": core_rounds(p)} for p in POLICIES}


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(PINNED.read_text())


@pytest.mark.parametrize("policy", POLICIES)
def test_simulated_decisions_are_the_pinned_ones(policy, pinned):
    got = simulated(policy)
    assert got[0] > 100, "the workload decided too little to pin anything"
    assert got == pinned[policy]["simulated"], f"{policy}: the simulated run's decisions changed"


@pytest.mark.parametrize("policy", POLICIES)
def test_core_decisions_at_churn_are_the_pinned_ones(policy, pinned):
    got = core_rounds(policy)
    assert got[0] > 300, "the workload decided too little to pin anything"
    assert got == pinned[policy]["core"], f"{policy}: the core's decisions changed"


if __name__ == "__main__":
    print(json.dumps(digests(), indent=1, sort_keys=True))


def ranked_vs_ranking(policy: str, seed: int, ranked: bool) -> list:
    """Decisions on a fragmented cluster (nodes of 2-8 GPUs, host resources), with the framework's shortcut for
    a ranked node order (``ranked``) or with every class's feasible nodes ranked by their scores."""
    rng = random.Random(seed)
    core = SchedulerCore(preset(policy), random.Random(0))
    if not ranked:
        for select in core.fw._selectors.values():
            select.ranked = None
    out = core.handle_batch([ev.NodeJoined(NodeSpec(f"n{i:02d}", rng.choice((2, 3, 4, 6, 8)), cpu_milli=16000,
                                                    mem_mib=65536), 1) for i in range(24)], 0.0)
    specs = []
    for i in range(300):
        kw: dict = {"cpu_milli": rng.choice((0, 1000, 4000)), "mem_mib": rng.choice((0, 8192))}
        w, g = rng.choice(((1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (1, 3), (2, 3), (1, 0), (2, 0)))
        if rng.random() < 0.15:
            w, g, kw["gpu_milli"] = 1, 1, rng.choice((250, 500, 750))
        elif rng.random() < 0.1 and core.fw.places("opportunistic"):
            w, g, kw["klass"] = 1, 1, "opportunistic"
        specs.append(JobSpec(f"j{i}", submit_time=i * 0.01, workers=w, gpus=g, **kw))
    placed: list = []
    now = 1.0
    for i in range(0, 300, 20):  # submits in waves; the oldest placements exit between them
        now += 10.0
        out += core.handle_batch([ev.JobSubmitted(s) for s in specs[i:i + 20]], now)
        placed += [d.placement for d in out if isinstance(d, ev.StartWorkers)]
        k = rng.randrange(0, 6)
        gone, placed = placed[:k], placed[k:]
        out += core.handle_batch([ev.RankExited(p.job_id, p.placement_id, s.rank, 0) for p in gone for s in p.slots],
                                 now + 1.0)
    core.state.check_invariants()
    return out


@pytest.mark.parametrize("policy", ["gang-binpack", "antman", "fifo"])
@pytest.mark.parametrize("seed", range(6))
def test_a_ranked_order_decides_as_ranking_does(policy, seed):
    """The shortcut for a node order ranked by the only scorer (binpack's and spread's ``order_ranked``;
    ``fifo`` places with spread) takes the node that
    ranking the feasible nodes would take: the same decisions as the general path, on fragmented clusters."""
    fast = ranked_vs_ranking(policy, seed, ranked=True)
    assert sum(isinstance(d, ev.StartWorkers) for d in fast) > 40
    assert fast == ranked_vs_ranking(policy, seed, ranked=False)
