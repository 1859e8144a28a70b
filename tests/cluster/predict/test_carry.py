"""Carrying a time per iteration across GPU types (cluster/predict/carry.py): the device part scales with the
hardware, the host part does not; the device ratio from two simulated types' speeds, or from two real GPUs'
features and the job's layers through the cross-hardware model."""

from __future__ import annotations

import math

import pytest

from cluster.predict import carry, crosshw
from colocate import protocol as P


def hw(kind="sim", name="colocate-sim", speed=1.0, peak=0.0, bandwidth=0.0):
    return P.HardwareFeatures(kind=kind, name=name, mem_total=1 << 30, sm_count=1, sm_clock_mhz=0, mem_clock_mhz=0,
                              mem_bandwidth=bandwidth, peak_flops=peak, gpus=1, sim_speed=speed)


V100, P100, K80 = hw(name="V100", speed=1.0), hw(name="P100", speed=0.81), hw(name="K80", speed=0.25)
T4 = hw(name="T4", speed=0.6)


@pytest.mark.parametrize("step, busy, ratio, want", [
    (0.1, 1.0, 4.0, 0.4),  # all device: the whole step scales
    (0.1, 0.0, 4.0, 0.1),  # all host: nothing to gain or lose
    (0.1, 0.5, 4.0, 0.25),  # 50 ms host kept + 50 ms device x 4
    (0.1, 0.5, 0.25, 0.0625),  # to a faster GPU
    (0.2, 0.3, 1.0, 0.2),  # the same device time
])
def test_the_host_part_is_kept_and_the_device_part_scaled(step, busy, ratio, want):
    assert carry.step_time(step, busy, ratio) == pytest.approx(want)


@pytest.mark.parametrize("args, match", [
    ((0.0, 0.5, 1.0), "step time"), ((math.nan, 0.5, 1.0), "step time"), ((0.1, 1.5, 1.0), "device share"),
    ((0.1, -0.1, 1.0), "device share"), ((0.1, 0.5, 0.0), "device ratio"), ((0.1, 0.5, math.inf), "device ratio"),
])
def test_bad_inputs_are_refused_in_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        carry.step_time(*args)


@pytest.mark.parametrize("a, b, want", [
    (V100, K80, 4.0),  # device work on a K80 (0.25) takes 4x as long as on a V100 (1.0)
    (K80, V100, 0.25),
    (V100, P100, 1 / 0.81),
    (T4, K80, 0.6 / 0.25),  # a declared type (T4@0.6)
    (V100, V100, 1.0),
    (hw(speed=0.0), hw(speed=0.0), 1.0),  # an older job's report (no speed), the same GPU
    (hw(speed=0.0), K80, None),  # no speed for A: nothing to carry with
    (V100, hw("cuda", "Tesla V100-SXM2-16GB", 0.0), None),  # a simulated GPU and a real one
])
def test_simulated_types_carry_by_their_speeds(a, b, want):
    got = carry.device_ratio(a, b)
    assert got == (pytest.approx(want) if want is not None else None)


def progress(mean=0.04, host=0.016, busy=0.3):
    return P.JobProgress("j", rank=0, iterations=100, step_p50_s=mean, step_p90_s=mean, window=64,
                         mem_reserved_peak=0, mem_allocated_peak=0, busy_fraction=busy, step_mean_s=mean,
                         step_host_s=host)


@pytest.mark.parametrize("p, want", [
    (progress(0.04, 0.016, 0.3), 0.6),  # 16 of 40 ms before the first device work: the device phase is 60%
    (progress(0.04, 0.0, 0.3), 0.3),  # no host part reported (an older node): the busy fraction
    (progress(0.0, 0.0, 0.45), 0.45),
    (progress(0.04, 0.05, 0.3), 0.0),  # a host part over the mean step (different windows): none left
])
def test_the_device_share_of_a_summary(p, want):
    assert carry.device_share(p) == pytest.approx(want)


def test_a_jobs_step_carried_between_simulated_types():
    # 40 ms per iteration on a V100 type, 60% of it on the device: 16 ms host + 24 ms x 4 on a K80
    assert carry.carry(0.040, 0.6, V100, K80) == pytest.approx(0.016 + 0.096)
    assert carry.carry(0.040, 0.6, hw(speed=0.0), K80) is None


LAYERS = [(crosshw.Layer("conv", 32, 64, 64, 56, 3, optimizer="sgd"), 2), (crosshw.Layer("dense", 32, 4096, 1000), 1)]


@pytest.mark.parametrize("a, b", [
    (hw("cuda", "Tesla K80"), hw("cuda", "Tesla V100-SXM2-16GB")),  # by name, from the model's table
    (hw("cuda", "", peak=5591e9, bandwidth=240e9), hw("cuda", "", peak=14900e9, bandwidth=900e9)),  # by features
])
def test_real_gpus_carry_by_the_cross_hardware_models_ratio(a, b):
    g = crosshw.gpus()
    model = crosshw.default_model()
    want = (sum(n * model.layer_time(layer, g["V100"]) for layer, n in LAYERS)
            / sum(n * model.layer_time(layer, g["K80"]) for layer, n in LAYERS))
    assert carry.device_ratio(a, b, LAYERS) == pytest.approx(want)
    assert want < 1.0  # a V100 is faster
    assert carry.carry(0.1, 0.5, a, b, LAYERS) == pytest.approx(0.05 + 0.05 * want)
    assert carry.carry(0.1, 1.0, a, b, LAYERS) == pytest.approx(
        crosshw.carry(0.1, [layer for layer, n in LAYERS for _ in range(n)], g["K80"], g["V100"]))


@pytest.mark.parametrize("a, b, layers, want", [
    (hw("cuda", "Tesla V100"), hw("cuda", "Tesla V100-PCIE"), (), 1.0),  # the same GPU: no layers needed
    (hw("cuda", "Tesla K80"), hw("cuda", "Tesla V100"), (), None),  # different GPUs but no layers to model
    (hw("cuda", "NVIDIA H100 80GB HBM3"), hw("cuda", "Tesla V100"), LAYERS, None),  # not in the table, no features
])
def test_real_gpus_without_enough_to_go_on(a, b, layers, want):
    assert carry.device_ratio(a, b, layers) == want


@pytest.mark.parametrize("name, want", [
    ("GeForce GTX 1080 Ti", "1080Ti"), ("Tesla K80", "K80"), ("Tesla K40m", "K40"), ("Tesla M60", "M60"),
    ("Tesla P100-PCIE-16GB", "P100"), ("NVIDIA A100-SXM4-40GB", None),
])
def test_a_real_gpu_is_found_by_its_name(name, want):
    got = carry.gpu_of(hw("cuda", name))
    assert (got.name if got else None) == want


def model_features(layers, batch=16, optimizers=("Adam",)):
    return P.ModelFeatures(params=1, trainable_params=1, layers=tuple(layers), layer_counts={}, forward_flops=0.0,
                           flops_per_iteration=0.0, batch_size=batch, optimizers=optimizers, param_dtype="float32",
                           autocast_dtype="")


def test_layers_of_a_jobs_features():
    groups = [
        P.LayerGroup("Conv2d", 2, 100, 1e6, {"in": 3, "out": 16, "kernel": 9, "stride": 1, "groups": 1,
                                             "out_size": 1024}),
        P.LayerGroup("Linear", 1, 100, 1e6, {"in": 1024, "out": 128}),
        P.LayerGroup("Conv2d", 1, 100, 1e6, {"in": 16, "out": 16, "kernel": 9, "stride": 1, "groups": 16,
                                             "out_size": 256}),  # depthwise: not modelled
        P.LayerGroup("Conv1d", 1, 100, 1e6, {"in": 16, "out": 16, "kernel": 3, "stride": 1, "groups": 1,
                                             "out_size": 30}),  # not 2-D: not modelled
        P.LayerGroup("LSTM", 1, 100, 1e6, {"in": 8, "hidden": 8, "layers": 1, "directions": 1, "seq": 4}),
        P.LayerGroup("Linear", 1, 100, 1e6, {"in": 8}),  # sizes missing
    ]
    got = carry.layers_of(model_features(groups))
    assert got == [(crosshw.Layer("conv", 16, 3, 16, 32, 3, 1, optimizer="adam"), 2),
                   (crosshw.Layer("dense", 16, 1024, 128, optimizer="adam"), 1)]
    assert carry.layers_of(model_features(groups[1:2], batch=None, optimizers=()))[0][0] == crosshw.Layer(
        "dense", 1, 1024, 128, optimizer="none")
