"""Random event sequences (hypothesis): allocations never exceed capacity, every gang is whole,
every job ends at most once and nothing is left held after a drain, JobChanged precedes the
StartWorkers/StopWorkers it causes, and the same events give the same decisions."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import events as ev
from cluster.events import PENDING, PLACING, RUNNING
from cluster.spec import JobSpec, NodeSpec
from colocate.base.vocab import TERMINAL
from tests.cluster.helpers import make_core
from tests.support import examples

GIB = 1 << 30
NODES = [NodeSpec("n0", 4, gpu_mem=16 * GIB), NodeSpec("n1", 2, gpu_mem=16 * GIB), NodeSpec("n2", 4)]
POLICIES = ["antman", "backfill", "quota", "multi-queue", "fifo"]

submit_op = st.tuples(st.just("submit"), st.integers(1, 3), st.integers(0, 3), st.sampled_from([1000, 1000, 500, 250]),
                      st.sampled_from([0, 0, 4 * GIB, 12 * GIB]), st.sampled_from(["guaranteed", "guaranteed", "opportunistic"]),
                      st.sampled_from([None, 5.0, 50.0]), st.sampled_from(["u0", "u1", "u2"]))
ops = st.lists(st.one_of(
    submit_op, submit_op,
    st.tuples(st.just("start"), st.integers(0, 50), st.integers(1, 7)),
    st.tuples(st.just("exit"), st.integers(0, 50), st.integers(0, 2), st.sampled_from([0, 0, 0, 1])),
    st.tuples(st.just("confirm")),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("refuse"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("lose"), st.integers(0, 2), st.sampled_from([0.0, 0.0, 20.0])),
    st.tuples(st.just("join"), st.integers(0, 2)),
    st.tuples(st.just("report"), st.integers(0, 2), st.lists(st.floats(0, 1), min_size=4, max_size=4), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0, 400)),
), min_size=5, max_size=50)


def _event(core, op, n):
    """The event(s) an op stands for, given the core's current state (deterministic)."""
    kind = op[0]
    jobs = sorted(core.jobs.values(), key=lambda j: j.seq)
    live = [j for j in jobs if j.state in (PLACING, RUNNING)]
    if kind == "submit":
        _, workers, gpus, milli, mem, prio, est, user = op
        if milli < 1000 and gpus != 1:
            milli = 1000
        return [ev.JobSubmitted(JobSpec(f"j{n}", submit_time=float(n), workers=workers, gpus=gpus, gpu_milli=milli,
                                        gpu_mem=mem, klass=prio, estimate_s=est, user=user, queue="default"))]
    if kind == "start" and live:
        j = live[op[1] % len(live)]
        return [ev.RankStarted(j.job_id, j.placement_id, r) for r in range(j.spec.workers) if op[2] >> r & 1]
    if kind == "exit" and live:
        j = live[op[1] % len(live)]
        return [ev.RankExited(j.job_id, j.placement_id, op[2] % j.spec.workers, op[3])]
    if kind == "confirm":
        return [ev.RankExited(s.job.job_id, pid, a.rank, 143) for pid, s in core.stopping.items()
                for a in core.state.allocs.get(pid, {}).values()]
    if kind == "cancel" and jobs:
        return [ev.JobCancelled(jobs[op[1] % len(jobs)].job_id)]
    if kind == "refuse" and live:
        j = live[op[1] % len(live)]
        return [ev.PlacementRefused(j.job_id, j.placement_id, j.placement.slots[0].node_id, "test", op[2])]
    if kind == "lose":  # at once, or held while the node's lease may still let its workers run
        return [ev.NodeLost(NODES[op[1]].node_id, "test", op[2])]
    if kind == "join":
        node = core.state.nodes.get(NODES[op[1]].node_id)
        return [ev.NodeJoined(NODES[op[1]], (node.epoch if node else 0) + 1)]
    if kind == "report":
        spec = NODES[op[1]]
        node = core.state.nodes.get(spec.node_id)
        if node is None:
            return []
        workers = ()
        if op[3]:  # list the workers the core placed there as running
            workers = tuple(ev.WorkerReport(pid.rsplit(".", 1)[0], pid, rank, True) for (pid, rank) in node.slots)
        gpus = tuple(ev.GpuReport(i, u, 0) for i, u in zip(range(spec.gpus), op[2]))
        return [ev.NodeReport(spec.node_id, node.epoch, gpus, workers)]
    if kind == "tick":
        return [ev.Tick()]
    return []


def _check_decisions(out, ended):
    seen_changed = set()
    for d in out:
        if isinstance(d, ev.JobChanged):
            assert d.job_id not in ended, f"{d.job_id} changed after it ended"
            if d.state in TERMINAL:
                ended.add(d.job_id)
            seen_changed.add(d.job_id)
        elif isinstance(d, ev.StartWorkers):
            assert d.placement.job_id in seen_changed, "StartWorkers before its JobChanged"
            assert sorted(s.rank for s in d.placement.slots) == list(range(d.spec.workers))
        elif isinstance(d, ev.StopWorkers) and d.reason != "orphan":
            assert d.job_id in seen_changed, f"StopWorkers ({d.reason}) before its JobChanged"


def _check_state(core):
    core.state.check_invariants()
    for j in core.jobs.values():
        if j.state in (PLACING, RUNNING):
            held = core.state.allocs.get(j.placement_id, {})
            awaited = {slot.rank for items in core.recovery.awaiting.values() for _, pid, slot in items
                       if pid == j.placement_id}  # on a silent node, until it returns or its hold ends
            want = set(range(j.spec.workers)) - {r for r, c in j.exited.items() if c == 0}
            assert set(held) | awaited >= want, f"{j.job_id}: gang not whole ({sorted(held)} of {sorted(want)})"
            assert set(held) <= want
            assert all(core.state.nodes[a.node_id].up for a in held.values())
        elif j.state == PENDING:
            queued = j in core.fw.queues.get(j.queue, []) or core.retry.get(j.job_id, (0, None))[1] is j  # or backing off
            assert queued, f"{j.job_id} pending but not queued"


def drive(policy, program):
    core = make_core(policy, NODES)
    decisions, ended = [], set()
    now = 1.0
    for n, op in enumerate(program):
        now += op[1] if op[0] == "tick" else 1.0
        evs = _event(core, op, n)
        out = core.handle_batch(evs, now) if evs else []
        _check_decisions(out, ended)
        _check_state(core)
        decisions.append(out)
    # drain: every node up and idle, every placement started and finished
    for spec in NODES:
        node = core.state.nodes[spec.node_id]
        if not node.up:
            out = core.handle(ev.NodeJoined(spec, node.epoch + 1), now)
            _check_decisions(out, ended)
        gpus = tuple(ev.GpuReport(i, 0.0, 0) for i in range(spec.gpus))
        live = tuple(ev.WorkerReport(pid.rsplit(".", 1)[0], pid, rank, True) for (pid, rank) in core.state.nodes[spec.node_id].slots)
        _check_decisions(core.handle(ev.NodeReport(spec.node_id, core.state.nodes[spec.node_id].epoch, gpus, live), now), ended)
    for _ in range(60):
        now += 10.0
        evs = _event(core, ("confirm",), 0)
        for j in sorted(core.jobs.values(), key=lambda j: j.seq):
            if j.state in (PLACING, RUNNING):
                evs += [ev.RankStarted(j.job_id, j.placement_id, r) for r in range(j.spec.workers)]
                evs += [ev.RankExited(j.job_id, j.placement_id, r, 0) for r in range(j.spec.workers)]
        out = core.handle_batch(evs + [ev.Tick()], now)
        _check_decisions(out, ended)
        _check_state(core)
        if not evs and not any(j.state in (PLACING, RUNNING) for j in core.jobs.values()):
            break
    assert not any(j.state in (PLACING, RUNNING) for j in core.jobs.values())
    assert core.state.allocs == {} and not core.stopping
    assert ended == {j.job_id for j in core.jobs.values() if j.state in TERMINAL}
    return decisions


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), program=ops)
def test_random_event_sequences_keep_every_invariant(policy, program):
    first = drive(policy, program)
    assert drive(policy, program) == first  # same events, same decisions
