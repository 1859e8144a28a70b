"""What a job teaches the cluster at its first mini-batch: its model's and its GPU's features.

``FeatureReader`` (one per ``Runtime``, training thread only): ``start(args)`` at the job's first device work
registers a global module forward hook and a global optimizer step pre-hook; ``finish()`` at the first boundary
removes both and returns the ``colocate.protocol.Features`` record (``features_dict`` gives it as plain JSON
data). Between the two, every module call runs the forward hook (torch's slow path for module calls, for this
one mini-batch only); after ``finish`` nothing of this module runs again. ``note_loader(loader)`` is called by
``torch_hooks.hooks`` each time a DataLoader starts an epoch (``__iter__``), until the features are read.

What is read (units: FLOPs are floating-point operations, multiply-add = 2; sizes are elements):

* layers: every module that ran, by class name (``layer_counts``, containers excluded), and the layers whose
  FLOPs are counted, grouped by kind and shape (``LayerGroup``): Linear, ConvNd/ConvTransposeNd,
  RNN/LSTM/GRU, MultiheadAttention (from their sizes and the observed input shapes), plus Embedding and the
  normalisation layers (0 FLOPs counted). Functional calls outside modules (``F.linear``, ``torch.matmul``,
  ``scaled_dot_product_attention`` in a custom block) are not seen: the estimate is then low;
* parameters: distinct parameters of the modules that ran and of the optimizers that stepped;
* batch size: the training DataLoader's ``batch_size``, else dim 0 of the first module's first tensor input;
* optimizer(s) that stepped, or that ``GradScaler.step`` was given (a skipped step); the dtype holding most
  parameters; the autocast dtype in force, if any;
* hardware: ``colocate.gpus.nvml.hardware`` and CUDA's SM count on CUDA, ``colocate.gpus.sim.declared``
  on a simulated GPU;
* the total: ``COLOCATE_ITERATIONS``, else ``len(DataLoader) x COLOCATE_EPOCHS``.

Cost: one Python hook call per module call of the first mini-batch, plus the grouping at ``finish``; the
seconds spent are ``Features.read_s`` (``benchmarks/features.py`` measures it against the step).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from colocate import protocol as P
from colocate.base.vocab import DeviceKind

_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
          "InstanceNorm3d", "RMSNorm")
_GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}


class FeatureReader:
    """Reads the features of one job's first mini-batch (see the module docstring). Training thread only."""

    def __init__(self, env, device, clock=time.perf_counter):
        self.env, self.device, self._clock = env, device, clock
        self._handles: list = []
        self._spent = 0.0
        self._modules: dict[int, Any] = {}  # id -> module that ran (kept alive until finish)
        self._flops: dict[int, float] = {}  # id -> forward FLOPs over its calls
        self._shape: dict[int, dict[str, int]] = {}  # id -> observed dims (seq, out_size) of its first call
        self._optimizers: dict[int, Any] = {}
        self._autocast = ""
        self._first_batch: int | None = None
        self.loader: tuple[int | None, int | None] | None = None  # (len, batch_size) of the last loader iterated
        self.started = False

    # ---- training thread -------------------------------------------------------
    def start(self, args: tuple = ()) -> None:
        """The job's first device work begins (``args``: that first module call's positional arguments)."""
        if self.started:
            return
        t0 = self._clock()
        self.started = True
        import torch
        from torch.nn.modules.module import register_module_forward_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._first_batch = _first_dim(args)
        self._autocast_type = "cuda" if self.device.kind == DeviceKind.CUDA else "cpu"
        self._torch = torch
        self._handles = [register_module_forward_hook(self._on_forward),
                         register_optimizer_step_pre_hook(self._on_step)]
        self._spent += self._clock() - t0

    def note_loader(self, loader) -> None:
        """A DataLoader starts an epoch: it is the training loader if it is the last one before ``finish``."""
        try:
            n: int | None = len(loader)
        except TypeError:  # an IterableDataset without a length
            n = None
        bs = getattr(loader, "batch_size", None)
        self.loader = (n, bs if isinstance(bs, int) and bs > 0 else None)

    def finish(self) -> P.Features | None:
        """The first boundary: stop watching and build the record (None if ``start`` never ran)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if not self.started:
            return None
        t0 = self._clock()
        try:
            model = self._model()
            hardware = P.HardwareFeatures(**hardware_features(self.env, self.device))
        finally:
            self._modules.clear()
            self._optimizers.clear()
        n, _ = self.loader or (None, None)
        iterations, epochs = getattr(self.env, "iterations", None), getattr(self.env, "epochs", None)
        total = iterations if iterations is not None else (n * epochs if n is not None and epochs is not None else None)
        self._spent += self._clock() - t0
        return P.Features(model=model, hardware=hardware, loader_batches=n, iterations_hint=iterations,
                          epochs_hint=epochs, total_iterations=total, read_s=self._spent)

    # ---- hooks (first mini-batch only) -----------------------------------------------
    def _on_forward(self, module, args, output) -> None:
        t0 = self._clock()
        key = id(module)
        if key not in self._modules:
            self._modules[key] = module
        try:
            flops, dims = layer_flops(module, args, output)
        except Exception:  # an input this estimate does not understand: the layer counts, its FLOPs do not
            flops, dims = 0.0, {}
        if flops:
            self._flops[key] = self._flops.get(key, 0.0) + flops
        if dims and key not in self._shape:
            self._shape[key] = dims
        if not self._autocast:
            torch = self._torch
            if torch.is_autocast_enabled(self._autocast_type):
                self._autocast = str(torch.get_autocast_dtype(self._autocast_type)).replace("torch.", "")
        self._spent += self._clock() - t0

    def _on_step(self, optimizer, args, kwargs) -> None:
        self._optimizers.setdefault(id(optimizer), optimizer)

    def note_optimizer(self, optimizer) -> None:
        """An optimizer handed to ``GradScaler.step`` before the first boundary: the job's, whether or not the
        scaler lets it step (AMP skips the first steps while it finds its scale)."""
        self._optimizers.setdefault(id(optimizer), optimizer)

    # ---- building the record ------------------------------------------------------------
    def _model(self) -> P.ModelFeatures:
        modules = list(self._modules.values())
        params: dict[int, Any] = {}
        for m in modules:
            recurse = type(m).__name__ == "MultiheadAttention"  # its out_proj is used, never called
            for p in m.parameters(recurse=recurse):
                params.setdefault(id(p), p)
        for opt in self._optimizers.values():
            for group in opt.param_groups:
                for p in group.get("params", ()):
                    params.setdefault(id(p), p)
        total = sum(p.numel() for p in params.values())
        trainable = sum(p.numel() for p in params.values() if p.requires_grad)
        by_dtype: Counter = Counter()
        for p in params.values():
            by_dtype[str(p.dtype).replace("torch.", "")] += p.numel()
        counts: Counter = Counter()
        groups: dict[tuple, list] = {}
        for key, m in self._modules.items():
            kind = type(m).__name__
            shape = layer_dims(m)
            if shape is None and next(m.children(), None) is not None:
                continue  # a container
            counts[kind[:64]] += 1
            if shape is None:
                continue
            dims = {**shape, **self._shape.get(key, {})}
            g = groups.setdefault((kind, tuple(sorted(dims.items()))), [0, 0, 0.0])
            g[0] += 1
            g[1] += sum(p.numel() for p in m.parameters(recurse=kind == "MultiheadAttention"))
            g[2] += self._flops.get(key, 0.0)
        forward = float(sum(self._flops.values()))
        layers = sorted(groups.items(), key=lambda kv: (-kv[1][2], kv[0]))[: P.MAX_LAYER_GROUPS]
        loader_bs = self.loader[1] if self.loader else None
        return P.ModelFeatures(
            params=total, trainable_params=trainable,
            layers=tuple(P.LayerGroup(kind=k[:64], count=c, params=n, flops=f, dims=d)
                         for (k, d), (c, n, f) in layers),
            layer_counts=tuple(counts.most_common(P.MAX_LAYER_KINDS)), forward_flops=forward,
            flops_per_iteration=3.0 * forward, batch_size=loader_bs if loader_bs is not None else self._first_batch,
            optimizers=tuple(sorted({type(o).__name__[:64] for o in self._optimizers.values()}))[:16],
            param_dtype=by_dtype.most_common(1)[0][0][:32] if by_dtype else "", autocast_dtype=self._autocast[:32])


def features_dict(features: P.Features) -> dict:
    """``features`` as plain JSON data (the wire map)."""
    return P.record_map(features)


# ---- per-layer sizes and FLOPs (no state) ---------------------------------------------------


def layer_dims(m) -> dict[str, int] | None:
    """The shape-defining sizes of a layer the reader groups (``LayerGroup.dims``), None for any other module."""
    kind = type(m).__name__
    if kind in ("Linear", "NonDynamicallyQuantizableLinear", "LazyLinear"):
        return {"in": int(m.in_features), "out": int(m.out_features)}
    if kind.startswith(("Conv", "LazyConv")) and hasattr(m, "kernel_size"):
        return {"in": int(m.in_channels), "out": int(m.out_channels), "kernel": math.prod(m.kernel_size),
                "stride": math.prod(m.stride), "groups": int(m.groups)}
    if kind in _GATES:
        return {"in": int(m.input_size), "hidden": int(m.hidden_size), "layers": int(m.num_layers),
                "directions": 2 if m.bidirectional else 1}
    if kind == "MultiheadAttention":
        return {"embed": int(m.embed_dim), "heads": int(m.num_heads)}
    if kind in ("Embedding", "EmbeddingBag"):
        return {"num": int(m.num_embeddings), "dim": int(m.embedding_dim)}
    if kind in _NORMS:
        shape = getattr(m, "normalized_shape", None)
        n = math.prod(shape) if shape else getattr(m, "num_features", None) or getattr(m, "num_channels", 0)
        return {"features": int(n or 0)}
    return None


def layer_flops(m, args: tuple, output) -> tuple[float, dict[str, int]]:
    """Forward FLOPs of one call of ``m`` on ``args`` giving ``output`` (0 for kinds not counted), and the
    observed sizes worth keeping (``seq``, ``out_size``)."""
    kind = type(m).__name__
    if kind in ("Linear", "NonDynamicallyQuantizableLinear", "LazyLinear"):
        return 2.0 * output.numel() * m.in_features, {}
    if kind.startswith(("Conv", "LazyConv")) and hasattr(m, "kernel_size"):
        k = math.prod(m.kernel_size)
        if "Transpose" in kind:
            x = args[0]
            return 2.0 * x.numel() * (m.out_channels // m.groups) * k, {}
        per_channel = output.numel() // max(1, output.shape[0] * m.out_channels) if output.dim() > 1 else 0
        return 2.0 * output.numel() * (m.in_channels // m.groups) * k, {"out_size": int(per_channel)}
    if kind in _GATES:
        return _rnn_flops(m, args[0])
    if kind == "MultiheadAttention":
        return _mha_flops(m, args)
    return 0.0, {}


def _rnn_flops(m, x) -> tuple[float, dict[str, int]]:
    data = getattr(x, "data", x)  # a PackedSequence: its data is (tokens, features)
    if hasattr(x, "batch_sizes"):
        tokens, seq = int(data.shape[0]), len(x.batch_sizes)
    elif data.dim() == 2:  # unbatched (L, H_in)
        tokens, seq = int(data.shape[0]), int(data.shape[0])
    else:
        seq = int(data.shape[1] if m.batch_first else data.shape[0])
        tokens = int(data.shape[0] * data.shape[1])
    gates, h, dirs = _GATES[type(m).__name__], m.hidden_size, 2 if m.bidirectional else 1
    flops = 0.0
    for layer in range(m.num_layers):
        inp = m.input_size if layer == 0 else h * dirs
        flops += dirs * 2.0 * gates * h * (inp + h) * tokens
    return flops, {"seq": seq}


def _mha_flops(m, args) -> tuple[float, dict[str, int]]:
    q = args[0]
    k = args[1] if len(args) > 1 else q
    e = m.embed_dim
    if q.dim() == 2:  # unbatched (L, E)
        lq, lk, n = q.shape[0], k.shape[0], 1
    elif m.batch_first:
        n, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    else:
        lq, n, lk = q.shape[0], q.shape[1], k.shape[0]
    proj = 2.0 * e * (e * lq + m.kdim * lk + m.vdim * lk + e * lq) * n
    attention = 2.0 * 2.0 * lq * lk * e * n  # Q K^T and the weights times V
    return proj + attention, {"seq": int(lq)}


def _first_dim(args: tuple) -> int | None:
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None


def hardware_features(env, device) -> dict:
    """``HardwareFeatures`` fields of the job's GPU: NVML (and CUDA's SM count) on CUDA, the declared spec of a
    simulated GPU otherwise."""
    gpus = max(1, int(getattr(env, "world_size", None) or 1))
    if device.kind == DeviceKind.CUDA:
        from colocate.gpus import nvml

        hw = nvml.hardware(env.gpu)
        sm = 0
        try:
            import torch

            sm = int(torch.cuda.get_device_properties(getattr(device, "cuda_index", 0)).multi_processor_count)
        except Exception:  # CUDA not started or not there: NVML's figures stand alone
            sm = 0
        hw["mem_total"] = hw["mem_total"] or int(getattr(device, "mem_total", 0) or 0)
        return {"kind": DeviceKind.CUDA, "sm_count": sm, "gpus": gpus, **hw}
    from colocate.gpus.sim import core_of, declared

    return {"kind": DeviceKind.SIM, "gpus": gpus,
            **declared(env.sim_gpu_mem, core_of(env), getattr(device, "type_name", ""), getattr(device, "speed", 1.0))}
