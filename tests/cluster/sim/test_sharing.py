"""``cluster.sim.sharing`` on hand-computed scenarios: jobs sharing a GPU progress at the rates the co-location
model gives them, each job's completion is re-timed when its rate changes (a stale completion is ignored), and
the modelled utilization follows."""

from __future__ import annotations

import math

from cluster import events as ev
from cluster.sim import ADAPTIVE_FILL, ADAPTIVE_KEEP, ColocationModel, LucidTable
from tests.cluster.sim.helpers import SOLO, job, lucid_csv, node_specs, run


def by_id(rows):
    return {r["job_id"]: r for r in rows}


def test_colocation_retimes_both_jobs_and_ignores_stale_completions():
    """G (busy 0.5, 1000 s) from t=0; O (busy 0.5, 100 s) joins its GPU at t=10 (the first report
    shows 0.5 < 0.8): G runs at keep, O fills ``fill`` of G's idle time; when O ends, G is back to 1."""
    jobs = [job("g", 0.0, 1000.0, busy=0.5), job("o", 10.0, 100.0, busy=0.5, klass="opportunistic")]
    sim, rows, _ = run("antman", jobs, node_specs("1x1"))
    r = by_id(rows)
    o_rate = min(1.0, ADAPTIVE_FILL * (1 - 0.5 * ADAPTIVE_KEEP) / 0.5)
    o_end = 10.0 + 100.0 / o_rate
    g_end = o_end + (990.0 - ADAPTIVE_KEEP * (o_end - 10.0))
    assert r["o"]["start_s"] == 10.0 and math.isclose(r["o"]["end_s"], o_end)
    assert math.isclose(r["g"]["end_s"], g_end), "G ended at a stale completion time"
    exits = [(t, e.job_id) for t, evs, _ in sim.log for e in evs if isinstance(e, ev.RankExited)]
    assert [j for _, j in exits] == ["o", "g"] and len(exits) == 2
    # utilization: 0.5 alone, G 0.5*keep + O's share while shared
    shared = 0.5 * ADAPTIVE_KEEP + 0.5 * o_rate
    want = (0.5 * 10.0 + shared * (o_end - 10.0) + 0.5 * (g_end - o_end)) / g_end
    assert math.isclose(sim.acc_busy / g_end, want)


def test_pack_uses_the_measured_pair_speeds(tmp_path):
    """Unmanaged sharing: each job at its Lucid speed beside the other. Only the row (A 1.0, C 0.7)
    measured this pair: O (config A) keeps 1.0, G (config C) drops to 0.7 while they share."""
    table = LucidTable.load(lucid_csv(tmp_path / "lucid.csv"))
    a, c = table.configs.index(("A", "DA", "32", "0")), table.configs.index(("C", "DC", "32", "0"))
    jobs = [job("g", 0.0, 1000.0, busy=SOLO["C"], cfg=c), job("o", 10.0, 90.0, busy=SOLO["A"], cfg=a,
                                                            klass="opportunistic")]
    sim, rows, _ = run("antman", jobs, node_specs("1x1"), model=ColocationModel(table, "pack"))
    r = by_id(rows)
    assert math.isclose(r["o"]["end_s"], 100.0)
    assert math.isclose(r["g"]["end_s"], 100.0 + 990.0 - 0.7 * 90.0)
    assert math.isclose(sim.acc_busy, 0.6 * 10 + (0.6 * 0.7 + 0.2) * 90 + 0.6 * (r["g"]["end_s"] - 100.0))
