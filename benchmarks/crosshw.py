"""Cross-hardware model: leave-one-GPU-out on Justus et al. 2018's per-layer benchmarks (six GPUs).

For each layer type (dense, conv) and each of the six GPUs, ``cluster.predict.crosshw`` is fitted on the
other five GPUs' rows of the package's table (2,000 rows per GPU and type) and predicts the held-out
GPU's rows: median and mean absolute percentage error, share within 2x, share under-predicted, RMS in
ms. Beside the shipped model, three other choices of GPU terms: none (the workload alone: what a
predictor blind to hardware gets), peak FLOP/s and bandwidth without their interactions with the work,
and the shipped terms plus log clock and log cores (all four of Justus et al.'s GPU features).

The reference figures are the authors' own, from the notebooks that accompany the paper in
CDECatapult/ml-performance-prediction (commit e649f32): their MLP trained on five GPUs and tested on
all of the V100's convolution rows (``prediction_model/notebooks/prediction_all_but_one.ipynb``), and
their MLP and linear regression trained on all six GPUs, tested on a random 10% of the rows
(``prediction_model/notebooks/model_compTime.ipynb``).

    python benchmarks/crosshw.py             # ~1 min of CPU; writes its section of RESULTS.md
    python benchmarks/crosshw.py --no-write
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

SECTION = "crosshw"
GPU_ORDER = ("V100", "P100", "1080Ti", "M60", "K80", "K40")
# (what, test set, mean APE %, RMS ms, source notebook) -- Justus et al.'s own outputs, conv layers only
PAPER = [
    ("MLP, trained on 5 GPUs", "all V100 conv rows (24,905)", 39.6, 3.65, "prediction_all_but_one.ipynb"),
    ("MLP, trained on all 6 GPUs", "random 10% of conv rows (13,021)", 10.9, 3.66, "model_compTime.ipynb"),
    ("linear regression, all 6 GPUs", "the same 10%", 399.9, 27.7, "model_compTime.ipynb"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(C.RESULTS), help="markdown file to update (default benchmarks/RESULTS.md)")
    p.add_argument("--no-write", action="store_true", help="print the tables only; leave RESULTS.md alone")
    p.add_argument("--table", type=Path, default=None,
                   help="also evaluate on this table, e.g. every row: `python benchmarks/_crosshw_data.py CLONE "
                        "--rows 1000000 --out /tmp/full.csv.gz`")
    return p.parse_args(argv)


def designs():
    from cluster.predict import crosshw

    def workload_only(layer, gpu):
        return crosshw.features(layer, gpu)[:-4]

    def no_interactions(layer, gpu):
        return crosshw.features(layer, gpu)[:-2]

    def with_clock_cores(layer, gpu):
        return crosshw.features(layer, gpu) + [math.log(gpu.clock_mhz), math.log(gpu.cores)]

    return [("shipped: peak, bandwidth, x work", crosshw.features), ("no GPU terms", workload_only),
            ("peak, bandwidth, no interactions", no_interactions), ("shipped + clock, cores", with_clock_cores)]


def main(argv=None) -> int:
    args = parse_args(argv)
    from cluster.predict import crosshw

    load_before = os.getloadavg()
    t0 = time.process_time()
    rows = crosshw.samples()
    results = {name: crosshw.leave_one_gpu_out(rows, design) for name, design in designs()}
    # the same split as the authors' "all GPUs" figure: every GPU in the fit, a tenth of the rows held out
    conv = [s for s in rows if s.layer.kind == "conv"]
    tenth = crosshw.fit(s for i, s in enumerate(conv) if i % 10)
    test = [(tenth.layer_time(s.layer, s.gpu), s.seconds) for i, s in enumerate(conv) if i % 10 == 0]
    all_mean = sum(abs(p - m) / m for p, m in test) / len(test) * 100
    all_rms = math.sqrt(sum((p - m) ** 2 for p, m in test) / len(test)) * 1000
    full, full_v100 = [], None
    if args.table is not None:
        try:
            big = crosshw.parse_table(args.table.read_bytes())
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--table {args.table}: {e}") from None
        big_by = {(h.kind, h.gpu): h for h in crosshw.leave_one_gpu_out(big)}
        full = [[k, g, f"{h.n:,}", f"{h.median_pct:.1f}%", f"{h.mean_pct:.1f}%", f"{h.within_2x:.1%}",
                 f"{h.under:.1%}", f"{h.rms_ms:.2f}"]
                for k in crosshw.KINDS for g in GPU_ORDER if (h := big_by.get((k, g))) is not None]
        full_v100 = big_by.get(("conv", "V100"))
    cpu_s = time.process_time() - t0
    load_after = os.getloadavg()

    shipped = results[designs()[0][0]]
    by = {(h.kind, h.gpu): h for h in shipped}
    detail_headers = ["layer", "held-out GPU", "rows", "median APE", "mean APE", "within 2x", "under", "RMS ms"]
    detail = [[k, g, str(by[k, g].n), f"{by[k, g].median_pct:.1f}%", f"{by[k, g].mean_pct:.1f}%",
               f"{by[k, g].within_2x:.1%}", f"{by[k, g].under:.1%}", f"{by[k, g].rms_ms:.2f}"]
              for k in crosshw.KINDS for g in GPU_ORDER]
    cmp_headers = ["GPU terms", "layer"] + list(GPU_ORDER) + ["mean of medians"]
    compare = []
    for name, res in results.items():
        m = {(h.kind, h.gpu): h for h in res}
        for k in crosshw.KINDS:
            meds = [m[k, g].median_pct for g in GPU_ORDER]
            compare.append([name, k] + [f"{v:.0f}%" for v in meds] + [f"{sum(meds) / len(meds):.1f}%"])
    v100 = by["conv", "V100"]
    paper_headers = ["model", "test set", "mean APE", "RMS ms", "source"]
    paper = [[w, t, f"{e:.1f}%", f"{r:.2f}", s] for w, t, e, r, s in PAPER]
    paper.append(["this model (log-linear), trained on 5 GPUs", "2,000 V100 conv rows", f"{v100.mean_pct:.1f}%",
                  f"{v100.rms_ms:.2f}", "this benchmark"])
    if full_v100 is not None:
        paper.append(["this model (log-linear), trained on 5 GPUs", f"all V100 conv rows ({full_v100.n:,})",
                      f"{full_v100.mean_pct:.1f}%", f"{full_v100.rms_ms:.2f}", "this benchmark, --table"])
    paper.append(["this model (log-linear), trained on all 6 GPUs", f"every 10th conv row ({len(test):,})",
                  f"{all_mean:.1f}%", f"{all_rms:.2f}", "this benchmark"])

    con = C.console()
    con.print(C.rich_table("leave-one-GPU-out, shipped model", detail_headers, detail, left=("layer", "held-out GPU")))
    if full:
        con.print(C.rich_table(f"leave-one-GPU-out on {args.table}", detail_headers, full,
                               left=("layer", "held-out GPU")))
    con.print(C.rich_table("median APE per held-out GPU, by choice of GPU terms", cmp_headers, compare,
                           left=("GPU terms", "layer")))
    con.print(C.rich_table("against Justus et al.'s own figures (conv)", paper_headers, paper,
                           left=("model", "test set", "source")))
    print(f"CPU {cpu_s:.1f} s; load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}")

    if not args.no_write:
        info = C.machine_info()
        body = "\n".join([
            "## Cross-hardware model: leave-one-GPU-out on Justus et al. 2018's per-layer data",
            "",
            *C.machine_lines(info),
            f"- command: `{C.invocation()}`; CPU {cpu_s:.1f} s; load average before/after: "
            f"{load_before[0]:.2f} / {load_after[0]:.2f} (the figures are errors, not timings: load does not move them)",
            "- data: `cluster/predict/data/justus2018_layers.csv.gz`, 2,000 rows per GPU and layer type (FP32, batch <= 32) "
            "of the raw benchmarks in CDECatapult/ml-performance-prediction (Apache-2.0); APE = |predicted - measured| / "
            "measured of one layer's step time.",
            "",
            C.markdown_table(detail_headers, detail),
            "",
            *([f"The same on every row of the source with batch <= 32 ({sum(int(r[2].replace(',', '')) for r in full):,} rows: "
               "`--table` made by `python benchmarks/_crosshw_data.py CLONE --rows 1000000 --out PATH`); the V100's "
               "conv rows are the authors' own leave-one-out test set:", "",
               C.markdown_table(detail_headers, full), ""] if full else []),
            "Median APE per held-out GPU, by the GPU terms the fit may use:",
            "",
            C.markdown_table(cmp_headers, compare),
            "",
            "Against the figures of Justus et al.'s own notebooks (conv layers; the paper's text was not reachable "
            "from this machine, so these are quoted from the notebooks' saved outputs):",
            "",
            C.markdown_table(paper_headers, paper),
        ])
        path = C.update_results(SECTION, body, Path(args.results))
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
