"""Regression tests for the core bugs the simulator found (see docs/simulator.md, "Core fixes").

An opportunistic gang's ranks were placed on the same GPU: the utilization index does not change
while one gang is placed, so every rank picked the same least-utilized GPU (a torchrun/NCCL job
fails on a duplicate GPU). The opportunistic plugin now skips GPUs holding a rank of the gang."""

from __future__ import annotations

import random

from cluster import events as ev
from cluster.config import preset
from cluster.core import SchedulerCore
from cluster.spec import JobSpec, NodeSpec


def core_with(nodes):
    core = SchedulerCore(preset("antman"), random.Random(0))
    core.handle_batch([ev.NodeJoined(NodeSpec(n, g), 1) for n, g in nodes], 0.0)
    return core


def placement(decisions, job_id):
    return next(d.placement for d in decisions if isinstance(d, ev.StartWorkers) and d.placement.job_id == job_id)


def test_an_opportunistic_gang_gets_distinct_gpus():
    core = core_with([("n0", 4)])
    out = core.handle(ev.JobSubmitted(JobSpec("g", workers=3, gpus=1, klass="opportunistic")), 1.0)
    used = [(s.node_id, i) for s in placement(out, "g").slots for i in s.gpus]
    assert len(used) == 3 and len(set(used)) == 3


def test_an_opportunistic_gang_waits_rather_than_doubling_up():
    core = core_with([("n0", 1), ("n1", 1)])
    out = core.handle(ev.JobSubmitted(JobSpec("busy", workers=1, gpus=1)), 0.0)
    node = placement(out, "busy").slots[0].node_id
    report = ev.NodeReport(node, 1, (ev.GpuReport(0, 0.95, 0),), (ev.WorkerReport("busy", "busy.1", 0, True),))
    core.handle(report, 1.0)  # that GPU is over the 0.8 threshold: one GPU left for opportunistic work
    out = core.handle(ev.JobSubmitted(JobSpec("g", workers=2, gpus=1, klass="opportunistic")), 2.0)
    assert not [d for d in out if isinstance(d, ev.StartWorkers)]
    out = core.handle(ev.NodeReport(node, 1, (ev.GpuReport(0, 0.3, 0),), report.workers), 12.0)
    used = [(s.node_id, i) for s in placement(out, "g").slots for i in s.gpus]
    assert sorted(used) == [("n0", 0), ("n1", 0)]
