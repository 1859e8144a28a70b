"""Simulated GPU types: ``--sim-gpus 2:V100,2:T4@0.6`` (``colocate.gpus.sim.parse_sim_gpus``) gives the node
typed GPUs with relative speeds; the node's Welcome carries the speed to the job; the job's simulated
device stretches each mini-batch's device work ``d`` to ``d / speed`` (it charges ``d * (1/speed - 1)`` more
on its core), so a slower type takes proportionally more device time."""

from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.base.env import JobEnv
from colocate.gpus import sim
from torch_hooks.device.sim import SimJobDevice


@pytest.mark.parametrize("text, expect", [
    ("3", [("", 1.0)] * 3),
    ("2:V100,1:K80", [("V100", 1.0), ("V100", 1.0), ("K80", 0.25)]),
    ("1:T4@0.6, 1:P100", [("T4", 0.6), ("P100", 0.81)]),
    ("1:V100@0.5", [("V100", 0.5)]),
])
def test_sim_gpu_types_parse(text, expect):
    assert sim.parse_sim_gpus(text) == expect


@pytest.mark.parametrize("text, error", [
    ("0", "positive integer"), ("65", "at most 64"), ("2:T4", "unknown GPU type 'T4': give its speed as T4@SPEED"),
    ("2:T4@1.5", "speed must be in [0.001, 1]"), ("2:X@0.0000001", "speed must be in [0.001, 1]"),
    ("2:T4@fast", "is not a number"), ("V100", "expected N or N:TYPE"),
    ("2:", "expected N or N:TYPE"), ("40:V100,40:K80", "1 to 64 simulated GPUs"),
    ("2:V100,2:V100@0.5", "V100: one type, two speeds (1 and 0.5)"), ("1:T4@0.6,1:T4@0.3", "one type, two speeds"),
])
def test_bad_sim_gpu_types_give_one_line(text, error):
    with pytest.raises(ValueError) as e:
        sim.parse_sim_gpus(text)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_typed_node_gpus_carry_their_type_and_speed():
    gpus = sim.node_gpus(sim.parse_sim_gpus("1:V100,1:T4@0.5"), 1 << 30)
    assert [(g.index, g.name, g.speed) for g in gpus] == [(0, "V100", 1.0), (1, "T4", 0.5)]
    assert [(g.name, g.speed) for g in sim.node_gpus(2, 1 << 30)] == [("colocate-sim", 1.0)] * 2  # --sim-gpus N


def test_the_welcome_carries_the_speed_and_old_peers_still_read_it():
    limits = P.Limits(seq=1, mem_cap=1 << 30, sm_share=1.0, gate=False)
    w = P.Welcome(job_id="j", node_epoch=1, limits=limits, sim_speed=0.25)
    assert P.decode(P.encode(w)).sim_speed == 0.25
    plain = P.Welcome(job_id="j", node_epoch=1, limits=limits)
    assert "sim_speed" not in P.to_wire(plain) and P.decode(P.encode(plain)).sim_speed == 1.0


@pytest.mark.parametrize("speed, charged", [(1.0, []), (0.5, [0.5]), (0.25, [1.5])])
def test_a_slower_type_charges_the_extra_device_time(monkeypatch, speed, charged):
    dev = SimJobDevice(JobEnv())
    dev.joined = True  # no core pinning in the test process
    dev.set_speed(speed)
    busy = iter([10.0, 10.5])  # the mini-batch's device work took 0.5 s of device time
    monkeypatch.setattr(dev, "busy_time", lambda: next(busy))
    got: list[float] = []
    monkeypatch.setattr(dev, "charge", got.append)
    dev.phase_start()
    dev.phase_end()
    assert got == pytest.approx(charged)


def test_the_node_core_welcomes_a_job_with_its_gpus_speed():
    """The node's pure core sends each GPU's speed in the Welcome: a worker on the slow GPU 1 gets 0.25."""
    from colocate.node.commands import Send
    from colocate.node.config import NodeConfig
    from colocate.node.core import NodeCore

    core = NodeCore(sim.node_gpus(sim.parse_sim_gpus("1:V100,1:K80"), 16 << 30), NodeConfig(policy="exclusive"),
                    node_epoch=1)
    got = {}
    for gpu in (0, 1):
        reg = P.Register(job_id=f"j{gpu}", pid=500 + gpu, gpu=gpu, priority="guaranteed", mem_request=None,
                         sm_share=1.0, mem_cap=16 << 30, epoch=1, token="t", sm_request=1.0)
        welcome = [c.msg for c in core.handle(reg, 1.0) if isinstance(c, Send) and isinstance(c.msg, P.Welcome)]
        got[gpu] = welcome[0].sim_speed
    assert got == {0: 1.0, 1: 0.25}


@pytest.mark.parametrize("gpus, want", [
    ("1:V100,1:K80", [("V100", 1.0), ("K80", 0.25)]),
    ("2", [("", 1.0), ("", 1.0)]),  # untyped: no type to say
])
def test_the_welcome_says_the_gpus_type(gpus, want):
    from colocate.node.commands import Send
    from colocate.node.config import NodeConfig
    from colocate.node.core import NodeCore

    core = NodeCore(sim.node_gpus(sim.parse_sim_gpus(gpus), 16 << 30), NodeConfig(policy="exclusive"), node_epoch=1)
    got = []
    for gpu in (0, 1):
        reg = P.Register(job_id=f"j{gpu}", pid=500 + gpu, gpu=gpu, priority="guaranteed", mem_request=None,
                         sm_share=1.0, mem_cap=16 << 30, epoch=1, token="t", sm_request=1.0)
        (w,) = [c.msg for c in core.handle(reg, 1.0) if isinstance(c, Send) and isinstance(c.msg, P.Welcome)]
        got.append((w.sim_type, w.sim_speed))
    assert got == want
    limits = P.Limits(seq=1, mem_cap=1 << 30, sm_share=1.0, gate=False)
    assert P.decode(P.encode(P.Welcome(job_id="j", node_epoch=1, limits=limits))).sim_type == ""  # an older node


@pytest.mark.parametrize("speed, type_name, want", [(0.25, "K80", ("K80", 0.25)), (1.0, "", ("colocate-sim", 1.0))])
def test_a_simulated_gpus_hardware_features_are_its_declared_type(speed, type_name, want):
    from torch_hooks.features import hardware_features

    dev = SimJobDevice(JobEnv(sim_gpu_mem=1 << 30))
    dev.set_speed(speed, type_name)
    hw = P.HardwareFeatures(**hardware_features(JobEnv(device="sim", sim_gpu_mem=1 << 30), dev))
    assert (hw.name, hw.sim_speed, hw.kind, hw.mem_total) == (*want, "sim", 1 << 30)
    assert P.decode(P.encode(P.FeaturesReport(job_id="j", features=_features(hw)))).features.hardware == hw


def _features(hw):
    model = P.ModelFeatures(params=1, trainable_params=1, layers=(), layer_counts={}, forward_flops=0.0,
                            flops_per_iteration=0.0, batch_size=None, optimizers=(), param_dtype="float32",
                            autocast_dtype="")
    return P.Features(model=model, hardware=hw, loader_batches=None, iterations_hint=None, epochs_hint=None,
                      total_iterations=None, read_s=0.0)


def test_the_slowest_speed_a_node_may_declare_is_the_one_the_wire_takes():
    assert sim.MIN_SIM_SPEED == P.SIM_SPEED.lo
