"""The node's per-worker progress summary (``colocate.node.progress``, ``NodeCore.progress``): the pure core fed
protocol messages at fake times, no sockets."""

from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore, Reply
from colocate.node.progress import quantile

MiB = 1 << 20


def core() -> NodeCore:
    return NodeCore([GpuSpec(index=0, kind="sim", mem_total=1 << 34)], NodeConfig(policy="static"), node_epoch=1)


def register(c: NodeCore, job_id="job-1", rank=None, world=1, now=0.0):
    c.handle(P.Register(job_id=job_id if rank is None else f"{job_id}/{rank}", pid=1000 + (rank or 0), gpu=0,
                        priority="opportunistic", mem_request=None, sm_share=1.0, mem_cap=1 << 30, epoch=1, rank=rank,
                        world_size=world), now)


def report(c: NodeCore, seq, duration, busy, reserved=0, reserved_peak=0, allocated=0, job_id="job-1", now=0.0):
    return c.handle(P.BatchReport(job_id=job_id, seq=seq, t_end=seq * 1.0, duration_s=duration, busy_s=busy,
                                  device_start_s=0.0, mem_allocated_peak=allocated, mem_reserved=reserved, mem_floor=0,
                                  host_bytes=0, host_bytes_touched=0, limits_seq=1, mem_reserved_peak=reserved_peak),
                    now)


def features(total=None) -> P.Features:
    model = P.ModelFeatures(params=10, trainable_params=10, layers=(), layer_counts={"Linear": 1}, forward_flops=20.0,
                            flops_per_iteration=60.0, batch_size=4, optimizers=("SGD",), param_dtype="float32",
                            autocast_dtype="")
    hw = P.HardwareFeatures(kind="sim", name="colocate-sim", mem_total=1 << 30, sm_count=1, sm_clock_mhz=0,
                            mem_clock_mhz=0, mem_bandwidth=0.0, peak_flops=0.0, gpus=1)
    return P.Features(model=model, hardware=hw, loader_batches=None, iterations_hint=total, epochs_hint=None,
                      total_iterations=total, read_s=0.001)


def test_quantiles_interpolate():
    assert quantile([], 0.5) == 0.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert quantile([float(i) for i in range(1, 11)], 0.9) == pytest.approx(9.1)


def test_summary_of_the_reports_a_node_received():
    c = core()
    register(c)
    durations = [0.10, 0.30, 0.20, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90, 1.00]
    for i, d in enumerate(durations):
        report(c, i, d, busy=d / 2, reserved=(i + 1) * MiB, reserved_peak=(i + 2) * MiB, allocated=i * MiB, now=i)
    report(c, 10, 0.25, busy=0.25, reserved=1 * MiB, reserved_peak=3 * MiB, allocated=MiB, now=10.0)
    told: dict[str, int] = {}
    (p,) = c.progress(12.5, told)
    every = sorted(durations[1:] + [0.25])  # the first mini-batch (seq 0: start-up) is left out of the window
    assert (p.job_id, p.rank, p.iterations, p.window) == ("job-1", 0, 11, 10)
    assert p.step_p50_s == pytest.approx(quantile(every, 0.5)) and p.step_p50_s == pytest.approx(0.55)
    assert p.step_p90_s == pytest.approx(quantile(every, 0.9))
    assert p.step_mean_s == pytest.approx(sum(every) / len(every))
    assert p.mem_reserved_peak == 11 * MiB and p.mem_allocated_peak == 9 * MiB  # peaks, not the last report
    assert p.busy_fraction == pytest.approx((sum(durations) / 2 + 0.25) / (sum(durations) + 0.25))
    assert p.since_report_s == pytest.approx(2.5)
    assert p.total_iterations is None and p.features is None


@pytest.mark.parametrize("reports, window, p50, mean", [
    ([(0, 3.0)], 1, 3.0, 3.0),  # only the first mini-batch: it is all there is
    ([(0, 3.0), (1, 1.0)], 1, 1.0, 1.0),  # a later one is there: the start-up is left out
    ([(0, 3.0), (1, 1.0), (2, 2.0), (3, 1.5)], 3, 1.5, 1.5),
    ([(5, 1.0), (6, 3.0)], 2, 2.0, 2.0),  # reports of a job the node met late (no seq 0): every one counts
])
def test_the_window_leaves_out_the_first_mini_batch(reports, window, p50, mean):
    c = core()
    register(c)
    for seq, d in reports:
        report(c, seq, d, busy=d / 2)
    (p,) = c.progress(1.0, {})
    assert (p.window, p.step_p50_s, p.step_mean_s) == (window, pytest.approx(p50), pytest.approx(mean))


def test_the_host_part_is_the_mean_time_before_the_first_device_work():
    c = core()
    register(c)
    for seq, (d, start) in enumerate([(0.5, 0.4), (0.10, 0.02), (0.12, 0.04), (0.11, 0.5)]):  # the last: a late start
        c.handle(P.BatchReport(job_id="job-1", seq=seq, t_end=seq * 1.0, duration_s=d, busy_s=d / 2,
                               device_start_s=start, mem_allocated_peak=0, mem_reserved=0, mem_floor=0, host_bytes=0,
                               host_bytes_touched=0, limits_seq=1), 0.0)
    (p,) = c.progress(1.0, {})
    assert p.step_host_s == pytest.approx((0.02 + 0.04 + 0.11) / 3)  # the first left out, each capped at its step
    assert p.step_mean_s == pytest.approx((0.10 + 0.12 + 0.11) / 3)


def test_iterations_are_the_jobs_count_even_when_reports_were_lost():
    c = core()
    register(c)
    report(c, 0, 0.1, 0.1)
    report(c, 41, 0.1, 0.1)  # 40 reports in between never arrived
    report(c, 7, 0.1, 0.1)  # a late one
    assert c.progress(1.0, {})[0].iterations == 42


def test_features_ride_once_per_change_and_again_when_told_is_forgotten():
    c = core()
    register(c)
    report(c, 0, 0.1, 0.1)
    told: dict[str, int] = {}
    assert c.progress(1.0, told)[0].features is None  # none known yet
    assert c.handle(P.FeaturesReport(job_id="job-1", features=features(total=500)), 1.0) == []
    first = c.progress(2.0, told)[0]
    assert first.features == features(total=500) and first.total_iterations == 500
    again = c.progress(3.0, told)[0]
    assert again.features is None and again.total_iterations == 500  # sent once; the total always
    c.handle(P.FeaturesReport(job_id="job-1", features=features(total=500)), 3.5)  # the same, re-sent by a link
    assert c.progress(4.0, told)[0].features is None
    told.clear()  # a new welcome: the scheduler may have forgotten
    assert c.progress(5.0, told)[0].features == features(total=500)


def test_features_per_status_are_bounded_and_the_rest_follow():
    c = core()
    for r in range(5):
        register(c, rank=r, world=5)
        c.handle(P.FeaturesReport(job_id=f"job-1/{r}", features=features()), 0.0)
    told: dict[str, int] = {}
    first = c.progress(1.0, told, max_features=2)
    second = c.progress(2.0, told, max_features=2)
    third = c.progress(3.0, told, max_features=2)
    carried = [sum(p.features is not None for p in ps) for ps in (first, second, third)]
    assert carried == [2, 2, 1]
    assert {p.rank for p in first} == set(range(5)) and {p.job_id for p in first} == {"job-1"}


def test_a_worker_that_left_is_forgotten_and_unknown_workers_are_told_so():
    c = core()
    register(c)
    c.handle(P.FeaturesReport(job_id="job-1", features=features()), 0.0)
    told: dict[str, int] = {}
    c.progress(1.0, told)
    assert told == {"job-1": 1}
    c.handle(P.Goodbye(job_id="job-1", exit_code=0, reason="done"), 2.0)
    assert c.progress(3.0, told) == [] and told == {}
    (reply,) = c.handle(P.FeaturesReport(job_id="job-1", features=features()), 4.0)
    assert isinstance(reply, Reply) and reply.msg.code == P.UNKNOWN_JOB


def test_a_worker_that_left_is_in_the_next_progress_once_with_its_last_reports():
    """Its goodbye drops it from the node, but what it did to its end goes to the scheduler once: the history of
    its job records its last iteration and its peak, not those of the status a second before its end."""
    c = core()
    register(c)
    for i in range(3):
        report(c, i, 0.1, 0.05, reserved=MiB, now=i)
    assert c.progress(3.0, {})[0].iterations == 3
    report(c, 3, 0.1, 0.05, reserved=300 * MiB, now=3.5)  # a burst in the last mini-batch
    c.handle(P.Goodbye(job_id="job-1", exit_code=None, reason="exit"), 3.6)
    (p,) = c.progress(4.0, {})
    assert (p.job_id, p.iterations, p.mem_reserved_peak) == ("job-1", 4, 300 * MiB)
    assert c.progress(5.0, {}) == []  # once


def test_reports_at_the_protocols_bound_summarise_to_finite_figures():
    """QA: three reports of 1e308 s summed to inf and the node died building its JobProgress; at the protocol's
    bound (``P.MAX_REPORT_S``) every figure of a full window stays a number within it."""
    c = core()
    register(c)
    for seq in range(100):
        report(c, seq, P.MAX_REPORT_S, busy=P.MAX_REPORT_S, now=float(seq))
    (p,) = c.progress(100.0, {})
    assert p.step_p50_s == p.step_p90_s == p.step_mean_s == P.MAX_REPORT_S and p.busy_fraction == 1.0
    c.handle(P.Goodbye(job_id="job-1", exit_code=0, reason="done"), 101.0)
    (p,) = c.progress(102.0, {})
    assert p.step_mean_s == P.MAX_REPORT_S


def test_busy_fraction_is_nothing_until_the_reports_measured_some_time():
    c = core()
    register(c)
    report(c, 0, 5e-324, busy=1.0)
    (p,) = c.progress(1.0, {})
    assert p.busy_fraction == 0.0 and p.step_mean_s == 5e-324
