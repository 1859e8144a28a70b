"""The node core's fixed partitions and GPU picks, driven with a fake clock (no sockets, no processes).

Partitions (``Register.partition``): several guaranteed workers on one GPU while their shares sum to at most 1
and their caps to at most its memory; their limits never change; a whole-GPU guaranteed worker still excludes
every other guaranteed one; opportunistic workers there get what the partitions leave. Picks
(``Register.pick_gpu``): an opportunistic worker goes to the least utilized GPU under 80% whose memory fits.
"""
from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore, Reply, Send
from colocate.node.pick import GpuRoom, pick_gpu

GiB = 1 << 30
MiB = 1 << 20
G, O = "guaranteed", "opportunistic"


class Core:
    """A NodeCore on ``gpus`` sim GPUs of 16 GiB, a fake clock, and every limits update each worker was sent."""

    def __init__(self, policy="adaptive", gpus=1):
        self.t = 100.0
        self.core = NodeCore([GpuSpec(index=i, kind="sim", mem_total=16 * GiB) for i in range(gpus)],
                             NodeConfig(policy=policy, baseline_batches=2, baseline_warmup_batches=0,
                                        window_batches=2, rebaseline_s=0.0, slo_patience_windows=1),
                             node_epoch=3)
        self.sent: dict[str, list[P.Limits]] = {}
        self.pids = 1000
        self.reports: dict[str, int] = {}

    def handle(self, event, dt=0.01):
        self.t += dt
        out = self.core.handle(event, self.t)
        for c in out:
            if isinstance(c, Send) and hasattr(c.msg, "limits"):
                self.sent.setdefault(c.job_id, []).append(c.msg.limits)
        return out

    def register(self, job_id, priority=G, share=1.0, cap=None, partition=False, gpu=0, pick=False, pid=None):
        self.pids += 1
        return self.handle(P.Register(job_id=job_id, pid=pid or self.pids, gpu=gpu, priority=priority,
                                      mem_request=cap, sm_share=share, mem_cap=cap or 16 * GiB, epoch=1,
                                      sm_request=share, partition=partition, pick_gpu=pick))

    def report(self, job_id, duration=0.05, busy=0.04, reserved=64 * MiB):
        seq = self.reports[job_id] = self.reports.get(job_id, -1) + 1
        lim = self.sent[job_id][-1]
        return self.handle(P.BatchReport(job_id=job_id, seq=seq, t_end=self.t, duration_s=duration, busy_s=busy,
                                         device_start_s=0.0, mem_allocated_peak=reserved, mem_reserved=reserved,
                                         mem_floor=0, host_bytes=0, host_bytes_touched=0, limits_seq=lim.seq),
                           dt=duration)


def outcome(out) -> str:
    """``welcome`` or the refusal's one line."""
    for c in out:
        if isinstance(c, Send) and isinstance(c.msg, P.Welcome):
            return "welcome"
        if isinstance(c, Reply) and isinstance(c.msg, P.Error):
            assert "\n" not in c.msg.message
            return f"{c.msg.code}: {c.msg.message}"
    raise AssertionError(out)


def part(job_id, share, cap_gib, gpu=0):
    return ("register", dict(job_id=job_id, share=share, cap=int(cap_gib * GiB), partition=True, gpu=gpu))


def whole(job_id, gpu=0):
    return ("register", dict(job_id=job_id, gpu=gpu))


def opp(job_id, gpu=0):
    return ("register", dict(job_id=job_id, priority=O, gpu=gpu))


def bye(job_id):
    return ("bye", job_id)


@pytest.mark.parametrize("case, steps, want", [
    ("two halves fit", [part("a", 0.5, 8), part("b", 0.5, 8)], "welcome"),
    ("three of a quarter and a half fit", [part("a", 0.25, 4), part("b", 0.25, 4), part("c", 0.5, 8)], "welcome"),
    ("shares over 1", [part("a", 0.6, 4), part("b", 0.5, 4)],
     "rejected: GPU 0: a partition of share 0.5 does not fit: its partitions (a) hold 0.6 of its compute"),
    ("caps over the memory", [part("a", 0.5, 8), part("b", 0.5, 9)],
     "rejected: GPU 0: a partition capped at 9663676416 bytes does not fit: its partitions hold 8589934592 of "
     "17179869184 bytes"),
    ("a whole-GPU guaranteed worker excludes partitions", [whole("g"), part("a", 0.5, 8)],
     "rejected: GPU 0 already runs guaranteed job g"),
    ("partitions exclude a whole-GPU guaranteed worker", [part("a", 0.5, 8), whole("g")],
     "rejected: GPU 0 already runs guaranteed job a"),
    ("one guaranteed job per GPU is kept", [whole("g"), whole("h")], "rejected: GPU 0 already runs guaranteed job g"),
    ("opportunistic workers beside partitions", [part("a", 0.5, 8), part("b", 0.5, 8), opp("o")], "welcome"),
    ("another GPU is another budget", [part("a", 1.0, 16), part("b", 1.0, 16, gpu=1)], "welcome"),
    ("a partition that left frees its room", [part("a", 0.6, 8), bye("a"), part("b", 0.5, 9)], "welcome"),
])
def test_partition_admission(case, steps, want):
    c = Core(gpus=2)
    for i, (kind, arg) in enumerate(steps):
        if kind == "bye":
            c.handle(P.Goodbye(job_id=arg, exit_code=0, reason="done"))
            continue
        got = outcome(c.register(**arg))
        if i < len(steps) - 1:
            assert got == "welcome", (case, got)
    assert got == want, case


def test_a_partition_registering_again_counts_its_own_claim_once():
    c = Core()
    c.register("a", share=0.5, cap=8 * GiB, partition=True, pid=7)
    c.register("b", share=0.5, cap=8 * GiB, partition=True, pid=8)
    assert outcome(c.register("a", share=0.5, cap=8 * GiB, partition=True, pid=7)) == "welcome"


@pytest.mark.parametrize("policy", ["exclusive", "pack", "static", "adaptive"])
def test_partitions_keep_their_limits_and_opportunistic_work_gets_what_they_leave(policy):
    c = Core(policy)
    c.register("a", share=0.5, cap=6 * GiB, partition=True)
    c.register("b", share=0.25, cap=4 * GiB, partition=True)
    c.register("o", priority=O)
    for i in range(40):  # the guaranteed side slows down and recovers: the adaptive policy reacts on the opps
        c.report("a", duration=0.05 if i % 10 < 5 else 0.09)
        c.report("b", duration=0.07)
        c.report("o", busy=0.05, reserved=512 * MiB)
    for job_id, share, cap in (("a", 0.5, 6 * GiB), ("b", 0.25, 4 * GiB)):
        assert len(c.sent[job_id]) == 1, c.sent[job_id]  # the Welcome only: never a SetLimits
        lim = c.sent[job_id][0]
        assert (lim.mem_cap, lim.sm_share, lim.gate) == (cap, share, False)
        assert c.core.jobs[job_id].slo_state == "partition"
    assert c.sent["o"] and all(lim.mem_cap <= 6 * GiB for lim in c.sent["o"])  # 16 - 6 - 4 GiB at most


def test_the_adaptive_policy_treats_the_partitions_as_the_guaranteed_side():
    c = Core("adaptive")
    c.register("a", share=0.5, cap=6 * GiB, partition=True)
    c.register("o", priority=O)
    assert c.sent["o"][-1].sm_share == 0.0  # paused while the guaranteed side's solo speed is measured
    c.register("b", share=0.5, cap=6 * GiB, partition=True)
    for _ in range(12):
        c.report("a")
        c.report("b")
        lim = c.sent["o"][-1]
        c.handle(P.LimitsApplied(job_id="o", limits_seq=lim.seq, applied_at=c.t))
    lim = c.sent["o"][-1]
    assert lim.sm_share > 0 and lim.gate  # measured, then let in, yielding to the partitions


def test_a_partition_limits_cannot_be_overridden():
    c = Core()
    c.register("a", share=0.5, cap=6 * GiB, partition=True)
    got = outcome(c.handle(P.CtlSet(job_id="a", mem_cap=None, sm_share=0.9)))
    assert got == "rejected: a is a fixed partition of GPU 0: its limits are what its engine granted"
    assert c.core.jobs["a"].limits.sm_share == 0.5


def test_a_promotion_never_breaks_the_partitions():
    from colocate.node import events as E
    from colocate.node.commands import Note
    from colocate.node.table import Worker

    c = Core()
    c.register("a", share=0.5, cap=6 * GiB, partition=True)
    msg = P.StartPlacement(placement_id="p", job_id="o", priority=O, request=P.JobRequest(command=("x",), cwd="/", env=()),
                           workers=(P.WorkerLaunch(0, 0, (0,)),), world_size=1, group_rank=0, master_addr="h",
                           master_port=0)
    c.core.handle(E.Start(msg), c.t)
    c.core.handle(E.Launched(msg, (Worker(0, 0, [0], 9, 1.0, "", ""),)), c.t)
    c.register("o", priority=O)
    out = c.core.handle(E.Promoted("p"), c.t)
    assert not c.core.jobs["o"].guaranteed
    assert any(isinstance(x, Note) and "stays opportunistic" in x.text for x in out)


@pytest.mark.parametrize("rooms, mem, want", [
    ([(0, 0.5, 8), (1, 0.2, 8)], 1, 1),  # the least utilized
    ([(0, 0.2, 8), (1, 0.2, 8)], 1, 0),  # a tie: the lowest index
    ([(0, 0.5, 8), (1, 0.1, 1)], 2, 0),  # the least utilized has no room
    ([(0, 0.8, 8), (1, 0.95, 8)], 1, None),  # all at or over 80%
    ([(0, 0.1, 0)], None, None),  # no memory free at all
    ([(0, 0.1, 1)], None, 0),
])
def test_pick_gpu(rooms, mem, want):
    assert pick_gpu([GpuRoom(i, u, g * GiB) for i, u, g in rooms], None if mem is None else mem * GiB) == want


def test_the_node_picks_an_opportunistic_worker_gpu_and_says_which():
    c = Core(gpus=2)
    c.register("g", cap=15 * GiB)
    for _ in range(100):  # GPU 0 busy 90% of the last 10 s
        c.report("g", duration=0.1, busy=0.09, reserved=15 * GiB)
    out = c.register("o", priority=O, cap=2 * GiB, pick=True)
    welcome = [m.msg for m in out if isinstance(m, Send) and isinstance(m.msg, P.Welcome)]
    assert welcome and welcome[0].gpu == 1 and c.core.jobs["o"].gpu == 1
    out = c.register("o", priority=O, cap=2 * GiB, pick=True, pid=c.pids)  # its link again: the same GPU
    assert [m.msg.gpu for m in out if isinstance(m, Send) and isinstance(m.msg, P.Welcome)] == [1]
    c.register("h", gpu=1, cap=16 * GiB)
    for _ in range(100):
        c.report("h", duration=0.1, busy=0.09)
    got = outcome(c.register("p", priority=O, cap=2 * GiB, pick=True))
    # GPU 0 has gone quiet but has 1 GiB left; GPU 1 is busy
    assert got == ("rejected: no GPU on this node is under 80% busy with 2048 MiB free (GPU 0: 0% busy, 1024 MiB "
                   "free, GPU 1: 90% busy, 16320 MiB free)")


def test_the_scheduler_sees_a_partition_cap_as_used_memory():
    from colocate.node.gpustatus import core_gpu_status

    c = Core()
    c.register("a", share=0.5, cap=6 * GiB, partition=True)
    c.register("o", priority=O)
    c.report("a", reserved=100 * MiB)
    c.report("o", reserved=300 * MiB)
    assert core_gpu_status(c.core, c.t)[0].mem_used == 6 * GiB + 300 * MiB
