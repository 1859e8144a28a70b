"""What reading a job's features costs its first mini-batch (``torch_hooks.features``), on the examples' models.

For each example model (its script's defaults, one intra-op thread, on the CPU as a simulated GPU runs it), one
training step (forward, loss, backward, optimizer step) is timed plain and under a fresh ``FeatureReader``
(``start`` before the step, ``finish`` after it, as the runtime does at the first mini-batch), alternating, after
a warm-up. Printed per model: the median plain step, the median step under the reader, the median extra, and
the reader's own count of its time (``Features.read_s``), with the model's counted forward FLOPs.

    python benchmarks/features.py --repeats 30
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases():
    """(name, model, step()) for each example's model at its script's default sizes."""
    import torch
    from torch import nn

    cnn = _example("train_cnn")
    model = cnn.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = cnn.make_pool(32, pool_size=1)[0]
    yield "train_cnn (SmallCNN, batch 32)", model, _step(model, opt, nn.CrossEntropyLoss(), x, y)

    lm = _example("train_transformer")
    args = lm.parse_args([])
    model = lm.TinyLM(args.vocab, args.seq_len)
    opt = torch.optim.Adam(model.parameters())
    x, y = lm.make_pool(args.batch_size, args.seq_len, args.vocab, pool_size=1)[0]
    loss = nn.CrossEntropyLoss()
    yield (f"train_transformer (TinyLM, batch {args.batch_size})", model,
           _step(model, opt, lambda out, t: loss(out.reshape(-1, out.size(-1)), t.reshape(-1)), x, y))

    rec = _example("train_recsys")
    model = rec.DLRM()
    opt = torch.optim.Adam(model.parameters())
    dense, sparse, label = rec.make_pool(256, pool_size=1)[0]
    yield "train_recsys (DLRM, batch 256)", model, _step(model, opt, nn.BCEWithLogitsLoss(), (dense, sparse), label)


def _step(model, opt, loss_fn, x, y):
    inputs = x if isinstance(x, tuple) else (x,)

    def step():
        opt.zero_grad()
        loss_fn(model(*inputs), y).backward()
        opt.step()

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30, help="steps timed each way per model (alternating)")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)

    import torch

    from colocate.base.env import JobEnv
    from torch_hooks.features import FeatureReader

    torch.set_num_threads(1)
    env = JobEnv(device="sim")

    class Sim:
        kind, mem_total = "sim", env.sim_gpu_mem

    load = os.getloadavg()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} torch {torch.__version__}, 1 thread, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"| {'model':<38} | plain step ms | with reader ms | extra ms | read_s ms | forward GFLOP |")
    print(f"|{'-' * 40}|---------------|----------------|----------|-----------|---------------|")
    for name, _model, step in cases():
        for _ in range(args.warmup):
            step()
        plain, read, own = [], [], []
        flops = 0.0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            step()
            plain.append(time.perf_counter() - t0)
            reader = FeatureReader(env, Sim())
            t0 = time.perf_counter()
            reader.start(())
            step()
            features = reader.finish()
            read.append(time.perf_counter() - t0)
            assert features is not None
            own.append(features.read_s)
            flops = features.model.forward_flops
        a, b = statistics.median(plain), statistics.median(read)
        print(f"| {name:<38} | {a * 1e3:13.2f} | {b * 1e3:14.2f} | {(b - a) * 1e3:8.2f} | "
              f"{statistics.median(own) * 1e3:9.2f} | {flops / 1e9:13.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
