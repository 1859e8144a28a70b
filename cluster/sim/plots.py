"""PNG plots of simulated policies (matplotlib, Agg canvas; no global backend change).

* ``cdf.png``: CDFs of job completion time and of queueing delay, one line per policy (log
  time axis; delays under a second are drawn at 1 s, so the curve starts at the share of jobs
  that did not wait); with opportunistic jobs, guaranteed solid and opportunistic dashed.
* ``timeline.png``: pending jobs, GPU allocation and modelled GPU utilization over time.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from colocate.base.vocab import JobClass

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
_TICKS = [(1, "1 s"), (60, "1 min"), (600, "10 min"), (3600, "1 h"), (6 * 3600, "6 h"), (86400, "1 d"),
          (7 * 86400, "1 wk"), (30 * 86400, "30 d"), (365 * 86400, "1 y")]


def _time_axis(ax, lo: float, hi: float) -> None:
    ax.set_xscale("log")
    ticks = [(v, s) for v, s in _TICKS if lo <= v <= hi * 1.5] or _TICKS[:4]
    ax.set_xticks([v for v, _ in ticks])
    ax.set_xticklabels([s for _, s in ticks])
    ax.xaxis.set_minor_locator(LogLocator(numticks=0))
    ax.set_xlim(lo, hi * 1.2)


def _cdf(ax, values: list[float], color, style: str, label: str, floor: float = 1.0) -> float:
    v = sorted(max(x, floor) for x in values)
    n = len(v)
    if not n:
        return floor
    ys = [(k + 1) / n for k in range(n)]
    ax.step(v, ys, where="post", color=color, linestyle=style, linewidth=1.8, label=label)
    return v[-1]


def plot_cdfs(results: list[tuple[str, list[dict]]], path: Path, title: str = "") -> Path:
    """``results``: (policy, job rows) per policy."""
    fig = Figure(figsize=(13, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    classes = sorted({r["class"] for _, rows in results for r in rows})
    split = JobClass.OPPORTUNISTIC in classes
    hi = [1.0, 1.0]
    for n, (policy, rows) in enumerate(results):
        color = COLORS[n % len(COLORS)]
        groups = [(k, "-" if k == JobClass.GUARANTEED else "--") for k in classes] if split else [(None, "-")]
        for klass, style in groups:
            sel = [r for r in rows if klass is None or r["class"] == klass]
            suffix = f" ({klass})" if klass else ""
            jct = [r["jct_s"] for r in sel if r["jct_s"] is not None]
            q = [r["queue_delay_s"] for r in sel if r["queue_delay_s"] is not None]
            hi[0] = max(hi[0], _cdf(axes[0], jct, color, style, policy + suffix))
            hi[1] = max(hi[1], _cdf(axes[1], q, color, style, policy + suffix))
    for ax, h, what in ((axes[0], hi[0], "job completion time"), (axes[1], hi[1], "queueing delay (first start - submit)")):
        _time_axis(ax, 1.0, h)
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(what)
        ax.set_ylabel("share of jobs")
        ax.grid(True, which="major", alpha=0.3)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0%}"))
    axes[1].set_title("delays under 1 s drawn at 1 s", fontsize=9, loc="left", color="#555")
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:  # none when no job finished
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=12)
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.035 + 0.035 * legend_rows, 1, 1))
    fig.savefig(path)
    return path


def plot_timeline(results: list[tuple[str, list[tuple]]], capacity: int, path: Path, title: str = "") -> Path:
    """``results``: (policy, samples) with samples (t, pending, allocated GPUs, busy GPUs, running)."""
    fig = Figure(figsize=(13, 8.3), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    for n, (policy, samples) in enumerate(results):
        if not samples:
            continue
        color = COLORS[n % len(COLORS)]
        days = [s[0] / 86400 for s in samples]
        axes[0].step(days, [s[1] for s in samples], where="post", color=color, linewidth=1.2, label=policy)
        axes[1].step(days, [s[2] / capacity if capacity else 0 for s in samples], where="post", color=color,
                     linewidth=1.0, label=policy)
        axes[2].step(days, [max(s[3], 0.0) / capacity if capacity else 0 for s in samples], where="post", color=color,
                     linewidth=1.0, label=policy)
    axes[0].set_ylabel("pending jobs")
    axes[0].set_yscale("symlog", linthresh=10)
    axes[1].set_ylabel("GPUs allocated")
    axes[2].set_ylabel("GPU utilization\n(modelled)")
    for ax in axes[1:]:
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0%}"))
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=9, ncol=min(6, len(results)), frameon=False)
    axes[2].set_xlabel("simulated time (days)")
    end = max((s[-1][0] for _, s in results if s), default=0.0) / 86400
    if end > 0:
        axes[2].set_xlim(0, end * 1.01)
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path)
    return path
