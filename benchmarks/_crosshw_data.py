"""Regenerates ``cluster/predict/data/justus2018_layers.csv.gz`` (not a benchmark itself).

The source is the per-layer benchmark data of Justus, Brennan, Bonner and McGough, "Predicting the
Computational Cost of Deep Learning Models", IEEE BigData 2018 (arXiv:1811.11880), published in the
repository https://github.com/CDECatapult/ml-performance-prediction (Apache License 2.0; this table is a
derived, reduced subset of it, redistributed under that license with this attribution; see
``cluster/predict/data/NOTICE``).

What it reads: the raw benchmark frames ``prediction_model/data/raw_data/<gpu>/<n>/benchmark_{dense,
convolution}__<date>.pkl`` of the six GPUs (V100, P100, GTX 1080 Ti, M60, K80, K40). The merged per-GPU
frames beside them are not used: the V100's convolution frame is missing from the stored snapshot,
and the raw frames are the same rows before one-hot encoding. The frames are Python 2 pandas pickles;
pandas (not a dependency of colocate) reads them here, with an unpickler that loads only pandas and
numpy objects.

What it writes: for each (GPU, layer type), ``--rows`` rows (default 2000) drawn without replacement with
a fixed seed from the rows with batch size <= 32 (the range every GPU covers, and the paper's own cut
for its leave-one-GPU-out convolution data); columns ``gpu, layer, batch, cin, cout, image, kernel,
stride, padding, optimizer, activation, time_ms`` (``time_ms``: the median of the benchmark's timed
runs, one forward pass, or forward + backward + the optimizer's update where ``optimizer`` is not
``none``). A dense layer is written with ``image = kernel = stride = 1``.

Usage: ``python benchmarks/_crosshw_data.py GIT_DIR`` where ``GIT_DIR`` is a clone (bare or not) of
the repository at commit e649f32 or later.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cluster" / "predict" / "data" / "justus2018_layers.csv.gz"
RAW = re.compile(r"^prediction_model/data/raw_data/(\w+?)/\d+/benchmark_(dense|convolution)__\d+\.pkl$")
GPU_NAMES = {"1080ti": "1080Ti", "k80": "K80", "K40": "K40", "M60": "M60", "P100": "P100", "V100": "V100"}
OPTIMIZERS = ("none", "sgd", "adadelta", "adagrad", "momentum", "adam", "rmsprop")  # the benchmark's codes 0..6
ACTIVATIONS = ("none", "relu", "tanh", "sigmoid")  # codes 0..3
ALLOWED_MODULES = ("numpy", "pandas")
ALLOWED_GLOBALS = (("__builtin__", "slice"), ("builtins", "slice"))
COLUMNS = ("gpu", "layer", "batch", "cin", "cout", "image", "kernel", "stride", "padding", "optimizer",
           "activation", "time_ms")


def git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True).stdout


def read_frames(git_dir: str):
    import pandas as pd
    from pandas.compat import pickle_compat

    class Restricted(pickle_compat.Unpickler):
        """Loads only numpy and pandas objects (a pickle can name any callable: see the pickle module's
        "Restricting Globals")."""

        def find_class(self, module, name):
            if module.split(".")[0] not in ALLOWED_MODULES and (module, name) not in ALLOWED_GLOBALS:
                raise SystemExit(f"refusing a pickle that names {module}.{name}")
            return super().find_class(module, name)

    frames = []
    for path in git(git_dir, "ls-tree", "-r", "--name-only", "HEAD").decode().split("\n"):
        m = RAW.match(path)
        if not m:
            continue
        blob = git(git_dir, "show", f"HEAD:{path}")
        df = pd.DataFrame(Restricted(io.BytesIO(blob), encoding="latin1").load())
        df["gpu_name"] = GPU_NAMES[m.group(1)]
        df["layer"] = "dense" if m.group(2) == "dense" else "conv"
        frames.append(df)
    if not frames:
        raise SystemExit(f"{git_dir}: no raw benchmark frames under prediction_model/data/raw_data/")
    return pd.concat(frames, ignore_index=True)


def rows_of(df, layer: str):
    if layer == "dense":
        for r in df.itertuples():
            yield (r.gpu_name, "dense", int(r.batchsize), int(r.dim_input), int(r.dim_output), 1, 1, 1, "same",
                   OPTIMIZERS[int(r.optimizer)], ACTIVATIONS[int(r.activation_fct)], f"{r.timeUsed_median:.5g}")
    else:
        for r in df.itertuples():
            yield (r.gpu_name, "conv", int(r.batchsize), int(r.channels_in), int(r.channels_out), int(r.matsize),
                   int(r.kernelsize), int(r.strides), "same" if int(r.padding) == 1 else "valid",
                   OPTIMIZERS[int(r.optimizer)], ACTIVATIONS[int(r.activation_fct)], f"{r.timeUsed_median:.5g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("git_dir", help="a clone of CDECatapult/ml-performance-prediction")
    ap.add_argument("--rows", type=int, default=2000, help="rows per (GPU, layer type) (default 2000)")
    ap.add_argument("--seed", type=int, default=2018)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    df = read_frames(args.git_dir)
    df = df[df.batchsize <= 32]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    counts = {}
    for (gpu, layer), part in sorted(df.groupby(["gpu_name", "layer"])):
        part = part.sample(n=min(args.rows, len(part)), random_state=args.seed).sort_index()
        counts[(gpu, layer)] = len(part)
        w.writerows(rows_of(part, layer))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # no name, mtime=0: the same input gives the same bytes, wherever it is written
    with open(args.out, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(buf.getvalue().encode())
    for key, n in sorted(counts.items()):
        print(f"{key[0]:7s} {key[1]:5s} {n} rows")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
