"""Carrying a job's measured time per iteration from the GPU it ran on (A) to another GPU type (B).

**Model.** A training step is host time (data loading, Python and the framework's own work, waiting on
input) plus device time (the kernels). Only the device time depends on the GPU::

    t_B = t_A x ((1 - d) + d x r)

``t_A``: seconds per iteration measured on A; ``d``: the device's share of the step on A; ``r``: device time
on B over device time on A (``device_ratio``). ``d`` = 1 scales the whole step (a job that never leaves the
GPU); ``d`` = 0 carries it unchanged (a job bound by its input pipeline gains nothing from a faster GPU).

**The device share** (``device_share``) of a job's progress summary is the wall-clock share of its steps
from their first device work to their end: 1 - (host part) / (step), both means over the node's window
(``JobProgress.step_host_s``, ``step_mean_s``). The host part, from a step's start to its first device
work, is the time spent waiting for input and on host work. The busy fraction (device busy time over wall
time) is the fallback for a summary without a host part: it leaves out the time device work waited for its
device (time-slicing with another tenant; on a simulated GPU, its CPU core taken by other processes: its
busy time is CPU time), and that waiting grows with the device work, not with the host's.

**The device ratio** comes from the two GPUs' hardware features (``HardwareFeatures`` fields: A's as the job
reported them, B's from the node's declared spec or NVML):

* two simulated GPU types: speed_A / speed_B (``sim_speed``: a simulated type's device work takes 1/speed
  as long, ``colocate.gpus.sim``);
* two real GPUs, each known by its peak FP32 FLOP/s and memory bandwidth (reported, or its name found in the
  cross-hardware model's table), with the job's dense and convolutional layers (``layers_of`` its
  ``ModelFeatures``): the ratio of the cross-hardware model's predictions (``crosshw``);
* the same features on both: 1; anything else: None (nothing to carry with).

Pure: no clock, randomness or I/O (the cross-hardware model reads the package's data on first use, for real
GPUs only). Times are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cluster.predict import crosshw
from cluster.predict.crosshw import Gpu, Layer, Model
from colocate.base.vocab import DeviceKind


def step_time(step_a_s: float, device_a: float, ratio: float) -> float:
    """The model: ``step_a_s`` x ((1 - ``device_a``) + ``device_a`` x ``ratio``). Raises ValueError on a step
    time that is not > 0, a device share outside [0, 1] or a ratio that is not > 0."""
    if not (math.isfinite(step_a_s) and step_a_s > 0):
        raise ValueError(f"step time {step_a_s!r}: expected seconds > 0")
    if not (math.isfinite(device_a) and 0.0 <= device_a <= 1.0):
        raise ValueError(f"device share {device_a!r}: expected a number in [0, 1]")
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"device ratio {ratio!r}: expected a number > 0")
    return step_a_s * ((1.0 - device_a) + device_a * ratio)


def device_share(progress: Any) -> float:
    """The device's share of the steps of a ``JobProgress``-like summary (module docstring): 1 - host / step
    where it has both, else its busy fraction; in [0, 1]."""
    step, host = getattr(progress, "step_mean_s", 0.0), getattr(progress, "step_host_s", 0.0)
    if step > 0 and host > 0:
        return min(1.0, max(0.0, 1.0 - host / step))
    return min(1.0, max(0.0, progress.busy_fraction))


def gpu_of(hw: Any) -> Gpu | None:
    """The cross-hardware model's ``Gpu`` for real GPU features ``hw``: its reported peak FP32 FLOP/s and memory
    bandwidth where both are known, else the table's GPU whose name ``hw.name`` contains (``V100`` in
    ``Tesla V100-SXM2-16GB``); None for a simulated GPU or one neither way knows."""
    if hw.kind == DeviceKind.SIM:
        return None
    if hw.peak_flops > 0 and hw.mem_bandwidth > 0:
        return Gpu(hw.name or "gpu", hw.peak_flops / 1e9, hw.mem_bandwidth / 1e9)
    name = (hw.name or "").lower().replace(" ", "")
    for known, gpu in sorted(crosshw.gpus().items(), key=lambda kv: -len(kv[0])):  # "1080Ti" before "1080"
        if known.lower() in name:
            return gpu
    return None


def layers_of(model: Any) -> list[tuple[Layer, int]]:
    """The dense (``Linear``) and square 2-D convolutional (``Conv2d``, one group) layers of ``ModelFeatures``
    ``model``, as the cross-hardware model's ``Layer`` with their module counts; others are left out (the
    model was not fitted on them). The batch is the model's (1 where unknown), the optimizer its first."""
    batch = model.batch_size or 1
    opt = crosshw.optimizer_kind(model.optimizers[0] if model.optimizers else None)
    out: list[tuple[Layer, int]] = []
    for g in model.layers:
        d = dict(g.dims)
        try:
            if g.kind == "Linear":
                out.append((Layer("dense", batch, d["in"], d["out"], optimizer=opt), g.count))
            elif g.kind == "Conv2d" and d.get("groups", 1) == 1:
                kernel, stride = _square(d["kernel"]), _square(d.get("stride", 1))
                side = _square(d["out_size"])
                if kernel and stride and side:
                    out.append((Layer("conv", batch, d["in"], d["out"], side * stride, kernel, stride,
                                              optimizer=opt), g.count))
        except (KeyError, ValueError):  # a group without its sizes: not modelled
            continue
    return out


def device_ratio(a: Any, b: Any, layers: Sequence[tuple[Layer, int]] = (), model: Model | None = None) -> float | None:
    """Device time on ``b`` over device time on ``a`` (both ``HardwareFeatures``-like), as the module docstring
    says; None when the features say nothing."""
    if a.kind == DeviceKind.SIM and b.kind == DeviceKind.SIM:
        if a.sim_speed > 0 and b.sim_speed > 0:
            return a.sim_speed / b.sim_speed
        return 1.0 if (a.name, a.sim_speed) == (b.name, b.sim_speed) else None
    if a.kind == DeviceKind.SIM or b.kind == DeviceKind.SIM:
        return None
    ga, gb = gpu_of(a), gpu_of(b)
    if ga is None or gb is None:
        return None
    if (ga.peak_gflops, ga.bandwidth_gbs) == (gb.peak_gflops, gb.bandwidth_gbs):
        return 1.0
    if not layers:
        return None
    m = model or crosshw.default_model()
    on_a = sum(n * m.layer_time(layer, ga) for layer, n in layers)
    on_b = sum(n * m.layer_time(layer, gb) for layer, n in layers)
    return on_b / on_a


def carry(step_a_s: float, device_a: float, a: Any, b: Any, layers: Sequence[tuple[Layer, int]] = (),
          model: Model | None = None) -> float | None:
    """Seconds per iteration on ``b`` of a job measured at ``step_a_s`` with device share ``device_a`` on ``a``
    (``step_time`` with ``device_ratio``); None when the ratio is unknown."""
    ratio = device_ratio(a, b, layers, model)
    return None if ratio is None else step_time(step_a_s, device_a, ratio)


def _square(n: int) -> int:
    """The side of a square of ``n`` (a kernel's or an output's size as a product): 0 if ``n`` is not one."""
    side = math.isqrt(int(n)) if n > 0 else 0
    return side if side * side == n else 0
