"""Unit tests of the node coordinator's pure core and its policies, driven with a fake clock.

No sockets and no processes: every test feeds protocol messages (built with ``colocate.protocol``) to
``NodeCore.handle(event, now)`` and checks the ``Send``/``Reply`` commands it returns.
"""
from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node.config import NodeConfig
from colocate.node.core import JobLost, NodeCore, NodeTick, Reply, Send
from colocate.node.policies import water_fill

MiB = 1 << 20
GiB = 1 << 30
HEADROOM = 256 * MiB

# Short phases so the adaptive policy moves quickly; idle detection far away unless a test wants it.
FAST = dict(baseline_batches=3, baseline_warmup_batches=0, window_batches=2, rebaseline_s=0.0, guaranteed_idle_s=5.0,
            opp_start_share=0.1, opp_share_step=0.1, opp_backoff=0.5, opp_min_share=0.05, slo_slowdown=0.05,
            slo_patience_windows=1, slo_grow_fraction=1.0,
            mem_headroom_bytes=HEADROOM)


class Node:
    """A NodeCore plus a fake clock and a per-job record of the limits it was sent."""

    def __init__(self, policy="adaptive", mem=16 * GiB, gpus=1, **cfg):
        self.t = 100.0
        self.core = NodeCore([GpuSpec(index=i, kind="sim", mem_total=mem) for i in range(gpus)],
                             NodeConfig(policy=policy, **cfg), node_epoch=7)
        self.limits: dict[str, P.Limits] = {}
        self.sent: list[Send] = []
        self.seq_report: dict[str, int] = {}

    def handle(self, event, dt: float = 0.0) -> list:
        self.t += dt
        out = self.core.handle(event, self.t)
        for cmd in out:
            assert isinstance(cmd, (Send, Reply)), cmd
            if isinstance(cmd, Send):
                self.sent.append(cmd)
                lim = getattr(cmd.msg, "limits", None)
                if lim is not None:
                    prev = self.limits.get(cmd.job_id)
                    # invariant: every limits update a job gets carries a strictly larger seq
                    assert prev is None or lim.seq > prev.seq, (cmd, prev)
                    self.limits[cmd.job_id] = lim
        return out

    def register(self, job_id, priority="guaranteed", pid=1000, gpu=0, mem_request=None, epoch=1, dt=0.0,
                 sm_share=1.0, sm_request=1.0):
        return self.handle(P.Register(job_id=job_id, pid=pid, gpu=gpu, priority=priority, mem_request=mem_request,
                                      sm_share=sm_share, mem_cap=16 * GiB, epoch=epoch, sm_request=sm_request), dt)

    def report(self, job_id, duration=0.05, busy=0.02, reserved=32 * MiB, floor=0, host=0, dt=None):
        seq = self.seq_report.get(job_id, 0)
        self.seq_report[job_id] = seq + 1
        dt = duration if dt is None else dt
        lim = self.limits.get(job_id)
        msg = P.BatchReport(job_id=job_id, seq=seq, t_end=self.t + dt, duration_s=duration, busy_s=busy,
                            device_start_s=0.0, mem_allocated_peak=reserved, mem_reserved=reserved, mem_floor=floor,
                            host_bytes=host, host_bytes_touched=host, limits_seq=lim.seq if lim else 0)
        return self.handle(msg, dt)

    def share(self, job_id) -> float:
        return self.limits[job_id].sm_share

    def cap(self, job_id) -> int:
        return self.limits[job_id].mem_cap

    def state(self, job_id) -> str:
        return self.core.jobs[job_id].slo_state


def replies(out):
    return [c.msg for c in out if isinstance(c, Reply)]


def sends(out, job_id=None, kind=None):
    return [c.msg for c in out if isinstance(c, Send) and (job_id is None or c.job_id == job_id)
            and (kind is None or isinstance(c.msg, kind))]


def error_code(out):
    errs = [m for m in replies(out) if isinstance(m, P.Error)]
    assert len(errs) == 1, out
    return errs[0].code


def adaptive_pair(mem=16 * GiB, g_request=4 * GiB, **cfg):
    """A node with a guaranteed job g and an opportunistic job o on GPU 0, before any report."""
    n = Node("adaptive", mem=mem, **{**FAST, **cfg})
    n.register("g", mem_request=g_request, pid=11)
    n.register("o", priority="opportunistic", pid=12)
    return n


def finish_baseline(n, duration=0.05, reserved=32 * MiB, g="g", o="o"):
    """Feed guaranteed batches until the baseline is measured (the opportunistic job leaves share 0)."""
    for _ in range(40):
        n.report(g, duration=duration, reserved=reserved)
        if n.share(o) > 0:
            return
        for job in list(n.core.jobs.values()):  # each paused job reaches a boundary and confirms
            lim = n.limits.get(job.job_id)
            if lim is not None and lim.sm_share == 0.0 and job.applied_seq < lim.seq:
                n.handle(P.LimitsApplied(job_id=job.job_id, limits_seq=lim.seq, applied_at=n.t))
    raise AssertionError("baseline never completed")


# ---------------------------------------------------------------- registration and errors


def test_register_is_welcomed_with_limits():
    n = Node(**FAST)
    out = n.register("g", mem_request=4 * GiB)
    welcome = sends(out, "g", P.Welcome)
    assert len(welcome) == 1 and isinstance(out[0], Send)
    w = welcome[0]
    assert w.job_id == "g" and w.node_epoch == 7
    assert w.limits.seq == 1 and w.limits.mem_cap == 4 * GiB and w.limits.sm_share == 1.0 and not w.limits.gate
    assert set(n.core.jobs) == {"g"}


@pytest.mark.parametrize("case, setup, event, code", [
    ("second guaranteed on the same GPU",
     [("register", "g1", "guaranteed", 1)],
     ("register", "g2", "guaranteed", 2), "rejected"),
    ("job id in use by another pid",
     [("register", "o1", "opportunistic", 1)],
     ("register", "o1", "opportunistic", 2), "rejected"),
    ("guaranteed job id in use by another pid",
     [("register", "g1", "guaranteed", 1)],
     ("register", "g1", "guaranteed", 2), "rejected"),
    ("no such GPU",
     [],
     ("register_gpu", "g1", "guaranteed", 5), "invalid"),
    ("report of an unknown job", [], ("report", "ghost"), "unknown_job"),
    ("heartbeat of an unknown job", [], ("heartbeat", "ghost"), "unknown_job"),
    ("limits applied of an unknown job", [], ("applied", "ghost"), "unknown_job"),
    ("ctl set of an unknown job", [], ("ctlset", "ghost"), "unknown_job"),
    ("an event the core does not take", [], ("welcome", "x"), "forbidden"),
])
def test_errors(case, setup, event, code):
    n = Node(**FAST)
    for _, job, prio, pid in setup:
        n.register(job, priority=prio, pid=pid)
    before = dict(n.core.jobs)
    kind = event[0]
    if kind == "register":
        out = n.register(event[1], priority=event[2], pid=event[3])
    elif kind == "register_gpu":
        out = n.register(event[1], priority=event[2], gpu=event[3])
    elif kind == "report":
        out = n.report(event[1])
    elif kind == "heartbeat":
        out = n.handle(P.Heartbeat(job_id=event[1], sent_at=1.0))
    elif kind == "applied":
        out = n.handle(P.LimitsApplied(job_id=event[1], limits_seq=1, applied_at=1.0))
    elif kind == "ctlset":
        out = n.handle(P.CtlSet(job_id=event[1], sm_share=0.5, mem_cap=None))
    else:
        out = n.handle(P.Welcome(job_id=event[1], node_epoch=1, limits=P.Limits(seq=1, mem_cap=1, sm_share=1.0,
                                                                                gate=False)))
    assert error_code(out) == code, case
    assert not sends(out), case  # nobody else is told anything
    assert n.core.jobs == before, case  # and nothing changed


def test_reregister_same_pid_keeps_the_job_and_bumps_seq():
    n = Node(**FAST)
    n.register("g", pid=5)
    n.report("g")
    first = n.limits["g"]
    out = n.register("g", pid=5, epoch=2, dt=1.0)
    w = sends(out, "g", P.Welcome)[0]
    assert w.limits.seq > first.seq
    assert n.core.jobs["g"].iterations == 1  # same job, history kept


def test_heartbeat_is_echoed_and_limits_applied_measures_latency():
    n = Node(**FAST)
    n.register("g")
    out = n.handle(P.Heartbeat(job_id="g", sent_at=3.0), dt=0.5)
    assert [type(m) for m in replies(out)] == [P.Heartbeat]
    n.handle(P.LimitsApplied(job_id="g", limits_seq=n.limits["g"].seq, applied_at=1e6))
    assert n.core.control_count == 0  # the Welcome's limits: in force after the job's start-up, not timed
    n.handle(P.CtlSet(job_id="g", sm_share=0.5, mem_cap=None), dt=0.5)
    seq = n.limits["g"].seq
    sent_at = n.core.jobs["g"].sent_at[seq]
    # the job's own clock (applied_at) is not the node's: latency is the node's receive time - send time
    n.handle(P.LimitsApplied(job_id="g", limits_seq=seq, applied_at=1e6), dt=0.02)
    assert list(n.core.control_latencies) == [pytest.approx(n.t - sent_at)] == [pytest.approx(0.02)]
    assert n.core.control_count == 1 and n.core.control_sum_s == pytest.approx(0.02)


def test_goodbye_and_job_lost_free_the_gpu():
    n = Node(**FAST)
    n.register("g1", pid=1)
    n.handle(P.Goodbye(job_id="g1", exit_code=0, reason="exit"))
    assert "g1" not in n.core.jobs and n.core.gpus[0].jobs == []
    assert sends(n.register("g2", pid=2), "g2", P.Welcome)  # the GPU is free for another guaranteed job
    n.handle(JobLost("g2", "process 2 is gone"))
    assert n.core.jobs == {} and n.core.left[-1] == ("g2", "process 2 is gone")
    assert n.handle(P.Goodbye(job_id="g2", exit_code=None, reason="late")) == []  # idempotent
    assert (n.core.jobs_exited, n.core.jobs_lost) == (1, 1)  # a clean exit is not a loss


# ---------------------------------------------------------------- adaptive policy: compute (AIMD)


def test_adaptive_baseline_then_additive_increase_then_multiplicative_decrease():
    n = adaptive_pair()
    assert n.share("o") == 0.0 and n.state("o") == "baseline"  # paused while the baseline is measured
    assert n.share("g") == 1.0 and n.cap("g") == 4 * GiB
    assert n.limits["o"].gate  # opportunistic device work follows the guaranteed job's phases

    for _ in range(3):  # not profiled until o confirms its pause
        n.report("g", duration=0.05)
        assert n.share("o") == 0.0 and n.state("g") == "baseline"
    n.handle(P.LimitsApplied(job_id="o", limits_seq=n.limits["o"].seq, applied_at=n.t))  # o paused
    profiled = 0
    while n.share("o") == 0.0 and profiled < 10:  # baseline_batches=3 after the pause (+1 in flight)
        assert n.state("g") == "baseline"
        n.report("g", duration=0.05)
        profiled += 1
    assert 3 <= profiled <= 4
    assert n.share("o") == pytest.approx(0.1)  # opp_start_share once the baseline is known

    shares = []
    for _ in range(6):  # 3 windows of 2 batches, all within the SLO
        n.report("g", duration=0.051)
        shares.append(n.share("o"))
    assert shares[-1] == pytest.approx(0.4)
    assert shares == sorted(shares) and len(set(shares)) == 4  # grew by steps of 0.1
    assert n.state("g") == "ok" and n.state("o") == "growing"

    backed = []
    for _ in range(6):  # 3 windows beyond baseline * 1.05
        n.report("g", duration=0.06)
        backed.append(n.share("o"))
    assert backed[1] == pytest.approx(0.2) and backed[3] == pytest.approx(0.1) and backed[5] == pytest.approx(0.05)
    assert n.state("g") == "violated" and n.state("o") == "backoff"

    for _ in range(20):  # never below opp_min_share
        n.report("g", duration=0.2)
    assert n.share("o") == pytest.approx(0.05)

    for _ in range(2):  # recovers additively once the SLO holds again
        n.report("g", duration=0.05)
    assert n.share("o") == pytest.approx(0.15)
    assert n.share("g") == 1.0  # the guaranteed job is never throttled


@pytest.mark.parametrize("windows, want_share, want_state", [
    # (median batch time of each window after the budget reached 0.3; baseline 0.05, SLO 5%)
    ([0.0515], 0.4, "growing"),                # within the SLO: grow
    ([0.054], 0.3, "holding"),                 # one window a little over: hold (patience 2)
    ([0.054, 0.0515], 0.4, "growing"),         # ... and a good one after it grows again
    ([0.054, 0.054], 0.15, "backoff"),         # two in a row: back off
    ([0.054, 0.0515, 0.054], 0.4, "holding"),  # a good window in between resets the count
    ([0.056], 0.15, "backoff"),                # beyond twice the margin: back off at once
])
def test_adaptive_slo_patience(windows, want_share, want_state):
    n = adaptive_pair(slo_patience_windows=2)
    finish_baseline(n)
    for _ in range(4):  # 2 good windows: 0.1 -> 0.3
        n.report("g", duration=0.05)
    assert n.share("o") == pytest.approx(0.3)
    for duration in windows:
        for _ in range(2):
            n.report("g", duration=duration)
    assert n.share("o") == pytest.approx(want_share)
    assert n.state("o") == want_state


@pytest.mark.parametrize("duration, want_share, want_state", [
    (0.0512, 0.2, "growing"),  # 2.4% over the baseline: inside half the 5% margin, grow
    (0.0520, 0.1, "holding"),  # 4%: inside the SLO, outside the growth band: hold
    (0.0540, 0.05, "backoff"),  # 8%: over the SLO (patience 1 here): back off
])
def test_adaptive_grows_only_in_the_lower_part_of_the_slo(duration, want_share, want_state):
    n = adaptive_pair(slo_grow_fraction=0.5)
    finish_baseline(n)
    assert n.share("o") == pytest.approx(0.1)
    for _ in range(2):
        n.report("g", duration=duration)
    assert n.share("o") == pytest.approx(want_share)
    assert n.state("o") == want_state
    assert n.state("g") == ("violated" if want_state == "backoff" else "ok")


def test_adaptive_guaranteed_leaves_opportunistic_gets_the_whole_gpu():
    n = adaptive_pair(mem=16 * GiB)
    finish_baseline(n)
    assert 0 < n.share("o") < 1
    out = n.handle(P.Goodbye(job_id="g", exit_code=0, reason="exit"))
    upd = sends(out, "o", P.SetLimits)
    assert upd, "the opportunistic job must be told at once"
    assert n.share("o") == 1.0 and not n.limits["o"].gate
    assert n.state("o") == "full"


def test_adaptive_guaranteed_leaves_opportunistic_gets_the_whole_memory():
    n = adaptive_pair(mem=16 * GiB)
    finish_baseline(n)
    n.handle(P.Goodbye(job_id="g", exit_code=0, reason="exit"))
    assert n.cap("o") == 16 * GiB - HEADROOM


def test_adaptive_rebaseline_after_node_restart_measures_solo_batches():
    n = Node("adaptive", **{**FAST, "rebaseline_s": 2.0})
    n.register("g", pid=1)
    n.register("o", priority="opportunistic", pid=2)
    n.seq_report["g"] = 5000  # the job ran 5000 batches before this node incarnation welcomed it
    finish_baseline(n)
    for _ in range(100):  # 2 s of co-located batches, slower than solo (0.08 s each): a new baseline is due
        n.report("g", duration=0.08)
        if n.state("g") == "baseline":
            break
    else:
        raise AssertionError("no new baseline after rebaseline_s")
    assert n.t - 100.0 >= 2.0
    paused = 0
    for _ in range(100):  # solo batches while the opportunistic job is paused (it confirms at a boundary)
        assert n.share("o") == 0.0
        lim = n.limits["o"]
        if n.core.jobs["o"].applied_seq < lim.seq:
            n.handle(P.LimitsApplied(job_id="o", limits_seq=lim.seq, applied_at=n.t))
        n.report("g", duration=0.05)
        paused += 1
        if n.state("g") != "baseline":
            break
    else:
        raise AssertionError("the new baseline never completed")
    assert paused >= FAST["baseline_batches"]
    # the baseline is the solo time (0.05 s), not the co-located one (0.08 s): a window 9% over 0.05 s
    # breaks the 5% SLO and the opportunistic share backs off; 2% over it grows
    share = n.share("o")
    assert share > 0.0
    for _ in range(FAST["window_batches"]):
        n.report("g", duration=0.0545)
    assert n.state("g") == "violated" and n.state("o") == "backoff"
    assert n.share("o") == pytest.approx(max(FAST["opp_min_share"], share * FAST["opp_backoff"]))
    share = n.share("o")
    for _ in range(FAST["window_batches"]):
        n.report("g", duration=0.051)
    assert n.state("g") == "ok" and n.share("o") == pytest.approx(share + FAST["opp_share_step"])


def test_adaptive_guaranteed_idle_frees_compute():
    n = adaptive_pair(guaranteed_idle_s=1.0)
    finish_baseline(n)
    assert n.share("o") < 1
    n.handle(NodeTick(), dt=1.5)  # no guaranteed batch for longer than guaranteed_idle_s
    assert n.share("o") == 1.0 and n.state("g") == "idle"
    n.report("g", dt=0.05)  # it is back: the opportunistic job is throttled again
    assert n.share("o") < 1


def test_adaptive_opportunistic_alone_runs_at_full_share():
    n = Node("adaptive", **FAST)
    n.register("o", priority="opportunistic")
    assert n.share("o") == 1.0 and not n.limits["o"].gate
    assert 0 < n.cap("o") <= 16 * GiB - HEADROOM


@pytest.mark.parametrize("policy", ["exclusive", "pack", "static", "adaptive"])
@pytest.mark.parametrize("priority", ["guaranteed", "opportunistic"])
def test_the_jobs_request_is_a_ceiling_under_every_policy(policy, priority):
    n = Node(policy, **FAST)
    n.register("j", priority=priority, mem_request=3 * GiB, sm_request=0.4)
    for _ in range(60):
        n.report("j")
        n.handle(NodeTick(), dt=0.2)
        assert n.cap("j") <= 3 * GiB and n.share("j") <= 0.4, (n.cap("j"), n.share("j"))
    assert n.share("j") == pytest.approx(0.4)  # alone on the GPU: everything it asked for


def test_a_paused_job_registering_again_gets_its_share_back():
    """After a node restart a job registers with the share in force (0 while paused); its request is
    what bounds it, not that."""
    n = Node("adaptive", **FAST)
    n.register("o", priority="opportunistic", sm_share=0.0, sm_request=1.0)
    assert n.share("o") == 1.0


# ---------------------------------------------------------------- adaptive policy: memory


def test_guaranteed_memory_growth_shrinks_opportunistic_cap_in_the_next_plan():
    n = adaptive_pair(mem=4 * GiB, g_request=3 * GiB)
    finish_baseline(n, reserved=100 * MiB)
    cap0 = n.cap("o")
    assert cap0 > 768 * MiB  # what is left once the guaranteed job uses 3 GiB (+ headroom)
    out = n.report("g", reserved=3 * GiB)  # the guaranteed job's burst
    upd = sends(out, "o", P.SetLimits)
    assert upd and upd[-1].limits.mem_cap == 4 * GiB - 3 * GiB - HEADROOM
    assert n.cap("g") == 3 * GiB and n.share("g") == 1.0  # it keeps everything it asked for

    # an opportunistic job whose live set no longer fits is paused (its excess goes to host)
    n.report("o", reserved=900 * MiB, floor=900 * MiB, host=0, busy=0.01)
    assert n.share("o") == 0.0 and n.state("o") == "paused-mem"
    assert n.cap("o") <= 768 * MiB


def burst_with_opportunistic_paused(**cfg):
    """g (3 GiB request) bursts on a 4 GiB GPU while o holds 900 MiB of live tensors: o is paused for memory."""
    n = adaptive_pair(mem=4 * GiB, g_request=3 * GiB, **cfg)
    finish_baseline(n, reserved=100 * MiB)
    n.report("g", reserved=3 * GiB)
    n.report("o", reserved=900 * MiB, floor=900 * MiB, host=0, busy=0.01)
    assert n.state("o") == "paused-mem"
    return n


@pytest.mark.parametrize("g_reserved, g_host, reclaim", [
    (3 * GiB - 900 * MiB, 900 * MiB, True),  # the GPU was full: g got host memory within its own 3 GiB
    (3 * GiB, 0, False),  # g fits: o stays paused, nothing to take back
    (3 * GiB, 512 * MiB, False),  # g over its own cap: stopping o would not give it a byte
])
def test_a_paused_opportunistic_job_is_reclaimed_only_while_the_gpu_is_too_full_for_the_guaranteed_job(
        g_reserved, g_host, reclaim):
    n = burst_with_opportunistic_paused()
    assert n.core.reclaimable(n.t) == (10.0, [])
    n.report("g", reserved=g_reserved, host=g_host)
    since = n.core.jobs["o"].reclaim_since
    assert (since is not None) == reclaim
    assert n.core.reclaimable(n.t + 4.9)[1] == []  # reclaim_after_s (5 s) has not passed
    assert n.core.reclaimable(n.t + 5.0)[1] == ([("o", "o")] if reclaim else [])
    n.report("g", reserved=g_reserved - 200 * MiB if reclaim else g_reserved, host=0)  # the GPU has room again
    assert n.core.jobs["o"].reclaim_since is None and n.core.reclaimable(n.t + 60)[1] == []


def test_a_guaranteed_burst_served_from_host_because_the_gpu_is_full_takes_the_memory_back():
    """The guaranteed job's burst found the GPU full (the ledger): it was served from host, its reserved bytes did
    not grow. What it was served counts as its use: the opportunistic job's cap shrinks, it is paused at its live
    set, and its memory is reclaimed."""
    n = adaptive_pair(mem=4 * GiB, g_request=3 * GiB)
    finish_baseline(n, reserved=100 * MiB)
    n.report("o", reserved=2 * GiB, floor=0, busy=0.01)
    n.report("g", reserved=100 * MiB, host=2 * GiB)  # its 2 GiB burst, on host
    assert n.cap("o") == 4 * GiB - (100 * MiB + 2 * GiB) - HEADROOM
    n.report("o", reserved=2 * GiB, floor=2 * GiB, busy=0.01)  # its live set does not fit that
    assert n.state("o") == "paused-mem"
    n.report("g", reserved=100 * MiB, host=2 * GiB)
    assert n.core.jobs["o"].reclaim_since is not None


def test_opportunistic_cap_grows_when_filled_up_to_what_is_free():
    n = adaptive_pair(mem=4 * GiB, g_request=2 * GiB)
    finish_baseline(n, reserved=100 * MiB)
    avail = 4 * GiB - 100 * MiB - HEADROOM
    cap = n.cap("o")
    assert cap < avail
    n.report("o", reserved=cap, busy=0.01)  # it fills its cap: doubled
    assert n.cap("o") == min(2 * cap, avail)
    n.report("o", reserved=n.cap("o"), busy=0.01)
    assert n.cap("o") == avail  # never past what the guaranteed job leaves


def test_two_opportunistic_jobs_split_by_water_fill_and_none_starves():
    n = Node("adaptive", **FAST)
    n.register("g", mem_request=4 * GiB, pid=1)
    n.register("a", priority="opportunistic", pid=2)
    n.register("b", priority="opportunistic", pid=3)
    assert n.share("a") == n.share("b") == 0.0
    finish_baseline(n, o="a")
    assert n.share("a") == pytest.approx(0.05) and n.share("b") == pytest.approx(0.05)  # 0.1 split, min 0.05
    assert n.cap("a") == n.cap("b")
    for _ in range(4):  # two good windows: budget 0.3
        n.report("g", duration=0.05)
    assert n.share("a") + n.share("b") == pytest.approx(0.3)
    # a barely uses its share, b uses all it gets: b gets the rest, a keeps the floor
    for _ in range(3):
        n.report("a", duration=0.05, busy=0.0005)
        n.report("b", duration=0.05, busy=0.05 * n.share("b"))
    assert n.share("a") == pytest.approx(0.05)
    assert n.share("b") == pytest.approx(0.25)
    total = n.core.gpus[0].spec.mem_total
    assert n.cap("a") + n.cap("b") <= total - 32 * MiB - HEADROOM


@pytest.mark.parametrize("budget, demands, floor, want", [
    (1.0, [1.0, 1.0], 0.05, [0.5, 0.5]),
    (0.5, [0.1, 1.0], 0.05, [0.1, 0.4]),
    (0.3, [0.01, 0.01, 1.0], 0.05, [0.05, 0.05, 0.2]),
    (0.6, [0.1, 0.1], 0.05, [0.3, 0.3]),  # what no one demands is shared equally
    (0.06, [1.0, 1.0], 0.05, [0.03, 0.03]),  # budget below the floors: equal split
    (0.0, [1.0], 0.05, [0.0]),
    (0.7, [], 0.05, []),
])
def test_water_fill(budget, demands, floor, want):
    got = water_fill(budget, demands, floor)
    assert got == pytest.approx(want)
    assert sum(got) <= budget + 1e-9
    if budget >= floor * len(demands):
        assert all(s >= floor - 1e-9 for s in got)


# ---------------------------------------------------------------- operator override and liveness


def test_ctl_set_pins_cap_and_share_until_the_job_leaves():
    n = adaptive_pair()
    finish_baseline(n)
    out = n.handle(P.CtlSet(job_id="o", mem_cap=1 * GiB, sm_share=0.3))
    ok = [m for m in replies(out) if isinstance(m, P.CtlOk)]
    assert len(ok) == 1 and "o:" in ok[0].message and "0.3" in ok[0].message
    assert sends(out, "o", P.SetLimits)[-1].limits.sm_share == 0.3
    assert n.cap("o") == 1 * GiB and n.state("o") == "override"
    for d in [0.05] * 6 + [0.2] * 6:  # AIMD would move the share both ways
        n.report("g", duration=d)
        n.report("o", reserved=2 * GiB, busy=0.01)  # and the cap doubling would move the cap
    assert n.share("o") == 0.3 and n.cap("o") == 1 * GiB
    snap = n.handle(P.CtlList())
    info = {j.job_id: j for j in replies(snap)[0].jobs}
    assert info["o"].sm_share == 0.3 and info["o"].mem_cap == 1 * GiB and info["o"].slo_state == "override"


def test_ctl_clear_lifts_the_overrides_and_the_policy_decides_again():
    n = adaptive_pair()
    finish_baseline(n)
    policy_cap = n.cap("o")
    n.handle(P.CtlSet(job_id="o", mem_cap=1 * GiB, sm_share=0.3))
    assert n.state("o") == "override"
    out = n.handle(P.CtlSet(job_id="o", clear=True))
    (ok,) = [m for m in replies(out) if isinstance(m, P.CtlOk)]
    assert "overrides cleared" in ok.message
    assert sends(out, "o", P.SetLimits)  # the policy's limits, at once
    assert n.share("o") != 0.3 and n.state("o") != "override"
    assert n.core.jobs["o"].override_cap is None and n.core.jobs["o"].override_share is None
    n.report("o", reserved=1 * GiB, busy=0.01)  # it fills its cap: the policy grows it again (the pin held it)
    assert n.cap("o") == min(2 * GiB, policy_cap)


@pytest.mark.parametrize("kw, why", [
    (dict(mem_cap=0), "a cap above 0"),
    (dict(clear=True, sm_share=0.5), "clear takes no"),
    (dict(), "at least one"),
])
def test_ctl_set_messages_that_make_no_sense_cannot_be_built(kw, why):
    with pytest.raises(P.ProtocolError, match=why):
        P.CtlSet(job_id="o", **{"mem_cap": None, "sm_share": None, **kw})


def test_ctl_set_says_the_cap_with_its_unit_and_refuses_one_over_the_gpu():
    n = adaptive_pair()
    finish_baseline(n)
    before = n.cap("o")
    total = n.core.gpus[n.core.jobs["o"].gpu].spec.mem_total
    (err,) = replies(n.handle(P.CtlSet(job_id="o", mem_cap=total + 1, sm_share=0.3)))
    assert isinstance(err, P.Error) and err.code == P.INVALID and "nothing was set" in err.message
    assert n.cap("o") == before and n.state("o") != "override"  # nothing was set, the share neither
    ok = [m for m in replies(n.handle(P.CtlSet(job_id="o", mem_cap=1 * GiB, sm_share=None))) if isinstance(m, P.CtlOk)]
    assert ok and "cap 1.0 GiB" in ok[0].message, ok


def test_ctl_set_share_only_keeps_the_policy_cap():
    n = adaptive_pair()
    finish_baseline(n)
    cap = n.cap("o")
    n.handle(P.CtlSet(job_id="o", mem_cap=None, sm_share=0.7))
    assert n.share("o") == 0.7 and n.cap("o") == cap


def test_tick_drops_silent_jobs_after_heartbeat_times_liveness():
    n = adaptive_pair(heartbeat_s=1.0, liveness=3)
    t0 = n.t
    n.handle(NodeTick(), dt=2.9)
    assert set(n.core.jobs) == {"g", "o"}
    n.report("g", dt=0.0)  # g is alive; o stays silent
    out = n.handle(NodeTick(), dt=0.2)  # 3.1 s after o last spoke
    assert set(n.core.jobs) == {"g"}
    assert n.core.left[-1][0] == "o" and "silent" in n.core.left[-1][1]
    assert (n.core.jobs_exited, n.core.jobs_lost) == (0, 1)
    assert n.t - t0 > 3.0
    assert not sends(out, "o")
    n.handle(NodeTick(), dt=3.1)
    assert n.core.jobs == {}


# ---------------------------------------------------------------- the baseline policies


TOTAL = 16 * GiB


@pytest.mark.parametrize("policy, jobs, want", [
    # jobs: (job_id, priority, mem_request); want: job_id -> (mem_cap, sm_share)
    ("exclusive", [("g", "guaranteed", 4 * GiB), ("o", "opportunistic", None)],
     {"g": (4 * GiB, 1.0), "o": (12 * GiB, 0.0)}),
    ("exclusive", [("o", "opportunistic", None), ("p", "opportunistic", None)],
     {"o": (TOTAL, 0.5), "p": (TOTAL, 0.5)}),
    ("exclusive", [("g", "guaranteed", None), ("o", "opportunistic", None)],
     {"g": (TOTAL, 1.0), "o": (0, 0.0)}),
    # a job's own request is a ceiling under every policy (g asked for 4 GiB)
    ("pack", [("g", "guaranteed", 4 * GiB), ("o", "opportunistic", None), ("p", "opportunistic", None)],
     {"g": (4 * GiB, 1.0), "o": (TOTAL, 1.0), "p": (TOTAL, 1.0)}),
    ("static", [("g", "guaranteed", 4 * GiB), ("o", "opportunistic", None)],
     {"g": (4 * GiB, 0.5), "o": (8 * GiB, 0.5)}),
    ("static", [("g", "guaranteed", None), ("o", "opportunistic", None), ("p", "opportunistic", None)],
     {"g": (8 * GiB, 0.5), "o": (4 * GiB, 0.25), "p": (4 * GiB, 0.25)}),
    ("static", [("o", "opportunistic", None)],
     {"o": (TOTAL, 1.0)}),
])
def test_fixed_policies(policy, jobs, want):
    n = Node(policy, mem=TOTAL, **FAST)
    for i, (job, prio, req) in enumerate(jobs):
        n.register(job, priority=prio, mem_request=req, pid=100 + i)
    for _ in range(10):  # reports do not move a fixed policy
        for job, _, _ in jobs:
            n.report(job, duration=0.05 if job == "g" else 0.3)
    for j, (cap, share) in want.items():
        assert n.cap(j) == cap, j
        assert n.share(j) == pytest.approx(share), j
    assert all(not n.limits[j].gate for j in want)


def test_exclusive_opportunistic_starts_when_guaranteed_leaves():
    n = Node("exclusive", **FAST)
    n.register("g", mem_request=4 * GiB, pid=1)
    n.register("o", priority="opportunistic", pid=2)
    assert n.share("o") == 0.0 and n.state("o") == "waiting"
    out = n.handle(P.Goodbye(job_id="g", exit_code=0, reason="exit"))
    assert sends(out, "o", P.SetLimits)
    assert n.share("o") == 1.0 and n.cap("o") == TOTAL and n.state("o") == "running"


def test_gpus_are_independent():
    n = Node("adaptive", gpus=2, **FAST)
    n.register("g0", gpu=0, pid=1)
    assert sends(n.register("g1", gpu=1, pid=2), "g1", P.Welcome)  # one guaranteed job per GPU, not per node
    n.register("o1", priority="opportunistic", gpu=1, pid=3)
    n.register("o0", priority="opportunistic", gpu=0, pid=4)
    finish_baseline(n, g="g0", o="o0")
    assert n.share("o0") > 0 and n.share("o1") == 0.0  # GPU 1's baseline is still being measured
    snap = replies(n.handle(P.CtlList()))[0]
    assert [g.index for g in snap.gpus] == [0, 1]
    assert {j.job_id: j.gpu for j in snap.jobs} == {"g0": 0, "g1": 1, "o1": 1, "o0": 0}


def test_reregistering_with_another_token_is_rejected():
    """A job id is bound to the launcher's secret token: another process cannot take it over."""
    n = Node("adaptive")

    def reg(token, pid=1000):
        return n.handle(P.Register(job_id="g", pid=pid, gpu=0, priority="guaranteed", mem_request=None,
                                   sm_share=1.0, mem_cap=16 * GiB, epoch=1, token=token))

    assert sends(reg("secret-a"), "g", P.Welcome)
    out = reg("secret-b")
    errs = [m for m in replies(out) if isinstance(m, P.Error)]
    assert errs and errs[0].code == "rejected" and "token" in errs[0].message
    assert not sends(out, "g", P.Welcome)
    assert sends(reg("secret-a"), "g", P.Welcome)  # the real job reconnecting is welcome again


def test_an_opportunistic_job_starts_at_the_schedulers_recommendation():
    """Its placement carries the recommended memory and share (StartPlacement.start_mem/start_share): the adaptive
    policy starts its cap there and its AIMD budget at that share, instead of its fixed fractions."""
    from colocate.node import events as E
    from colocate.node.table import PlacementTable, Worker

    n = Node("adaptive", **FAST)
    n.core.take_placements("n1", PlacementTable(), cluster="c1")
    req = P.JobRequest(command=("python", "x.py"), cwd="/", env=())
    msg = P.StartPlacement(placement_id="o.1", job_id="o", priority="opportunistic", request=req,
                           workers=(P.WorkerLaunch(0, 0, (0,)),), world_size=1, group_rank=0, master_addr="h",
                           master_port=0, cluster_id="c1", start_mem=700 * MiB, start_share=0.3)
    n.core.handle(E.Start(msg), n.t)
    n.core.handle(E.Launched(msg, (Worker(0, 0, [0], 12, 1.0, "/l", "/e"),)), n.t)
    n.register("g", mem_request=4 * GiB, pid=11)
    n.register("o", priority="opportunistic", pid=12)
    assert n.cap("o") == 700 * MiB  # not opp_start_mem_fraction of what is free
    finish_baseline(n)
    assert n.share("o") == pytest.approx(0.3)  # not opp_start_share (0.1)
    plain = adaptive_pair()
    finish_baseline(plain)
    assert plain.share("o") == pytest.approx(0.1) and plain.cap("o") != 700 * MiB


def test_a_gpu_speed_a_welcome_cannot_carry_is_refused_when_the_core_is_made():
    """QA: ``--sim-gpus 1:T4@0.0005`` started a node that died at the first registration."""
    with pytest.raises(ValueError, match=r"GPU 1 \(T4\) speed: expected a finite number in \[0.001, 1.0\], got 0.0005"):
        NodeCore([GpuSpec(index=0, kind="sim", mem_total=GiB),
                  GpuSpec(index=1, kind="sim", mem_total=GiB, name="T4", speed=0.0005)], NodeConfig(), node_epoch=1)
    NodeCore([GpuSpec(index=0, kind="sim", mem_total=GiB, name="T4", speed=P.SIM_SPEED.lo)], NodeConfig(), node_epoch=1)


def test_tiny_durations_leave_every_figure_the_core_derives_finite():
    """QA: reports of 5e-324 s made the throughput of ``colocate ctl list`` inf (and the node died)."""
    n = Node("adaptive", **FAST)
    n.register("g", pid=11)
    n.register("o", priority="opportunistic", pid=12)
    for _ in range(20):
        n.report("g", duration=5e-324, busy=1.0, dt=0.01)
        n.report("o", duration=5e-324, busy=P.MAX_REPORT_S, dt=0.01)
    (jobs,) = replies(n.handle(P.CtlList()))
    assert [(j.job_id, j.throughput) for j in jobs.jobs] == [("g", 0.0), ("o", 0.0)]  # nothing measured
    assert all(0.0 <= n.core.jobs[j].busy_fraction() <= 1.0 for j in ("g", "o"))
    for p in n.core.progress(n.t, {}):
        assert p.busy_fraction == 0.0 and p.step_mean_s < 1e-300  # nothing measured
    n.handle(P.Goodbye(job_id="o", exit_code=0, reason="done"))
    assert n.core.final["o"].step_mean_s < 1e-300


def test_ctl_list_counts_iterations_as_the_job_does_across_a_node_restart():
    """A node that restarts meets a job in mid-run: ``ctl list`` shows the job's own count (its last report's
    batch index + 1), not the reports this node process happened to receive."""
    n = Node(policy="exclusive")
    n.register("g")
    n.seq_report["g"] = 41  # the job reported batches 0..40 to the node's previous run
    for _ in range(3):
        n.report("g")
    (snap,) = replies(n.handle(P.CtlList()))
    assert [(j.job_id, j.iterations) for j in snap.jobs] == [("g", 44)]


def test_ctl_set_takes_a_scheduler_job_id_for_its_one_worker_here():
    """``colocate status`` shows job 3; its worker registered as 3/0. The bare id names it when it is the only one;
    with two workers here, the error names them."""
    n = Node(policy="exclusive", gpus=2)
    n.register("3/0", gpu=0)
    (ok,) = replies(n.handle(P.CtlSet(job_id="3", mem_cap=None, sm_share=0.5)))
    assert isinstance(ok, P.CtlOk) and ok.message.startswith("3/0: ") and n.share("3/0") == 0.5
    n.register("3/1", gpu=1, pid=1001)
    (err,) = replies(n.handle(P.CtlSet(job_id="3", mem_cap=None, sm_share=0.5)))
    assert err.code == P.UNKNOWN_JOB and "job 3 has 2 workers on this node (3/0, 3/1): name one" in err.message
    (err,) = replies(n.handle(P.CtlSet(job_id="4", mem_cap=None, sm_share=0.5)))
    assert err.code == P.UNKNOWN_JOB and "job 4 is not registered" in err.message


def test_a_paused_jobs_throughput_falls_with_the_time_since_its_last_report():
    """QA: a job paused by ``ctl set --sm-share 0`` still showed its last pace (34 it/s) in ``ctl list``, ``top`` and
    the metrics 13 s later; the listing counts the time since the last report."""
    n = Node("adaptive", **FAST)
    n.register("g", pid=11)
    for _ in range(16):
        n.report("g", duration=0.05, busy=0.02)
    (jobs,) = replies(n.handle(P.CtlList()))
    assert jobs.jobs[0].throughput == pytest.approx(20.0)
    n.t += 15.2  # no report since: paused
    (jobs,) = replies(n.handle(P.CtlList()))
    assert jobs.jobs[0].throughput == pytest.approx(16 / 16.0)
    assert n.core.jobs["g"].busy_fraction() == pytest.approx(0.4)  # the policies read the reports alone


def test_the_host_column_shows_a_buffer_spilled_and_freed_within_the_batch():
    """QA: a job whose 64 MiB temporary buffer went to host memory every batch showed HOST 0 B (it holds nothing
    there at the boundary); the listing shows what the batch touched where more."""
    n = Node("adaptive", **FAST)
    n.register("g", pid=11)
    n.handle(P.BatchReport(job_id="g", seq=0, t_end=n.t, duration_s=0.05, busy_s=0.02, device_start_s=0.0,
                           mem_allocated_peak=MiB, mem_reserved=MiB, mem_floor=0, host_bytes=0,
                           host_bytes_touched=64 * MiB, limits_seq=0), 0.05)
    (jobs,) = replies(n.handle(P.CtlList()))
    assert jobs.jobs[0].host_bytes == 64 * MiB


def test_ctl_list_names_each_gpus_model():
    core = NodeCore([GpuSpec(index=0, kind="sim", mem_total=GiB, name="K80", speed=0.25),
                     GpuSpec(index=1, kind="sim", mem_total=GiB)], NodeConfig(), node_epoch=7)
    (listing,) = replies(core.handle(P.CtlList(), 1.0))
    assert [g.model for g in listing.gpus] == ["K80", GpuSpec(index=1, kind="sim", mem_total=GiB).name]
