"""Where backfill on predictions loses against the oracle (issue 25): each of backfill's uses of a run-time
estimate given the true run time alone, the others left on the predictor.

Backfill uses an estimate three ways (``cluster/plugins/backfill.py``):
  * ``order``: the order in which the jobs behind a blocked head are tried (shortest first);
  * ``admit``: whether a job behind the head ends by the head's reserved start (its shadow time);
  * ``shadow``: when the running jobs end, which sets the shadow time.
A replay of this benchmark's ``backfill_hindsight`` plugin (the ``backfill`` plugin with a ``truth`` parameter)
answers one of them with the job's true run time (the trace's, before any slowdown the replay adds) and the other
two with the predictor, exactly as the default backfill does; FIFO (gang-binpack), the default backfill on the
predictor and the oracle (backfill on the true run times) are the reference rows, as in ``prediction.py``. A use
whose hindsight row lands near the oracle is where the predictor's error costs the most. The plugin exists only
here: it reads the true run times from the workload, which no scheduler has.

    python benchmarks/backfill_hindsight.py                     # Philly at 56x8: 6 replays, ~25 min on 2 cores
    python benchmarks/backfill_hindsight.py --sizes 64x8 --kinds predicted,order --no-write
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as C
import backfill_jitter as J
import prediction as B

from cluster.params import Param
from cluster.plugins.backfill import Backfill
from cluster.points import register

USES = ("none", "order", "admit", "shadow")
TRUE: dict[str, float] = {}  # job id -> true (solo) run time of the workload being replayed in this process


@register
class Hindsight(Backfill):
    """``backfill`` whose ``truth`` use of an estimate (``USES``) is the job's true run time from ``TRUE``."""

    name = "backfill_hindsight"
    PARAMS = {**Backfill.PARAMS, "truth": Param("none", "str", lambda v: v in USES, " | ".join(USES))}

    def backfill_order(self, req, jobs):
        out = super().backfill_order(req, jobs)  # fills the admission estimates from the predictor
        if self.p["order"] == "queue" or req.queue not in self._res:
            return out
        if self.p["truth"] == "order":
            return sorted(jobs, key=lambda j: TRUE.get(j.job_id, math.inf))
        if self.p["truth"] == "admit":
            for j in jobs:
                self._admit_est[j.job_id] = TRUE.get(j.job_id, math.inf)
        return out

    def _planned_run_s(self, job, start: float) -> float | None:
        if self.p["truth"] != "shadow":
            return super()._planned_run_s(job, start)
        return TRUE.get(job.job_id, math.inf)

    def _move(self, pid: str, end: float) -> None:  # progress and re-estimates would move the true ends
        if self.p["truth"] != "shadow":
            super()._move(pid, end)


def _learn(wl):
    TRUE.clear()
    TRUE.update((j.spec.job_id, math.inf if j.duration is None else j.duration) for j in wl.jobs)
    return wl


KINDS = {  # kind -> (row label, what it runs)
    "FIFO": ("FIFO (gang-binpack)", None),
    "predicted": ("backfill on the predictor (default)", "none"),
    "order": ("true run times for the order only", "order"),
    "admit": ("true run times for admission only", "admit"),
    "shadow": ("true run times for the running jobs' ends only", "shadow"),
    "oracle": ("oracle: true run times everywhere", None),
}


ABOUT = [  # the RESULTS section's explanation
    "Each middle row is the default backfill (shortest predicted first, admission at p50, running jobs' ends",
    "at p90 moved by progress reports) with one use of the run-time estimate answered by the job's true run",
    "time; share = (FIFO - row) / (FIFO - oracle). Replays are deterministic, but one changed decision moves",
    "every later one: a single replay's difference of a few percent is within that chaos",
    "(`backfill_jitter.py`).",
]


def replay(trace: str, cluster: str, kind: str) -> tuple[str, str, float, float]:
    """(cluster, kind, mean JCT in s, wall s) of one replay; runs in a worker process."""
    t0 = time.perf_counter()
    if kind in ("FIFO", "oracle"):
        _, _, _, jct, _ = J.replay(trace, cluster, 0, 0.0, kind)
    else:
        jct, _ = B.mean_jct(J.TRACES[trace], cluster, {"backfill_hindsight": {"truth": KINDS[kind][1]}},
                            prepare=_learn, backfill="backfill_hindsight")
    return cluster, kind, jct, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="philly", choices=sorted(J.TRACES), help="which trace (default philly)")
    ap.add_argument("--sizes", default="56x8", help="cluster shapes, comma-separated (default 56x8)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"replays to run, comma-separated (default all: "
                    f"{', '.join(KINDS)}); shares need FIFO and oracle")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="replays at once (default 2)")
    ap.add_argument("--section", type=C.section_name, help="the RESULTS.md section to write (default "
                    "backfill-hindsight-TRACE)")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds or args.workers < 1:
        print(f"backfill_hindsight: --kinds takes {', '.join(KINDS)} (got {', '.join(bad) or 'none'}); "
              "--workers >= 1", file=sys.stderr)
        return 2
    if not J.TRACES[args.trace].is_file():
        print(f"backfill_hindsight: {J.TRACES[args.trace]}: no such file", file=sys.stderr)
        return 2
    sizes = [s for s in args.sizes.split(",") if s]
    if (why := J.bad_sizes(sizes)) is not None:
        print(f"backfill_hindsight: --sizes: {why}", file=sys.stderr)
        return 2
    info = C.machine_info()
    con = C.console()
    t0 = time.perf_counter()
    tasks = [(args.trace, size, kind) for size in sizes for kind in kinds]
    jct = J.run_replays(replay, tasks, args.workers, con, t0)
    headers = ["cluster", "replay", "mean JCT", "share of oracle's gain"]
    rows = []
    for size in sizes:
        fifo, orac = jct.get((size, "FIFO")), jct.get((size, "oracle"))
        for kind in kinds:
            v = jct[(size, kind)]
            share = "" if fifo is None or orac is None else f"{B.share_of_gain(fifo, v, orac):.1%}"
            rows.append([size, KINDS[kind][0], f"{v / 3600:.2f} h", share])
    con.print(C.rich_table(f"{args.trace}: backfill with hindsight for one use of the estimate", headers, rows,
                           left=("cluster", "replay")))
    J.record(args, f"backfill-hindsight-{args.trace}", "Where backfill on predictions loses against the oracle: "
             "hindsight for one use of the estimate (issue 25)", info, t0, ABOUT, headers, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
