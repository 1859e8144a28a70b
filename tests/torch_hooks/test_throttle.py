"""torch_hooks.throttle: the pure per-mini-batch throttle arithmetic (table-driven)."""
import math

import pytest

from torch_hooks.throttle import MAX_IDLE_S, host_penalty_s, idle_after


@pytest.mark.parametrize(
    "busy, elapsed, share, idle",
    [
        # share 1 never idles
        (0.1, 0.1, 1.0, 0.0),
        (5.0, 0.0, 1.0, 0.0),
        # AntMan's perfControl: busy x (1/share - 1) when the batch was all device work
        (0.1, 0.1, 0.5, 0.1),
        (0.1, 0.1, 0.25, 0.3),
        (0.3, 0.3, 0.75, 0.1),
        (0.01, 0.01, 0.1, 0.09),
        # idle the job already had (host phases) is credited
        (0.1, 0.15, 0.5, 0.05),
        (0.1, 0.2, 0.5, 0.0),
        (0.1, 1.0, 0.5, 0.0),
        (0.1, 0.4, 0.25, 0.0),
        # elapsed shorter than busy (busy counts several threads / the host penalty charge)
        (0.1, 0.0, 0.5, 0.2),
        (0.1, 0.05, 0.5, 0.15),
        # a negative elapsed (clock oddity) is treated as zero
        (0.1, -1.0, 0.5, 0.2),
        # nothing to pace
        (0.0, 0.0, 0.5, 0.0),
        (0.0, 1.0, 0.1, 0.0),
        (-0.5, 0.0, 0.5, 0.0),
    ],
)
def test_idle_after_table(busy, elapsed, share, idle):
    assert idle_after(busy, elapsed, share) == pytest.approx(idle, abs=1e-12)


def test_idle_after_is_bounded():
    # a batch that would need more idle than one boundary may take gets exactly the bound
    assert idle_after(100.0, 0.0, 0.5) == MAX_IDLE_S
    assert idle_after(1.0, 0.0, 1e-9) == MAX_IDLE_S
    assert idle_after(MAX_IDLE_S + 0.5, MAX_IDLE_S + 0.5, 0.5) == MAX_IDLE_S
    # just under the bound nothing is cut: busy x (1/share - 1), a long idle a boundary really takes
    assert idle_after(MAX_IDLE_S - 0.5, MAX_IDLE_S - 0.5, 0.5) == pytest.approx(MAX_IDLE_S - 0.5, abs=1e-9)
    assert idle_after(10.0, 10.0, 0.5) == pytest.approx(10.0, abs=1e-9)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.0000001, 2.0, float("nan"), float("inf"), -float("inf")])
def test_idle_after_rejects_shares_outside_0_1(share):
    with pytest.raises(ValueError):
        idle_after(0.1, 0.1, share)


@pytest.mark.parametrize("share", [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("busy", [0.001, 0.01, 0.2, 1.0])
@pytest.mark.parametrize("host_fraction", [0.0, 0.3, 0.9, 3.0])
def test_resulting_busy_fraction_tracks_share(share, busy, host_fraction):
    """busy / (elapsed + idle) never exceeds the share; equals it when the job would use more."""
    elapsed = busy * (1 + host_fraction)
    idle = idle_after(busy, elapsed, share)
    assert idle >= 0.0
    frac = busy / (elapsed + idle)
    assert frac <= share + 1e-9
    if busy / elapsed > share and idle < MAX_IDLE_S:
        assert frac == pytest.approx(share, rel=1e-9)
    if busy / elapsed <= share:
        assert idle == 0.0


def test_idle_after_monotonic_in_share():
    values = [idle_after(0.2, 0.2, s) for s in (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)]
    assert values == sorted(values, reverse=True)
    assert values[-1] == 0.0


@pytest.mark.parametrize(
    "touched, gbps, seconds",
    [
        (0, 2.0, 0.0),
        (-100, 2.0, 0.0),
        (2_000_000_000, 2.0, 1.0),
        (1_000_000_000, 4.0, 0.25),
        (3 << 20, 2.0, (3 << 20) / 2e9),
        (1, 1.0, 1e-9),
    ],
)
def test_host_penalty_table(touched, gbps, seconds):
    assert host_penalty_s(touched, gbps) == pytest.approx(seconds, rel=1e-12, abs=0.0)


def test_host_penalty_scales_linearly():
    one = host_penalty_s(10 << 20, 2.0)
    assert host_penalty_s(20 << 20, 2.0) == pytest.approx(2 * one)
    assert host_penalty_s(10 << 20, 4.0) == pytest.approx(one / 2)
    assert math.isfinite(one) and one > 0
