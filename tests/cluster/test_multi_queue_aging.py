"""multi_queue aging: a large gang blocked behind a stream of small jobs starts within
``starvation_s`` plus the time the running small jobs take to finish; without aging it starves."""

from __future__ import annotations

import math

import pytest

from tests.cluster.helpers import config, finish, job, make_core, start_all, starts, submit

SMALL_S = 10.0  # every small job runs this long


def stream(starvation_s: float, until: float = 80.0):
    """3 nodes x 2 GPUs full of small jobs; a 4-worker gang at t=1; a small job every 2 s.
    Returns (the gang's start time or None, reasons the held small jobs were given)."""
    core = make_core(config(["multi_queue", "gang", "binpack"], multi_queue={"starvation_s": starvation_s}),
                     [("n0", 2), ("n1", 2), ("n2", 2)])
    ends: dict[str, float] = {}

    def go(decisions, now):
        for jid in starts(decisions):
            ends[jid] = now + SMALL_S
        more = start_all(core, decisions, now)
        if more:
            go(more, now)

    for i in range(6):
        go(submit(core, job(f"s{i}"), now=0.0), 0.0)
    go(submit(core, job("gang", workers=4, t=1.0), now=1.0), 1.0)
    reasons, k, t = set(), 6, 1.0
    while t < until:
        t += 1.0
        if t % 2 == 0:
            go(submit(core, job(f"s{k}", t=t), now=t), t)
            k += 1
        for jid, end in list(ends.items()):
            if end <= t and jid != "gang":
                del ends[jid]
                go(finish(core, jid, t), t)
        reasons |= {why for _, why in core.blocked().values() if "held for job" in why}
        if core.job("gang").state == "running":
            return t, reasons
    return None, reasons


@pytest.mark.parametrize("starvation_s, latest, held", [
    (math.inf, None, False),  # seed 000's plain multi-queue: the gang never starts
    # blocked at t=1, hold from t=21, the small jobs running then drain within 10 s; small jobs that
    # could have taken a freed GPU meanwhile were held (their reason says so)
    (20.0, 1.0 + 20.0 + SMALL_S + 1.0, True),
    # hold at once: the first six small jobs end together at t=10 and the gang takes their GPUs, so
    # no cycle had a freed GPU to hold a small job from
    (0.0, 1.0 + SMALL_S + 1.0, False),
])
def test_a_blocked_gang_starts_after_aging_and_never_starves(starvation_s, latest, held):
    started, reasons = stream(starvation_s)
    if latest is None:
        assert started is None
    else:
        assert started is not None and started <= latest, started
    assert any("held for job gang" in r for r in reasons) == held


def test_aging_never_holds_opportunistic_jobs_or_the_aged_queue_itself():
    core = make_core(config(["multi_queue", "gang", "binpack", "opportunistic"], multi_queue={"starvation_s": 0.0}),
                     [("n0", 4)])
    start_all(core, submit(core, *[job(f"s{i}") for i in range(4)]), 0.0)
    assert not starts(submit(core, job("big", workers=3, t=1.0), now=1.0))  # blocked in "large"
    finish(core, "s0", 1.5)  # one GPU frees: the small queue may not take it
    out = submit(core, job("s4", t=2.0), job("o", t=2.0, klass="opportunistic"), now=2.0)
    assert set(starts(out)) == {"o"}  # s4 waits for big; the opportunistic job runs beside
    assert any("held for job big" in why for _, why in core.blocked().values())
