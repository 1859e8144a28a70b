"""cluster/predict/recommend.py: memory cap, compute share, GPU count and GPU type from a job's history."""

from __future__ import annotations

import pytest

from cluster.predict.history import Exit, HistoryRecord
from cluster.predict.recommend import (
    MIB,
    Offer,
    Params,
    gpu_count,
    gpu_type,
    memory,
    nearest_rank,
    recommend,
    share,
)

P = Params()


def rec(i=0, peak=None, busy=None, numbers=None, exit=Exit.SUCCEEDED, cap=None, sm=None, gpus=1, wall=100.0,
        gpu_type="V100", step=None):
    return HistoryRecord(f"j{i}", "e", "f", "ann", gpus, gpu_type, wall, exit, 0.0, wall, peak_mem=peak, busy=busy,
                         numbers=numbers, mem_cap=cap, sm_share=sm, step_p50_s=step)


def test_nearest_rank_is_the_largest_of_few_runs():
    assert nearest_rank([3, 1, 2], 0.95) == 3 and nearest_rank(list(range(1, 101)), 0.95) == 95


@pytest.mark.parametrize("exact, want", [
    ([rec(peak=100 * MIB)], 120 * MIB),
    ([rec(peak=100 * MIB), rec(peak=90 * MIB)], 120 * MIB),  # the largest of few
    ([rec(peak=10 * MIB + 1)], 13 * MIB),  # rounded up to a MiB
    ([rec(peak=50 * MIB, exit=Exit.OOM, cap=200 * MIB)], 240 * MIB),  # ran out under 200 MiB: needs more
])
def test_memory_at_the_exact_level(exact, want):
    fig, _ = memory(exact, [], None, P)
    assert (fig.value, fig.level, fig.history) == (want, "exact", len(exact))


def test_memory_is_at_most_the_whole_gpu():
    assert memory([rec(peak=100 * MIB)], [], None, P, whole=110 * MIB)[0].value == 110 * MIB


def sweep(batch_width_peak):
    """A family's runs: numbers (batch, width), peak = what a run of them reported."""
    return [rec(i, peak=peak, numbers=(b, w)) for i, (b, w, peak) in enumerate(batch_width_peak)]


def model_peak(b, w):
    """A fixed part, weights growing with width squared, activations with batch x width."""
    return int((2 * w * w + 40 * b * w) * 1000) + 8 * MIB


GRID = [(b, w) for b in (16, 32, 64) for w in (64, 128, 256)]


@pytest.mark.parametrize("new", GRID)
def test_a_familys_bound_covers_every_job_within_its_range_and_gives_far_less_than_the_gpu(new):
    """Whatever the family has seen (here every other point of the grid), the bound covers the job's true peak
    (weights with width squared, activations with batch x width, a fixed part) and stays within 4x of it."""
    runs = sweep([(b, w, model_peak(b, w)) for b, w in GRID if (b, w) != new])
    fig, why = memory([], runs, new, P)
    true = model_peak(*new)
    if fig is None:  # only the largest point of the grid is above every other run in a number
        assert new == (64, 256) and "above every earlier run" in why
        return
    assert fig.level == "family" and fig.history == len(runs)
    assert true <= fig.value <= 4 * true * 1.2


def test_a_number_above_every_earlier_run_is_not_extrapolated():
    runs = sweep([(16, 64, 10 * MIB), (32, 64, 20 * MIB)])
    fig, why = memory([], runs, (64, 64), P)
    assert fig is None and "above every earlier run" in why


def test_each_run_bounds_the_need_and_the_tightest_bound_wins():
    runs = sweep([(64, 128, 80 * MIB), (16, 128, 10 * MIB)])
    fig, _ = memory([], runs, (32, 128), P)
    assert fig.value == 48 * MIB  # min(80 (never less for a smaller number), 10 x 2^2 = 40) x 1.2


def test_a_run_out_of_memory_bounds_nothing_in_its_family():
    runs = sweep([(64, 128, 80 * MIB)]) + [rec(9, peak=5 * MIB, numbers=(16, 128), exit=Exit.OOM, cap=6 * MIB)]
    assert memory([], runs, (16, 128), P)[0].value == 96 * MIB


@pytest.mark.parametrize("records, want", [
    ([rec(busy=0.40)], 0.40 / 1.1),
    ([rec(busy=0.2), rec(busy=0.9)], 0.9 / 1.1),
    ([rec(busy=0.01)], 0.05),  # at least one step
    ([rec(busy=0.5, sm=0.5), rec(busy=0.3)], 0.3 / 1.1),  # a run held at its share says nothing of its need
])
def test_share_stays_under_the_slowdown_bound(records, want):
    fig, _ = share(records, [], P)
    assert fig.value >= want - 1e-9 and fig.value - want < 0.05 + 1e-9
    assert max(1.0, max(r.busy for r in records if r.sm_share is None) / fig.value) <= 1.1 + 1e-9


def test_no_share_without_an_unthrottled_busy_fraction():
    fig, why = share([rec(busy=0.5, sm=0.5)], [], P)
    assert fig is None and "busy" in why


def test_gpu_count_needs_two_sizes_and_follows_the_scaling_fit():
    one = [rec(i, gpus=1, wall=100.0) for i in range(3)]
    fig, why = gpu_count(one, P)
    assert fig is None and why == "runs at one GPU count only (1), a scaling fit needs two or more"
    assert gpu_count([], P) == (None, "no ended run of these arguments, a scaling fit needs two or more")
    amdahl = one + [rec(10, gpus=2, wall=60.0), rec(11, gpus=4, wall=40.0)]  # T = 20 + 80/g
    fig, _ = gpu_count(amdahl, P)
    # efficiency 100/(g (20 + 80/g)): g=2 0.83, g=4 0.625: 2
    assert (fig.value, fig.level, fig.history) == (2.0, "exact", 5)
    perfect = [rec(0, gpus=1, wall=100.0), rec(1, gpus=2, wall=50.0)]
    assert gpu_count(perfect, P)[0].value == 4.0  # up to twice the largest measured
    worse = [rec(0, gpus=1, wall=100.0), rec(1, gpus=2, wall=120.0)]
    assert gpu_count(worse, P)[0].value == 1.0


def test_gpu_type_is_the_fastest_free_by_predicted_time():
    runs = [rec(0, gpu_type="V100", step=0.10), rec(1, gpu_type="V100", step=0.12)]
    offers = [Offer("V100", 0, 1.0), Offer("P100", 4, 0.81), Offer("K80", 8, 0.25)]
    fig, _ = gpu_type(runs, [], offers, 1)  # V100 busy: P100 by speed from the V100 runs
    assert fig.label == "P100" and fig.value == pytest.approx(0.11 / 0.81) and fig.level == "exact"
    fig, _ = gpu_type([], [], offers, 1)  # nothing measured: the fastest declared
    assert (fig.label, fig.level) == ("P100", "speed")
    fig, why = gpu_type([], [], [Offer("A", 4)], 1)
    assert fig is None and "not declared" in why
    assert gpu_type(runs, [], offers, 16)[0] is None


def test_gpu_type_times_per_iteration_from_the_runs_that_reported_one():
    """A run without a time per iteration (no mini-batch seen) does not turn the level to run times: the others'
    times per iteration are compared (it was the median of whole runs' wall times, shown as ms per iteration)."""
    offers = [Offer("V100", 4, 1.0), Offer("K80", 4, 0.25)]
    family = [rec(0, gpu_type="V100", wall=7.6664, step=0.012), rec(1, gpu_type="V100", wall=8.0)]
    fig, _ = gpu_type([], family, offers, 1)
    assert (fig.label, fig.value, fig.level, fig.history) == ("V100", pytest.approx(0.012), "family", 1)
    mixed = [rec(0, gpu_type="K80", wall=50.0), rec(1, gpu_type="V100", wall=400.0, step=0.1)]
    fig, _ = gpu_type(mixed, [], offers, 1)  # K80 measured by run time only: carried from V100's step time
    assert (fig.label, fig.value) == ("V100", pytest.approx(0.1))


def test_gpu_type_chosen_by_run_time_gives_no_time_per_iteration():
    """No run of the level reported a time per iteration: the type is the fastest by run time, and its value is 0
    (no time per iteration), never a run's wall time."""
    offers = [Offer("V100", 4, 1.0), Offer("K80", 4, 0.25)]
    runs = [rec(0, gpu_type="K80", wall=300.0), rec(1, gpu_type="V100", wall=100.0), rec(2, gpu_type="V100")]
    fig, _ = gpu_type(runs, [], offers, 1)
    assert (fig.label, fig.value, fig.level, fig.history) == ("V100", 0.0, "exact", 3)


def test_recommend_says_why_each_missing_figure_is_missing():
    advice = recommend([], [], None)
    assert set(advice.why_not) == {"gpu_mem", "sm_share", "gpus", "gpu_type"}
    advice = recommend([rec(peak=100 * MIB, busy=0.5)], [], None, [Offer("V100", 1, 1.0)])
    assert advice.gpu_mem.value == 120 * MIB and advice.sm_share is not None and advice.gpu_type.label == "V100"
    assert set(advice.why_not) == {"gpus"}
