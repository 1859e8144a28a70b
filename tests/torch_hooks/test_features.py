"""torch_hooks.features: what the runtime reads of a job at its first mini-batch, on small plain-torch models.

The reader runs here in-process, as the runtime drives it: ``start`` at the first module call, one training
step (forward, backward, optimizer step), ``finish`` at the boundary. FLOPs are checked against torch's own
``FlopCounterMode`` where it counts the same operators (Linear, Conv, attention), and against the textbook
formula for an LSTM (which ``FlopCounterMode`` does not count on CPU).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from colocate import protocol as P  # noqa: E402
from colocate.base.env import JobEnv  # noqa: E402
from torch_hooks.features import FeatureReader, features_dict  # noqa: E402


class SimDevice:
    kind = "sim"
    mem_total = 1 << 30


def read(model, x, *, env=None, optimizer="adam", loader=None, step=None):
    """One training step of ``model`` on ``x`` under a reader; its ``Features``."""
    env = env or JobEnv(device="sim", sim_gpu_mem=1 << 30)
    reader = FeatureReader(env, SimDevice())
    if loader is not None:
        reader.note_loader(loader)
    opt = {"adam": lambda: torch.optim.Adam(model.parameters()),
           "sgd": lambda: torch.optim.SGD(model.parameters(), lr=0.1), None: lambda: None}[optimizer]()
    reader.start((x,))
    (step or (lambda: model(x)))().float().pow(2).mean().backward()
    if opt is not None:
        opt.step()
    return reader.finish()


def torch_forward_flops(model, x) -> int:
    with FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def group(features: P.Features, kind: str) -> P.LayerGroup:
    return next(g for g in features.model.layers if g.kind == kind)


def test_linear_model_sizes_params_flops_batch_and_optimizer():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(8, 32)
    f = read(model, x)
    m = f.model
    assert m.params == m.trainable_params == sum(p.numel() for p in model.parameters())
    assert dict(m.layer_counts) == {"Linear": 3, "ReLU": 2}  # the Sequential container is not a layer
    assert sorted((dict(g.dims)["in"], dict(g.dims)["out"], g.count) for g in m.layers) == [
        (32, 64, 1), (64, 10, 1), (64, 64, 1)]
    assert m.forward_flops == pytest.approx(torch_forward_flops(model, x), rel=1e-6)
    assert m.flops_per_iteration == pytest.approx(3 * m.forward_flops)
    assert m.batch_size == 8
    assert m.optimizers == ("Adam",)
    assert m.param_dtype == "float32" and m.autocast_dtype == ""


def test_two_layers_of_one_shape_are_one_group():
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4))
    f = read(model, torch.randn(4, 16), optimizer="sgd")
    same = [g for g in f.model.layers if dict(g.dims) == {"in": 16, "out": 16}]
    assert len(same) == 1 and same[0].count == 2 and same[0].params == 2 * (16 * 16 + 16)
    assert f.model.optimizers == ("SGD",)


def test_conv_model_flops_match_torch_and_dims_are_read():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, groups=2),
                          nn.Flatten(), nn.LazyLinear(10))
    x = torch.randn(4, 3, 16, 16)
    model(x)  # materialise the lazy layer
    f = read(model, x)
    assert f.model.forward_flops == pytest.approx(torch_forward_flops(model, x), rel=1e-6)
    second = next(g for g in f.model.layers if g.kind == "Conv2d" and dict(g.dims)["out"] == 16)
    assert dict(second.dims) == {"in": 8, "out": 16, "kernel": 9, "stride": 4, "groups": 2, "out_size": 49}


def test_lstm_flops_follow_the_gate_formula():
    lstm = nn.LSTM(12, 20, num_layers=2, batch_first=True, bidirectional=True)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.out = lstm, nn.Linear(40, 1)

        def forward(self, x):
            return self.out(self.lstm(x)[0])

    model = Head()
    x = torch.randn(3, 7, 12)  # batch 3, sequence 7
    f = read(model, x)
    g = group(f, "LSTM")
    tokens, h = 3 * 7, 20
    want = 2 * 2 * 4 * h * (12 + h) * tokens + 2 * 2 * 4 * h * (2 * h + h) * tokens  # 2 layers x 2 directions
    assert g.flops == pytest.approx(want)
    assert dict(g.dims) == {"in": 12, "hidden": 20, "layers": 2, "directions": 2, "seq": 7}
    assert g.params == sum(p.numel() for p in lstm.parameters())


def test_gru_and_rnn_count_their_gates():
    for cls, gates in ((nn.GRU, 3), (nn.RNN, 1)):
        rnn = cls(6, 10)
        f = read(rnn, torch.randn(5, 2, 6), optimizer=None, step=lambda r=rnn: r(torch.randn(5, 2, 6))[0])
        assert group(f, cls.__name__).flops == pytest.approx(2 * gates * 10 * (6 + 10) * 5 * 2)


def test_attention_flops_match_torch_and_its_projection_parameters_count():
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 9, 32)
    f = read(mha, x, step=lambda: mha(x, x, x)[0])
    g = group(f, "MultiheadAttention")
    with FlopCounterMode(display=False) as counter:
        mha(x, x, x)
    assert g.flops == pytest.approx(counter.get_total_flops(), rel=0.02)
    assert dict(g.dims) == {"embed": 32, "heads": 4, "seq": 9}
    assert f.model.params == sum(p.numel() for p in mha.parameters())  # out_proj is used, never called


def test_autocast_and_dtype_are_read():
    model = nn.Sequential(nn.Linear(8, 8))
    x = torch.randn(2, 8)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    assert read(model, x, step=step).model.autocast_dtype == "bfloat16"
    half = nn.Sequential(nn.Linear(8, 8)).to(torch.float64)
    assert read(half, x.double()).model.param_dtype == "float64"


def test_total_from_the_hint_or_the_loader_times_epochs():
    model = nn.Linear(4, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(50, 4)), batch_size=16)
    x = torch.randn(16, 4)
    by_epochs = read(model, x, env=JobEnv(device="sim", epochs=3), loader=loader)
    assert (by_epochs.loader_batches, by_epochs.epochs_hint, by_epochs.total_iterations) == (4, 3, 12)
    assert by_epochs.model.batch_size == 16
    said = read(model, x, env=JobEnv(device="sim", epochs=3, iterations=1000), loader=loader)
    assert said.total_iterations == 1000 and said.iterations_hint == 1000
    unknown = read(model, x, loader=loader)
    assert unknown.loader_batches == 4 and unknown.total_iterations is None


def test_hardware_of_a_simulated_gpu_is_its_declared_spec():
    f = read(nn.Linear(2, 2), torch.randn(1, 2), env=JobEnv(device="sim", sim_gpu_mem=3 << 30, world_size=4))
    hw = f.hardware
    assert (hw.kind, hw.name, hw.mem_total, hw.sm_count, hw.gpus) == ("sim", "colocate-sim", 3 << 30, 1, 4)


def test_after_finish_no_hook_is_left_and_the_record_is_json():
    import json

    from torch.nn.modules import module as torch_module
    from torch.optim import optimizer as torch_optimizer

    before = (len(torch_module._global_forward_hooks), len(torch_optimizer._global_optimizer_pre_hooks))
    f = read(nn.Linear(3, 3), torch.randn(2, 3))
    after = (len(torch_module._global_forward_hooks), len(torch_optimizer._global_optimizer_pre_hooks))
    assert after == before
    assert P.decode(P.encode(P.FeaturesReport(job_id="j", features=f))).features == f
    assert json.loads(json.dumps(features_dict(f)))["model"]["layer_counts"] == {"Linear": 1}
    assert f.read_s > 0


def test_a_reader_never_started_gives_nothing():
    assert FeatureReader(JobEnv(device="sim"), SimDevice()).finish() is None


CHILD = r'''
import json, sys
import torch
import torch_hooks
from colocate.base.env import JobEnv

rt = torch_hooks.install(JobEnv(enabled=True, job_id="features-test", device="sim", epochs=2))
model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
opt = torch.optim.RMSprop(model.parameters())
evaluation = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(7, 6)), batch_size=7)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(45, 6)), batch_size=5)
for (x,) in evaluation:  # a loader iterated before training: not the training loader
    with torch.no_grad():
        model(x)
for epoch in range(2):
    for (x,) in train:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
f = rt.features
json.dump({"features": None if f is None else torch_hooks.features.features_dict(f),
           "iterations": rt.book.iterations}, sys.stdout)
'''


def test_an_installed_runtime_reads_the_training_loader_through_an_unchanged_script(tmp_path):
    """The whole path in a fresh process: ``torch_hooks.install``, a plain loop over a DataLoader (its
    ``__iter__`` seen by the runtime's hook), features read at the first optimizer step."""
    import json
    import subprocess
    import sys

    from tests.support import child_env

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    res = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    f = out["features"]
    assert out["iterations"] == 18
    assert (f["loader_batches"], f["epochs_hint"], f["total_iterations"]) == (9, 2, 18)
    assert f["model"]["batch_size"] == 5 and f["model"]["optimizers"] == ["RMSprop"]
    assert f["model"]["layer_counts"] == {"Linear": 2, "Tanh": 1}
    assert f["model"]["params"] == 6 * 12 + 12 + 12 + 1


def test_hardware_on_cuda_comes_from_nvml(monkeypatch):
    """The CUDA branch, without a GPU: NVML's figures (a fake ``pynvml``); CUDA's SM count is 0 where CUDA cannot
    say (no device here)."""
    import sys

    from tests.colocate.test_nvml_hardware import fake_pynvml
    from torch_hooks.features import hardware_features

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())

    class Cuda:
        kind, cuda_index, mem_total = "cuda", 0, 80 << 30

    hw = P.HardwareFeatures(**hardware_features(JobEnv(device="cuda", world_size=8), Cuda()))
    assert (hw.kind, hw.name, hw.mem_total, hw.gpus, hw.sm_clock_mhz) == ("cuda", "NVIDIA H100 80GB HBM3", 80 << 30,
                                                                          8, 1980)
    assert hw.peak_flops > 6e13 and hw.sm_count == (torch.cuda.get_device_properties(0).multi_processor_count
                                                    if torch.cuda.is_available() else 0)


SKIPPED_FIRST_STEP = '''
import json, sys
import torch
import torch_hooks
from colocate.base.env import JobEnv

rt = torch_hooks.install(JobEnv(enabled=True, job_id="features-scaler", device="sim"))
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adadelta(model.parameters())
scaler = torch.amp.GradScaler("cpu")
for i in range(3):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean() * (float("inf") if i == 0 else 1.0)  # the first step overflows
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
f = rt.features
json.dump({"optimizers": None if f is None else list(f.model.optimizers), "iterations": rt.book.iterations},
          sys.stdout)
'''


def test_the_optimizer_is_read_when_amp_skips_the_first_step(tmp_path):
    """AMP's GradScaler skips ``optimizer.step()`` while it finds its scale; the first boundary (the scaler's
    update) then comes before any step: the optimizer it was given is the job's all the same."""
    import json
    import subprocess
    import sys

    from tests.support import child_env

    script = tmp_path / "child.py"
    script.write_text(SKIPPED_FIRST_STEP)
    res = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["iterations"] == 3 and out["optimizers"] == ["Adadelta"], out
