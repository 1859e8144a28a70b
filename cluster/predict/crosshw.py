"""The cross-hardware model: the time of one training step of a dense or convolutional layer on a GPU,
from the layer's features and the GPU's, and the carry of a measured time per iteration from one GPU
type to another.

**Model.** Per layer type, a least-squares fit of log(time) on: log FLOPs, log bytes moved (inputs,
outputs and weights, FP32), log weight count, their squares and product (the step from overhead-bound
to compute-bound layers), whether the step trains (backward + update) and its interaction with FLOPs
and weights, the optimizer and the activation as indicators, the shape (log batch, channels in and
out, output pixels, kernel area, and their pairwise products; padding, stride), and the GPU's log
peak FLOP/s and log memory bandwidth, each also times the log of the work it limits (FLOPs, bytes). The GPU enters only
through its peak FLOP/s and bandwidth, so any GPU with a data sheet can be predicted; cores and clock
are kept in ``Gpu`` as data but left out of the fit: with them too, leave-one-GPU-out error falls
for dense layers but more than doubles for convolutions (six GPUs cannot pin four hardware terms;
``benchmarks/crosshw.py`` prints the comparison).

**Data.** Fitted on first use from the package's own table ``data/justus2018_layers.csv.gz``: 24,000
per-layer benchmark rows on six GPUs (V100, P100, 1080Ti, M60, K80, K40, FP32, batch <= 32) of Justus
et al., "Predicting the Computational Cost of Deep Learning Models", IEEE BigData 2018, a subset of
their repository CDECatapult/ml-performance-prediction (Apache-2.0; ``data/NOTICE``). No precision
other than FP32 was measured: a mixed-precision job's carry assumes both GPUs gain alike from it.

**Carry.** ``carry(t_a, layers, a, b) = t_a x predicted(layers, b) / predicted(layers, a)``: the model
supplies only the ratio, the measurement its level, so a bias of the model common to both GPUs
cancels. The whole measured step is scaled by that ratio: time spent off the GPU (data loading, host
work) and in layers other than dense and convolutional ones is assumed to scale alike.
``cluster.predict.carry`` splits the step by the job's busy fraction instead: its device part scaled
by this ratio, its host part kept.

Pure: no clock, randomness, environment or files other than the package's data (read through
``importlib.resources``); the same inputs give the same outputs. Times are in seconds.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

KINDS = ("dense", "conv")
OPTIMIZERS = ("none", "sgd", "momentum", "adam", "rmsprop", "adagrad", "adadelta")  # "none": forward only
ACTIVATIONS = ("none", "relu", "tanh", "sigmoid")
PADDINGS = ("same", "valid")
_OPT_TERMS = OPTIMIZERS[2:]  # indicators relative to plain SGD
_ACT_TERMS = ACTIVATIONS[1:]
# PyTorch's optimizer and activation class names (lower case) -> the benchmark's closest kind
_TORCH_OPTIMIZERS = {"sgd": "sgd", "adam": "adam", "adamw": "adam", "nadam": "adam", "radam": "adam",
                     "adamax": "adam", "rmsprop": "rmsprop", "adagrad": "adagrad", "adadelta": "adadelta"}
_TORCH_ACTIVATIONS = {"tanh": "tanh", "sigmoid": "sigmoid", "identity": "none", "none": "none"}
DATA = "justus2018_layers.csv.gz"
GPU_DATA = "justus2018_gpus.json"


@dataclass(frozen=True)
class Layer:
    """One dense or convolutional layer's training step. ``cin``/``cout``: input/output features (dense)
    or channels (conv); ``image``: the conv's input height = width in pixels (a dense layer: 1);
    ``optimizer`` "none": forward pass only. Raises ValueError on a value outside these."""

    kind: str
    batch: int
    cin: int
    cout: int
    image: int = 1
    kernel: int = 1
    stride: int = 1
    padding: str = "same"
    optimizer: str = "sgd"
    activation: str = "none"

    def __post_init__(self) -> None:
        for name, allowed in (("kind", KINDS), ("padding", PADDINGS), ("optimizer", OPTIMIZERS),
                              ("activation", ACTIVATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"layer {name} {getattr(self, name)!r}: expected one of {', '.join(allowed)}")
        for name in ("batch", "cin", "cout", "image", "kernel", "stride"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"layer {name} {v!r}: expected an integer >= 1")

    def out_size(self) -> int:
        """The output's height = width (TensorFlow's rule, as benchmarked)."""
        if self.padding == "same":
            return -(-self.image // self.stride)
        return -(-max(self.image - self.kernel + 1, 1) // self.stride)

    def flops(self) -> float:
        """Forward FLOPs (a multiply-add counts 2)."""
        return 2.0 * self.batch * self.out_size() ** 2 * self.kernel ** 2 * self.cin * self.cout

    def weights(self) -> float:
        return float(self.kernel ** 2 * self.cin * self.cout)

    def bytes_moved(self) -> float:
        """FP32 bytes of the forward pass's input, output and weights."""
        return 4.0 * (self.batch * self.image ** 2 * self.cin + self.batch * self.out_size() ** 2 * self.cout
                      + self.weights())


@dataclass(frozen=True)
class Gpu:
    """A GPU type's features: peak FP32 GFLOP/s and memory bandwidth GB/s (the model's inputs), CUDA
    cores and clock MHz (data only; 0: unknown)."""

    name: str
    peak_gflops: float
    bandwidth_gbs: float
    cores: int = 0
    clock_mhz: float = 0.0

    def __post_init__(self) -> None:
        for name in ("peak_gflops", "bandwidth_gbs"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"gpu {self.name!r}: {name} {v!r}: expected a number > 0")


@dataclass(frozen=True)
class Sample:
    """One benchmark row: ``seconds`` for one step of ``layer`` on ``gpu``."""

    layer: Layer
    gpu: Gpu
    seconds: float


Design = Callable[[Layer, Gpu], list[float]]


@dataclass(frozen=True)
class Model:
    """Fitted coefficients per layer kind, in the order of ``design``'s row (``features`` by default;
    another design is for comparing terms, as ``benchmarks/crosshw.py`` does)."""

    coef: dict[str, tuple[float, ...]]
    design: Design

    def layer_time(self, layer: Layer, gpu: Gpu) -> float:
        """Predicted seconds for one step of ``layer`` on ``gpu``."""
        x = self.design(layer, gpu)
        return math.exp(sum(c * v for c, v in zip(self.coef[layer.kind], x)))


def optimizer_kind(name: str | None) -> str:
    """A PyTorch optimizer class name (any case; None: no optimizer, forward only) -> ``OPTIMIZERS``.
    SGD with momentum is "momentum" only if the caller says so; an optimizer the benchmark did not
    measure counts as Adam (two state tensors per weight, the commonest cost profile)."""
    if name is None:
        return "none"
    return _TORCH_OPTIMIZERS.get(name.lower(), "adam")


def activation_kind(name: str | None) -> str:
    """A PyTorch activation class name (any case; None: none) -> ``ACTIVATIONS``; an activation the
    benchmark did not measure (GELU, SiLU, ...) counts as ReLU (one elementwise pass)."""
    if name is None:
        return "none"
    return _TORCH_ACTIVATIONS.get(name.lower(), "relu")


def features(layer: Layer, gpu: Gpu) -> list[float]:
    """The design row of one (layer, GPU) pair; the model is linear in it on log(seconds)."""
    lf = math.log(layer.flops())
    lb = math.log(layer.bytes_moved())
    lw = math.log(layer.weights())
    train = 0.0 if layer.optimizer == "none" else 1.0
    lp = math.log(gpu.peak_gflops)
    lbw = math.log(gpu.bandwidth_gbs)
    row = [1.0, lf, lb, lw, lf * lf, lb * lb, lf * lb, train, train * lf, train * lw]
    row += [1.0 if layer.optimizer == o else 0.0 for o in _OPT_TERMS]
    row += [1.0 if layer.activation == a else 0.0 for a in _ACT_TERMS]
    # the shape: which of batch, channels, pixels and kernel the work comes from changes how well a GPU
    # kernel fills the device (a dense layer has pixels = kernel = 1: those terms are 0)
    shape = [math.log(layer.batch), math.log(layer.cin), math.log(layer.cout), 2.0 * math.log(layer.out_size()),
             2.0 * math.log(layer.kernel)]
    row += shape
    row += [shape[i] * shape[j] for i in range(len(shape)) for j in range(i, len(shape))]
    row += [1.0 if layer.padding == "valid" else 0.0, math.log(layer.stride)]
    row += [lp, lbw, lf * lp, lb * lbw]  # the GPU: last, so that a comparison can drop them
    return row


def fit(samples: Iterable[Sample], design: Design | None = None) -> Model:
    """Least squares on log(seconds) of ``design``'s row (default ``features``), one coefficient vector
    per layer kind present in ``samples``. Raises ValueError when a kind has fewer samples than
    coefficients."""
    design = design or features
    by_kind: dict[str, tuple[list[list[float]], list[float]]] = {}
    for s in samples:
        xs, ys = by_kind.setdefault(s.layer.kind, ([], []))
        xs.append(design(s.layer, s.gpu))
        ys.append(math.log(s.seconds))
    coef = {}
    for kind, (xs, ys) in by_kind.items():
        if len(xs) < len(xs[0]):
            raise ValueError(f"{kind}: {len(xs)} samples cannot fit {len(xs[0])} coefficients")
        coef[kind] = tuple(float(v) for v in _solve(np.asarray(xs), np.asarray(ys)))
    return Model(coef, design)


def _solve(x: np.ndarray, y: np.ndarray, chunk: int = 64) -> np.ndarray:
    """Least squares ``x @ w ~ y`` (minimum norm where columns are collinear, as log FLOPs is with the
    shape's logs), through the normal equations of the column-scaled ``x`` summed in blocks of ``chunk``
    rows: each product is too small for a multithreaded BLAS to start threads, whose spinning cost
    seconds of CPU on a loaded machine for a fit that needs tens of milliseconds."""
    scale = np.sqrt((x * x).mean(axis=0))
    scale[scale == 0] = 1.0
    xs = x / scale
    a = np.zeros((xs.shape[1], xs.shape[1]))
    b = np.zeros(xs.shape[1])
    for i in range(0, len(xs), chunk):
        a += xs[i:i + chunk].T @ xs[i:i + chunk]
        b += xs[i:i + chunk].T @ y[i:i + chunk]
    return np.linalg.lstsq(a, b, rcond=None)[0] / scale


def _data(name: str) -> bytes:
    return resources.files("cluster.predict").joinpath("data", name).read_bytes()


@lru_cache(maxsize=1)
def gpus() -> dict[str, Gpu]:
    """The benchmarked GPU types by name (V100, P100, 1080Ti, M60, K80, K40)."""
    table = json.loads(_data(GPU_DATA))["gpus"]
    return {name: Gpu(name, **spec) for name, spec in table.items()}


@lru_cache(maxsize=1)
def samples() -> tuple[Sample, ...]:
    """The package's benchmark table (see the module's docstring)."""
    return parse_table(_data(DATA))


def parse_table(data: bytes) -> tuple[Sample, ...]:
    """Rows of a gzipped table as ``benchmarks/_crosshw_data.py`` writes it, on the package's GPUs."""
    known = gpus()
    out = []
    text = gzip.decompress(data).decode()
    for r in csv.DictReader(io.StringIO(text)):
        layer = Layer(r["layer"], int(r["batch"]), int(r["cin"]), int(r["cout"]), int(r["image"]), int(r["kernel"]),
                      int(r["stride"]), r["padding"], r["optimizer"], r["activation"])
        out.append(Sample(layer, known[r["gpu"]], float(r["time_ms"]) / 1000.0))
    return tuple(out)


@lru_cache(maxsize=1)
def default_model() -> Model:
    """The model fitted on all of the package's benchmark rows (computed once per process)."""
    return fit(samples())


def predict_layer_time(layer: Layer, gpu: Gpu, model: Model | None = None) -> float:
    """Predicted seconds for one training step (forward only if ``layer.optimizer`` is "none") of
    ``layer`` on ``gpu``."""
    return (model or default_model()).layer_time(layer, gpu)


def predict_step_time(layers: Sequence[Layer], gpu: Gpu, model: Model | None = None) -> float:
    """Predicted seconds for one step of a model made of ``layers`` (their sum; other layers and the
    framework's own time are not counted: use ``carry`` to add the measured level)."""
    if not layers:
        raise ValueError("no dense or convolutional layers to predict from")
    m = model or default_model()
    return sum(m.layer_time(layer, gpu) for layer in layers)


def carry(step_time_on_a: float, layers: Sequence[Layer], gpu_a: Gpu, gpu_b: Gpu, model: Model | None = None) -> float:
    """The time per iteration on ``gpu_b`` of a job measured at ``step_time_on_a`` seconds per
    iteration on ``gpu_a``: the measurement times the ratio of the model's predictions (the whole step;
    ``cluster.predict.carry.carry`` keeps the host part). Same GPU features: the measurement unchanged."""
    if not (math.isfinite(step_time_on_a) and step_time_on_a > 0):
        raise ValueError(f"step time {step_time_on_a!r}: expected seconds > 0")
    if (gpu_a.peak_gflops, gpu_a.bandwidth_gbs) == (gpu_b.peak_gflops, gpu_b.bandwidth_gbs):
        return step_time_on_a
    return step_time_on_a * predict_step_time(layers, gpu_b, model) / predict_step_time(layers, gpu_a, model)


@dataclass(frozen=True)
class HeldOut:
    """The errors on one GPU of a model fitted on the other GPUs, for one layer kind. Errors are
    |predicted - measured| / measured, in percent."""

    kind: str
    gpu: str
    n: int
    median_pct: float
    mean_pct: float
    within_2x: float  # share of layers predicted within a factor 2 (0..1)
    under: float  # share predicted below the measurement (0..1)
    rms_ms: float  # root mean square of predicted - measured, milliseconds


def leave_one_gpu_out(rows: Sequence[Sample], design: Design | None = None) -> list[HeldOut]:
    """For each layer kind and each GPU in ``rows``: fit on the other GPUs (with ``design``, default
    ``features``), predict this one's rows. The same least squares as ``fit``, on design rows built once."""
    design = design or features
    out = []
    names = sorted({s.gpu.name for s in rows})
    for kind in KINDS:
        of_kind = [s for s in rows if s.layer.kind == kind]
        if not of_kind:
            continue
        x = np.asarray([design(s.layer, s.gpu) for s in of_kind])
        y = np.asarray([s.seconds for s in of_kind])
        gpu = np.asarray([s.gpu.name for s in of_kind])
        for name in names:
            test = gpu == name
            if not test.any():
                continue
            w = _solve(x[~test], np.log(y[~test]))
            pred, meas = np.exp(x[test] @ w), y[test]
            errs = np.abs(pred - meas) / meas * 100.0
            ratio = pred / meas
            out.append(HeldOut(kind, name, int(test.sum()), float(np.median(errs)), float(errs.mean()),
                               float(((ratio >= 0.5) & (ratio <= 2.0)).mean()), float((ratio < 1.0).mean()),
                               float(np.sqrt(((pred - meas) ** 2).mean())) * 1000.0))
    return out
