"""The adaptive policy's pause-or-full control (an opportunistic job that yields by device priority), driven
through ``NodeCore`` with a fake clock, table-driven; no sockets, no processes.

Such a job gets share 1 while the guaranteed job meets its SLO and 0 on a break; the pause is a fresh solo
baseline, longer when breaks recur. Jobs without priority (or served from host memory) keep AIMD.
"""
from __future__ import annotations

import statistics

import pytest

from colocate import protocol as P
from tests.colocate.node.test_core import FAST, GiB, Node

# windows of 4 batches so a window's median ignores one outlier; pauses of 3 batches growing to 12
CFG = {**FAST, "window_batches": 4, "pause_batches": 3, "pause_growth": 2.0, "pause_recur_windows": 3,
       "pause_max_batches": 12}
BASE = 0.05  # the guaranteed job's solo batch time in these tests; SLO 5% -> 0.0525


def pair(o_priority=True, **cfg) -> Node:
    n = Node("adaptive", **{**CFG, **cfg})
    n.register("g", mem_request=4 * GiB, pid=11)
    n.handle(P.Register(job_id="o", pid=12, gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0,
                        mem_cap=16 * GiB, epoch=1, priority_yield=o_priority))
    return n


def confirm(n: Node) -> None:
    """Every job paused but not yet confirmed reaches a boundary (or waits before device work) and says so."""
    for job in list(n.core.jobs.values()):
        lim = n.limits.get(job.job_id)
        if lim is not None and lim.sm_share == 0.0 and job.applied_seq < lim.seq:
            n.handle(P.LimitsApplied(job_id=job.job_id, limits_seq=lim.seq, applied_at=n.t))


def g_batches(n: Node, durations) -> list[tuple[float, str]]:
    """Feed guaranteed batches (confirming pauses as a real job would); the opportunistic job's
    (share, label) after each."""
    out = []
    for d in durations:
        n.report("g", duration=d)
        confirm(n)
        out.append((n.share("o"), n.state("o")))
    return out


def running(n: Node) -> Node:
    """Past the first baseline (profiled at BASE), the opportunistic job running."""
    g_batches(n, [BASE] * 5)
    assert (n.share("o"), n.state("o")) == (1.0, "running")
    return n


def test_full_share_after_the_baseline_and_the_guaranteed_job_never_throttled():
    n = pair()
    assert (n.share("o"), n.state("o")) == (0.0, "baseline")
    confirm(n)  # a job that has not started device work confirms at once (it waits before it)
    seen = g_batches(n, [BASE] * 4)  # baseline_batches=3, profiled from the batch after the confirm's (+1)
    assert seen[-2][0] == 0.0 and seen[-1] == (1.0, "running")
    assert n.share("g") == 1.0 and n.limits["o"].gate


@pytest.mark.parametrize("window, want", [
    ([0.051] * 4, (1.0, "running")),               # within the SLO: full share, no fractional step
    ([0.0524] * 4, (1.0, "running")),              # just inside the margin: still full (no hold region)
    ([0.051, 0.051, 0.051, 0.09], (1.0, "running")),  # one slow batch: the window's median holds
    ([0.054] * 4, (0.0, "paused")),                # over the SLO once: pause at once (no patience)
    ([0.047] * 4, (1.0, "running")),               # faster by less than twice the margin: noise, no re-profile
    ([0.044] * 4, (1.0, "running")),               # faster by more: the job's own work shrank (below)
])
def test_one_window_decides(window, want):
    n = running(pair())
    assert g_batches(n, window)[-1] == want


def test_a_window_much_faster_than_the_baseline_becomes_the_baseline_without_a_pause():
    """The guaranteed job's own work shrank: beside the opportunistic job it beats its old solo time, so
    alone it is at least that fast. The window is the new baseline at once (no pause), and the SLO is held
    against it: a later window 5% over it is a break."""
    n = running(pair())
    old = n.core.gpus[0].policy.baseline
    assert g_batches(n, [0.044] * 4)[-1] == (1.0, "running")
    assert n.core.gpus[0].policy.baseline == pytest.approx(0.044) and old > 0.044 / 0.9
    assert g_batches(n, [0.047] * 4)[-1] == (0.0, "paused")  # within the old SLO, over the new one


def test_the_pause_is_a_fresh_baseline_that_follows_the_guaranteed_jobs_own_work():
    n = running(pair())
    g_batches(n, [0.06] * 4)  # the guaranteed job's work got longer: a break
    assert n.state("o") == "paused"
    seen = g_batches(n, [0.06] * 4)  # pause_batches=3 profiled alone (+1 in flight)
    assert seen[-1] == (1.0, "running")
    assert n.core.gpus[0].policy.baseline == pytest.approx(0.06)
    assert g_batches(n, [0.062] * 8)[-1] == (1.0, "running")  # within 5% of the new baseline


def pause_lengths(n: Node, gaps: list[int]) -> list[int]:
    """For each gap (guaranteed batches run beside the opportunistic job before a break), break the SLO
    and count the guaranteed batches the pause lasts."""
    lengths = []
    for gap in gaps:
        g_batches(n, [BASE] * gap)
        assert n.state("o") == "running"
        for _ in range(4):  # a break: caught within the window
            n.report("g", duration=0.07)
            if n.state("o") == "paused":
                break
        assert n.state("o") == "paused"
        confirm(n)
        k = 0
        while n.share("o") == 0.0:
            n.report("g", duration=BASE)
            confirm(n)
            k += 1
            assert k < 100
        lengths.append(k)
    return lengths


@pytest.mark.parametrize("gaps, want", [
    ([0, 0, 0, 0], [4, 7, 13, 13]),  # breaks at once after each resume: 3, 6, 12, 12 (the cap) batches, +1
    ([0, 12, 0], [4, 4, 7]),         # 3 good windows after a resume (4+12 >= 3x4): back to 3
])
def test_the_pause_grows_while_breaks_recur(gaps, want):
    n = running(pair())
    assert pause_lengths(n, gaps) == want


def test_a_pause_that_finds_drift_does_not_lengthen_the_next():
    """The guaranteed job's own work grows step by step: each step breaks the SLO, and each pause finds the
    job as slow alone (drift, not interference), so the pauses stay short."""
    n = running(pair())
    lengths = []
    for d in (0.06, 0.07, 0.08):
        for _ in range(4):
            n.report("g", duration=d)
            if n.state("o") == "paused":
                break
        assert n.state("o") == "paused"
        confirm(n)
        k = 0
        while n.share("o") == 0.0 and k < 100:
            n.report("g", duration=d)
            confirm(n)
            k += 1
        lengths.append(k)
    assert lengths == [4, 4, 4]


@pytest.mark.parametrize("o_priority, host, want_share, want_state", [
    (False, 0, 0.1, "growing"),  # yields without priority: AIMD from opp_start_share (0.1 here)
    (True, 1 << 20, 0.1, "growing"),  # served from host memory over its cap: AIMD (bus traffic has no priority)
    (True, 0, 1.0, "running"),
])
def test_which_control_applies(o_priority, host, want_share, want_state):
    n = pair(o_priority=o_priority)
    confirm(n)
    g_batches(n, [BASE] * 4)
    if host:
        n.report("o", host=host, duration=0.1)
        g_batches(n, [BASE])
    assert (n.share("o"), n.state("o")) == (pytest.approx(want_share), want_state)


def burst_run(hit: float, window: int = 16) -> tuple[int | None, list[float], list[bool]]:
    """The guaranteed job's own batch time varies: 40 ms of work, a burst of 80 ms batches, 40 ms again.
    Beside the running opportunistic job its batches take 3% longer (inside the 5% SLO), during the burst
    ``hit`` times longer. Returns the batch at which the burst's pause came, each batch's slowdown against
    the job's own solo time, and whether the opportunistic job had share 1 during it."""
    n = pair(window_batches=window, pause_batches=16, pause_max_batches=64, pause_recur_windows=4,
             baseline_batches=16)
    confirm(n)
    work = [0.04] * 60 + [0.08] * 400 + [0.04] * 100
    slowdowns, beside, paused_at = [], [], None
    for i, own in enumerate(work):
        full = n.share("o") == 1.0
        slow = (hit if 60 <= i < 460 else 1.03) if full else 1.0
        n.report("g", duration=own * slow)
        confirm(n)
        slowdowns.append(slow)
        beside.append(full)
        if i >= 60 and paused_at is None and n.share("o") == 0.0:
            paused_at = i
    assert n.share("o") == 1.0 and n.state("o") == "running"  # running again after the burst
    return paused_at, slowdowns, beside


def test_a_burst_of_longer_guaranteed_batches_pauses_within_one_window_and_the_slo_holds():
    """The burst is the guaranteed job's own work (beside the opportunistic job it is slowed no more than
    before): the pause comes within one decision window of the burst's start, its fresh baseline follows
    the work, and the opportunistic job runs beside the burst again within the SLO."""
    paused_at, slowdowns, beside = burst_run(hit=1.03)
    assert paused_at is not None and paused_at - 60 < 16, paused_at
    burst = slice(60, 460)
    # one pause, whose baseline followed the work: the burst ran beside the opportunistic job, within the SLO
    assert sum(beside[burst]) >= 0.8 * 400
    assert sum(beside[460:]) >= 0.5 * 100  # after the burst: faster batches become the baseline, full again


def test_a_burst_the_opportunistic_job_hurts_gets_longer_and_longer_pauses():
    """Beside the opportunistic job the burst's batches are 20% slower (e.g. memory-bound): every resume is
    a break within one window, and the pause doubles up to its cap, so over the burst the guaranteed job
    keeps its SLO on average, while between breaks the opportunistic job still gets work done."""
    paused_at, slowdowns, beside = burst_run(hit=1.2)
    assert paused_at is not None and paused_at - 60 < 16, paused_at
    late = slice(160, 460)  # once the pause has grown
    assert statistics.mean(slowdowns[late]) <= 1.05, statistics.mean(slowdowns[late])
    assert 0 < sum(beside[late]) < 0.3 * 300
