"""cluster/capacity.py and its use by the core (observation 14 of issue 13): a request no node that has
joined could ever hold is refused at submit with one line; a pending job that becomes so when the
cluster shrinks is set aside with a reason, never blocks its queue, and returns when a node that can
hold it joins; a job merely waiting for busy GPUs is never set aside."""

from __future__ import annotations

import pytest

from cluster import events as ev
from cluster.capacity import never_fits
from cluster.events import FAILED, PENDING, PLACING
from cluster.spec import JobSpec, NodeSpec
from tests.cluster.helpers import (
    changes,
    config,
    job,
    make_core,
    run,
    start_all,
    starts,
    submit,
)

GIB = 1 << 30
TIB = 1 << 40


@pytest.mark.parametrize("nodes, spec, fragment", [
    # the case: 100 TiB per GPU on 1 GiB GPUs, one worker of one GPU
    ([NodeSpec("n0", 2, gpu_mem=GIB)], job("j", gpu_mem=100 * TIB),
     "a worker needs 100 TiB GPU memory per GPU; the largest node has 1 GiB"),
    ([NodeSpec("n0", 2, gpu_mem=GIB)], job("j", gpu_mem=100 * TIB, klass="opportunistic"), "100 TiB GPU memory"),
    ([("n0", 2), ("n1", 2)], job("j", gpus=3), "a worker needs 3 GPUs on one node; the largest node has 2"),
    ([("n0", 2), ("n1", 2)], job("j", workers=5), "the gang needs 5 GPUs; the cluster has 4"),
    ([("n0", 2)], job("j", workers=3, klass="opportunistic"), "the gang needs 3 GPUs; the cluster has 2"),
    ([("n0", 4), ("n1", 2)], job("j", workers=2, gpus=3), "the gang needs 2 workers at once; the known nodes can hold 1"),
    ([("n0", 1)], job("j", workers=3, gpu_milli=600), "the gang needs 3 workers at once; the known nodes can hold 1"),
    ([NodeSpec("n0", 2, gpu_model="T4")], job("j", gpu_model="A100"), "no known node has A100 GPUs (models: T4)"),
    ([NodeSpec("n0", 2, cpu_milli=8000)], job("j", cpu_milli=16000), "16000 milli-CPU; the largest node has 8000"),
    ([NodeSpec("n0", 2, mem_mib=1024)], job("j", gpus=0, mem_mib=4096), "4096 MiB of host memory"),
    # memory per GPU on the nodes with enough GPUs: the 8 GiB node has only 1 GPU
    ([NodeSpec("n0", 1, gpu_mem=8 * GIB), NodeSpec("n1", 2, gpu_mem=GIB)], job("j", gpus=2, gpu_mem=4 * GIB),
     "4 GiB GPU memory per GPU; the largest node has 1 GiB"),
])
def test_a_request_no_known_node_could_hold_is_refused_at_submit(nodes, spec, fragment):
    core = make_core("antman", nodes)
    why = core.validate(spec)
    assert why is not None and fragment in why and "\n" not in why
    out = submit(core, spec)
    assert changes(out, "j") == [FAILED] and fragment in core.job("j").reason
    assert core.queues() == {}


@pytest.mark.parametrize("nodes, spec", [
    ([], job("j", gpus=64)),  # no node known yet: nothing to judge by
    ([NodeSpec("n0", 2, gpu_mem=GIB)], job("j", gpus=2, gpu_mem=GIB)),
    ([("n0", 1)], job("j", workers=2, gpu_milli=500)),  # two shares on one GPU
    ([NodeSpec("n0", 2, gpu_mem=4 * GIB)], job("j", workers=2, gpu_mem=2 * GIB, klass="opportunistic")),
    ([NodeSpec("n0", 2, gpu_model="T4"), NodeSpec("n1", 4, gpu_model="V100")], job("j", gpus=4, gpu_model="T4|V100")),
    ([("n0", 2)], job("j", workers=1, gpus=0, cpu_milli=10 ** 6)),  # the node does not state CPU: never limited
])
def test_a_request_some_known_node_could_hold_is_accepted(nodes, spec):
    core = make_core("antman", nodes)
    assert core.validate(spec) is None
    assert never_fits(core.state.shapes, spec, spec.klass) is None


def test_a_job_waiting_for_busy_gpus_is_not_set_aside():
    core = make_core("gang-binpack", [("a", 2)])
    run(core, job("x", gpus=2))
    submit(core, job("big", gpus=2, t=1.0), job("small", gpus=1, t=2.0), now=2.0)
    assert core.set_aside() == {}
    assert core.queues() == {"default": ["big", "small"]}  # FIFO: the busy head blocks, as it should
    assert core.blocked()["default"][0] == "big"


def test_a_job_the_shrunk_cluster_cannot_hold_is_set_aside_and_returns_when_a_node_can():
    """The issue's case: a 2-GPU job after its only 2-GPU node came back with 1 GPU. It must not block
    its queue while GPUs are free; it returns to its place in the queue when a 2-GPU node joins."""
    core = make_core("gang-binpack", [("a", 2), ("b", 1)])
    start_all(core, submit(core, job("x", gpus=2)))
    submit(core, job("big", gpus=2, t=1.0), job("small", gpus=1, t=2.0), job("b2", gpus=1, t=3.0), now=3.0)
    assert core.queues() == {"default": ["big", "small", "b2"]}  # big waits for x's GPUs, and blocks (FIFO)
    core.handle(ev.NodeLost("a", "silent"), 4.0)
    out = core.handle(ev.NodeJoined(NodeSpec("a", 1), 2), 5.0)  # back with 1 GPU
    placed = starts(out)
    assert set(placed) == {"small", "b2"}  # the free GPUs are used: nothing blocks the queue
    aside = core.set_aside()
    assert set(aside) == {"x", "big"}
    assert aside["big"] == "a worker needs 2 GPUs on one node; the largest node has 1"
    reasons = {d.job_id: d.reason for d in out if isinstance(d, ev.JobChanged) and d.state == PENDING}
    assert reasons["big"].startswith("set aside: a worker needs 2 GPUs on one node")
    assert core.job("big").state == PENDING and core.counters()["pending"] == 2
    assert core.queues() == {} and core.blocked() == {}
    # a job no node could hold is refused now; one that waits for busy GPUs still queues
    assert core.validate(job("y", gpus=2)) is not None and core.validate(job("y", gpus=1)) is None
    # cancelling a job set aside works as for any pending job
    out = core.handle(ev.JobCancelled("x"), 6.0)
    assert changes(out, "x") == ["cancelled"] and set(core.set_aside()) == {"big"}
    out = core.handle(ev.NodeJoined(NodeSpec("c", 2), 1), 7.0)
    assert starts(out)["big"].nodes() == ("c",)
    assert [d.reason for d in out if isinstance(d, ev.JobChanged) and d.job_id == "big"][0].startswith("back in its queue")
    assert core.set_aside() == {} and core.job("big").state == PLACING
    core.state.check_invariants()


def test_a_job_set_aside_returns_to_its_place_in_the_queue():
    core = make_core("gang-binpack", [("a", 2)])
    start_all(core, submit(core, job("x", gpus=2)))
    submit(core, job("big", gpus=2, t=1.0), now=1.0)
    core.handle(ev.NodeLost("a", "silent"), 2.0)
    core.handle(ev.NodeJoined(NodeSpec("a", 1), 2), 3.0)
    assert set(core.set_aside()) == {"x", "big"}
    start_all(core, submit(core, job("later", gpus=1, t=4.0), now=4.0))
    submit(core, job("last", gpus=1, t=5.0), now=5.0)
    core.handle(ev.NodeLost("a", "silent"), 6.0)
    out = core.handle(ev.NodeJoined(NodeSpec("a", 2), 3), 7.0)  # back with 2 GPUs; later's slot was lost: requeued
    assert set(starts(out)) == {"x"}  # the first job in submit order
    assert core.queues() == {"default": ["big", "later", "last"]}  # big back at its place, ahead of later jobs


def test_with_refuse_unplaceable_off_a_request_is_accepted_and_set_aside():
    cfg = config(["fifo", "gang", "binpack"], scheduler={"refuse_unplaceable": False})
    core = make_core(cfg, [NodeSpec("n0", 1, gpu_mem=GIB)])
    assert core.validate(job("j", gpu_mem=100 * TIB)) is None
    out = submit(core, job("j", gpu_mem=100 * TIB), job("k", t=1.0), now=1.0)
    assert set(starts(out)) == {"k"} and set(core.set_aside()) == {"j"}


def test_never_fits_is_cached_per_shape_until_the_nodes_change():
    core = make_core("gang-binpack", [("a", 1)])
    big = JobSpec("j", gpus=2)
    from cluster.jobs import Job

    assert core.fw.never_fits(Job(big, 0)) is not None
    v = core.state.shapes_version
    core.handle(ev.NodeJoined(NodeSpec("b", 2), 1), 1.0)
    assert core.state.shapes_version != v and core.fw.never_fits(Job(big, 1)) is None
