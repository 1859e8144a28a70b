"""``colocate.gpus.nvml.hardware``: a GPU's features from NVML, against a fake ``pynvml`` with an H100's
figures (no GPU here), and what it gives when NVML cannot answer."""

from __future__ import annotations

import sys
import types

import pytest

from colocate.gpus import nvml


def fake_pynvml(cores=True, bus=True):
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # bytes, as older bindings give it
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 << 30, used=0)
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1980, 2: 2619}[kind]
    if bus:
        m.nvmlDeviceGetMemoryBusWidth = lambda h: 5120
    if cores:
        m.nvmlDeviceGetNumGpuCores = lambda h: 16896
    return m


def test_an_h100s_features(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    hw = nvml.hardware(0)
    assert (hw["name"], hw["mem_total"], hw["sm_clock_mhz"], hw["mem_clock_mhz"]) == (
        "NVIDIA H100 80GB HBM3", 80 << 30, 1980, 2619)
    assert hw["mem_bandwidth"] == pytest.approx(3.352e12, rel=1e-3)  # the data sheet's 3.35 TB/s
    assert hw["peak_flops"] == pytest.approx(66.9e12, rel=1e-3)  # and its 67 TFLOPS FP32


def test_what_nvml_cannot_say_is_zero(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(cores=False, bus=False))
    hw = nvml.hardware(0)
    assert hw["mem_bandwidth"] == 0.0 and hw["peak_flops"] == 0.0 and hw["sm_clock_mhz"] == 1980
    broken = fake_pynvml()
    broken.nvmlDeviceGetHandleByIndex = lambda i: (_ for _ in ()).throw(RuntimeError("NVML: GPU is lost"))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert nvml.hardware(0) == {"name": "", "mem_total": 0, "sm_clock_mhz": 0, "mem_clock_mhz": 0,
                                "mem_bandwidth": 0.0, "peak_flops": 0.0}
