"""AntMan: opportunistic placement, preemption of opportunistic work, promotion."""

from __future__ import annotations

import pytest

from cluster.events import PENDING, RUNNING, Promote, Tick
from tests.cluster.helpers import changes, config, confirm_stops, job, make_core, report, run, starts, stops, submit

GIB = 1 << 30


def opp_core(nodes, threshold=None, max_per_gpu=None, extra=(), **params):
    opp = {}
    if threshold is not None:
        opp["util_threshold"] = threshold
    if max_per_gpu is not None:
        opp["max_per_gpu"] = max_per_gpu
    return make_core(config(["fifo", "gang", "binpack", "opportunistic", *extra], opportunistic=opp, **params), nodes)


def opp(job_id, gpus=1, t=0.0, **kw):
    return job(job_id, gpus=gpus, t=t, klass="opportunistic", **kw)


@pytest.mark.parametrize("utils, threshold, gpu", [
    ([0.9, 0.5], None, 1),  # default threshold 0.8
    ([0.85, 0.95], None, None),  # every GPU too busy
    ([0.85, 0.95], 0.9, 0),  # a higher threshold admits GPU 0
    ([0.5, 0.1, 0.3], None, 1),  # least utilized first
    ([0.8, 0.79], None, 1),  # strictly under the threshold
    ([0.8, 0.9], None, None),  # exactly at the threshold is too busy
])
def test_opportunistic_threshold_and_order(utils, threshold, gpu):
    core = opp_core([("n0", len(utils))], threshold=threshold)
    report(core, "n0", utils)
    out = submit(core, opp("o"))
    placed = starts(out)
    if gpu is None:
        assert placed == {} and core.job("o").state == PENDING
    else:
        assert placed["o"].slots[0].gpus == (gpu,)
        assert placed["o"].klass == "opportunistic"


@pytest.mark.parametrize("mem_used, need, gpu", [
    ([12 * GIB, 2 * GIB], 8 * GIB, 1),  # GPU 0 lacks the memory, though less utilized
    ([12 * GIB, 10 * GIB], 8 * GIB, None),
    ([12 * GIB, 10 * GIB], 0, 0),  # no memory stated: memory never limits
])
def test_opportunistic_memory(mem_used, need, gpu):
    core = opp_core([("n0", 2, 16 * GIB)])
    report(core, "n0", [0.1, 0.2], mem_used=mem_used)
    placed = starts(submit(core, opp("o", gpu_mem=need)))
    assert (placed["o"].slots[0].gpus[0] if placed else None) == gpu


@pytest.mark.parametrize("max_per_gpu", [2, 0])
def test_opportunistic_jobs_of_one_cycle_spread_over_gpus_of_equal_utilization(max_per_gpu):
    """Utilization reports lag placements: within one cycle every GPU still reports 0, so the
    number of opportunistic workers a GPU already holds breaks the tie."""
    core = opp_core([("n0", 2), ("n1", 2)], max_per_gpu=max_per_gpu)
    run(core, job("g0", gpus=2), job("g1", gpus=2))  # every GPU beside a guaranteed job
    placed = starts(submit(core, opp("o1"), opp("o2"), opp("o3"), opp("o4")))
    gpus = [(p.slots[0].node_id, p.slots[0].gpus[0]) for p in placed.values()]
    assert len(placed) == 4 and len(set(gpus)) == 4, gpus


def test_opportunistic_prefers_a_gpu_beside_a_guaranteed_job_at_equal_utilization():
    core = opp_core([("n0", 2)])
    g = run(core, job("g"))
    busy = g["g"].slots[0].gpus[0]
    report(core, "n0", [0.2, 0.2])
    placed = starts(submit(core, opp("o", t=1), now=1.0))
    assert placed["o"].slots[0].gpus == (busy,)


def test_opportunistic_takes_no_guaranteed_allocation():
    core = opp_core([("n0", 1)])
    run(core, opp("o"))
    gpu = core.state.nodes["n0"].gpus[0]
    assert gpu.milli == 0 and core.state.free_gpus() == 1 and list(gpu.o) == ["o.1"]
    placed = run(core, job("g", t=1), now=1.0)  # a guaranteed job still gets the GPU
    assert placed["g"].slots[0].gpus == (0,)
    assert stops([]) == [] and core.job("o").state == RUNNING
    core.state.check_invariants()


@pytest.mark.parametrize("max_per_gpu, placed", [(1, ["o1"]), (2, ["o1", "o2"]), (0, ["o1", "o2", "o3"])])
def test_opportunistic_max_per_gpu(max_per_gpu, placed):
    core = opp_core([("n0", 1)], max_per_gpu=max_per_gpu)
    got = run(core, opp("o1"), opp("o2", t=1), opp("o3", t=2))
    assert sorted(got) == placed


def test_opportunistic_queue_never_blocks():
    core = opp_core([("n0", 1, 16 * GIB)])
    got = run(core, opp("big", gpu_mem=32 * GIB), opp("small", t=1, gpu_mem=GIB))
    assert list(got) == ["small"]


def test_no_opportunistic_plugin_rejects_opportunistic_jobs():
    core = make_core("gang-binpack", [("n0", 1)])
    submit(core, opp("o"))
    assert core.job("o").state == "failed" and "opportunistic" in core.job("o").reason


def test_preemption_stops_opportunistic_work_for_a_guaranteed_job():
    core = opp_core([("n0", 1, 16 * GIB)], extra=["preemption"])
    run(core, opp("o", gpu_mem=12 * GIB))
    out = submit(core, job("g", gpu_mem=8 * GIB, t=1), now=1.0)
    assert [(d.job_id, d.reason) for d in stops(out)] == [("o", "preempted")]
    assert changes(out, "o") == [PENDING]
    assert "g" not in starts(out)  # the freed GPU is used once the stop is confirmed
    assert core.counters()["preemptions"] == 1
    out = confirm_stops(core, out, now=2.0)
    assert starts(out)["g"].slots[0].gpus == (0,)
    assert "o" not in starts(out)  # the victim does not take the memory back first
    core.state.check_invariants()


def test_no_new_opportunistic_work_lands_on_a_node_held_for_a_preemptor():
    """While the victims stop, the node the preemptor is planned on is held: a new opportunistic job
    placed there meanwhile could make the claim fail and preempt again, without end."""
    core = opp_core([("n0", 2, 16 * GIB)], extra=["preemption"], max_per_gpu=0)
    run(core, opp("o", gpus=2, gpu_mem=12 * GIB))
    out = submit(core, job("g", gpus=2, gpu_mem=8 * GIB, t=1), now=1.0)  # 4 GiB free per GPU: o must stop
    assert [d.job_id for d in stops(out)] == ["o"] and core.fw.reserved == {"g": ("n0",)}
    late = submit(core, opp("late", gpu_mem=1 * GIB, t=1.5), now=1.5)  # would fit beside the stopping o
    assert "late" not in starts(late) and core.job("late").state == PENDING
    out = confirm_stops(core, out, now=2.0)
    assert starts(out)["g"].slots[0].gpus == (0, 1) and core.fw.reserved == {}
    assert "late" in starts(out)  # the hold ends with the claim: it runs beside g
    core.state.check_invariants()


@pytest.mark.parametrize("g1_milli, g2_mem", [
    (1000, 0),  # g2 blocked by g1's whole-GPU share
    (500, 8),  # room for g2's share, but g1's guaranteed memory is in the way
])
def test_preemption_only_frees_opportunistic_placements(g1_milli, g2_mem):
    core = opp_core([("n0", 1, 16 * GIB)], extra=["preemption"])
    run(core, job("g1", gpu_milli=g1_milli, gpu_mem=12 * GIB), opp("o", t=1, gpu_mem=GIB))
    out = submit(core, job("g2", gpu_milli=500, gpu_mem=g2_mem * GIB, t=2), now=2.0)
    assert stops(out) == [] and core.job("g1").state == RUNNING and core.job("o").state == RUNNING
    assert core.job("g2").state == PENDING


@pytest.mark.parametrize("held, need, victims", [
    ([6, 6], 8, ["o2"]),  # one victim is enough: the youngest of equal size
    ([10, 4], 8, ["o1"]),  # fewest: the older but larger one, not the youngest two
    ([7, 7], 16, ["o2", "o1"]),  # both needed
    ([7, 7], 17, []),  # nothing helps: no stop at all
])
def test_preemption_fewest_then_youngest(held, need, victims):
    core = opp_core([("n0", 1, 16 * GIB)], max_per_gpu=0, extra=["preemption"])
    for i, g in enumerate(held, 1):
        run(core, opp(f"o{i}", t=i, gpu_mem=g * GIB), now=float(i))
    out = submit(core, job("g", gpu_mem=need * GIB, t=10), now=10.0)
    assert [d.job_id for d in stops(out)] == victims


def test_promotion_starts_a_long_waiting_guaranteed_job_as_opportunistic():
    cfg = config(["fifo", "gang", "binpack", "opportunistic", "promotion"], promotion={"wait_s": 60.0})
    core = make_core(cfg, [("n0", 1)])
    run(core, job("g1"))
    out = submit(core, job("g2", t=1), now=1.0)
    assert starts(out) == {}
    out = core.handle(Tick(), 30.0)
    assert starts(out) == {}  # waited 29 s < 60 s
    out = core.handle(Tick(), 70.0)
    assert starts(out)["g2"].klass == "opportunistic"
    assert [d.reason for d in out if getattr(d, "job_id", "") == "g2"][0] == "as opportunistic"
    assert core.state.nodes["n0"].gpus[0].milli == 1000  # g1 only


def test_promotion_upgrades_in_place_where_guaranteed_capacity_is_free():
    cfg = config(["fifo", "gang", "binpack", "opportunistic", "promotion"], promotion={"interval_s": 0.0})
    core = make_core(cfg, [("n0", 2)])
    g = run(core, job("g"))
    run(core, opp("o", t=1), now=1.0)
    o_gpu = core.job("o").placement.slots[0].gpus[0]
    shared = o_gpu == g["g"].slots[0].gpus[0]
    out = core.handle(Tick(), 5.0)
    promotes = [d for d in out if isinstance(d, Promote)]
    if shared:  # beside a guaranteed job: no guaranteed capacity free there
        assert promotes == []
    else:
        assert [p.job_id for p in promotes] == ["o"]
        i = out.index(promotes[0])
        assert out[i - 1].job_id == "o" and out[i - 1].state == RUNNING  # JobChanged first
        assert core.job("o").placement.klass == "guaranteed"
        assert core.state.nodes["n0"].gpus[o_gpu].milli == 1000
    core.state.check_invariants()


def test_promotion_upgrade_of_a_lone_opportunistic_job():
    cfg = config(["fifo", "gang", "binpack", "opportunistic", "promotion"], promotion={"interval_s": 0.0})
    core = make_core(cfg, [("n0", 1)])
    run(core, opp("o"))
    out = core.handle(Tick(), 5.0)
    assert [d.job_id for d in out if isinstance(d, Promote)] == ["o"]
    assert core.state.free_gpus() == 0
    out = submit(core, job("g", t=6), now=6.0)
    assert starts(out) == {}  # the promoted job holds the GPU as guaranteed now
