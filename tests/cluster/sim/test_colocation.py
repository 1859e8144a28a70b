"""The co-location model: reading and fitting Lucid's pairs, the rates per sharing mode, and the
mapping of trace jobs onto Lucid configurations."""

from __future__ import annotations

import math
from types import SimpleNamespace as J

import pytest

from cluster.sim import ADAPTIVE_FILL, ADAPTIVE_KEEP, ColocationModel, LucidTable
from tests.cluster.sim.helpers import LUCID, LUCID_HEADER, SOLO, lucid_csv


@pytest.fixture
def table(tmp_path):
    return LucidTable.load(lucid_csv(tmp_path / "lucid.csv"))


def test_fit_recovers_the_solo_busy_fractions(table):
    got = {c[0]: u for c, u in zip(table.configs, table.solo)}
    assert got == pytest.approx(SOLO, abs=1e-6)
    assert table.residual < 1e-6 and table.rows == 5


def test_pairs_as_lucid_looks_them_up(table):
    a, b, c = (table.configs.index((m, f"D{m}", "32", "0")) for m in "ABC")
    assert table.speed(a, b, 0, 0) == 0.9  # row (A, B): A's speed
    assert table.speed(b, a, 0, 0) == 0.9  # row (B, A) exists: B's speed there
    assert table.speed(c, a, 0, 0) == 0.7  # only row (A, C): read backwards
    assert table.speed(a, c, 0, 0) == 1.0
    assert table.pairs[(a, b)] <= 1.0  # 1.2 in the file is capped


def test_missing_pair_falls_back_to_model_median_then_saturation(tmp_path):
    t = LucidTable.load(lucid_csv(tmp_path / "l.csv", pairs=[("A", 0.9, "B", 0.8), ("A", 0.95, "A", 0.95)]))
    b = t.configs.index(("B", "DB", "32", "0"))
    assert (b, b) not in t.pairs and ("B", "B") not in t.model_pairs
    assert t.speed(b, b, 0.6, 0.6) == pytest.approx(1 / 1.2)  # saturated: both slowed to fit
    assert t.speed(b, b, 0.3, 0.4) == 1.0  # fits: no slowdown
    assert t.speed(-1, -1, 0.0, 0.0) == 1.0


@pytest.mark.parametrize("jobs, sharing, rates, util", [
    ([J(busy=0.4, klass="guaranteed", cfg=-1)], "adaptive", [1.0], 0.4),
    ([J(busy=1.5, klass="opportunistic", cfg=-1)], "adaptive", [1.0], 1.0),
    # fractional guaranteed shares: enforced by the node, both at solo speed
    ([J(busy=0.3, klass="guaranteed", cfg=-1), J(busy=0.2, klass="guaranteed", cfg=-1)], "pack", [1.0, 1.0], 0.5),
    # adaptive: G keeps ADAPTIVE_KEEP, O fills ADAPTIVE_FILL of G's idle time
    ([J(busy=0.6, klass="guaranteed", cfg=-1), J(busy=0.5, klass="opportunistic", cfg=-1)], "adaptive",
     [ADAPTIVE_KEEP, ADAPTIVE_FILL * (1 - 0.6 * ADAPTIVE_KEEP) / 0.5],
     0.6 * ADAPTIVE_KEEP + ADAPTIVE_FILL * (1 - 0.6 * ADAPTIVE_KEEP)),
    # two O jobs split the fill by their busy fractions (each the same rate)
    ([J(busy=0.9, klass="guaranteed", cfg=-1), J(busy=0.2, klass="opportunistic", cfg=-1),
      J(busy=0.3, klass="opportunistic", cfg=-1)], "adaptive",
     [ADAPTIVE_KEEP] + [ADAPTIVE_FILL * (1 - 0.9 * ADAPTIVE_KEEP) / 0.5] * 2,
     0.9 * ADAPTIVE_KEEP + ADAPTIVE_FILL * (1 - 0.9 * ADAPTIVE_KEEP)),
    # a light G leaves more idle time than the O job needs: O at solo speed
    ([J(busy=0.1, klass="guaranteed", cfg=-1), J(busy=0.2, klass="opportunistic", cfg=-1)], "adaptive",
     [ADAPTIVE_KEEP, 1.0], 0.1 * ADAPTIVE_KEEP + 0.2),
    # without data, pack saturates: busy 0.8 + 0.7 -> each at 1/1.5
    ([J(busy=0.8, klass="guaranteed", cfg=-1), J(busy=0.7, klass="opportunistic", cfg=-1)], "pack",
     [1 / 1.5, 1 / 1.5], 1.0),
])
def test_gpu_rates(jobs, sharing, rates, util):
    got, u = ColocationModel(LucidTable.empty(), sharing).gpu_rates(jobs)
    assert got == pytest.approx(rates) and u == pytest.approx(util)


@pytest.mark.parametrize("busy", [None, 0.6])
def test_three_jobs_multiply_pairwise_speeds_and_fit_the_device(table, busy):
    a, b, c = (table.configs.index((m, f"D{m}", "32", "0")) for m in "ABC")
    jobs = [J(busy=busy or SOLO[m], klass=k, cfg=i)
            for m, k, i in (("A", "guaranteed", a), ("B", "opportunistic", b), ("C", "opportunistic", c))]
    rates, util = ColocationModel(table, "pack").gpu_rates(jobs)
    raw = [0.9 * 1.0, 0.9 * 0.6, 0.7 * 0.5]  # A|B * A|C, B|A * B|C, C|A * C|B
    load = sum(j.busy * r for j, r in zip(jobs, raw))
    want = [r / load for r in raw] if load > 1 else raw  # scaled down only when they overfill the GPU
    assert (load > 1) == (busy is not None)
    assert rates == pytest.approx(want) and util == pytest.approx(min(1.0, load))


def test_assign_is_deterministic_and_covers_every_model(table):
    ids = [f"philly-{i}" for i in range(600)]
    first = [table.assign(i, 0) for i in ids]
    assert first == [table.assign(i, 0) for i in ids]
    assert first != [table.assign(i, 1) for i in ids]
    assert {table.configs[k][0] for k in first} == {"A", "B", "C"}
    assert LucidTable.empty().assign("x", 0) == -1 and LucidTable.empty().busy(-1) == 1.0


@pytest.mark.parametrize("text, error", [
    ("a,b\n1,2\n", "missing column(s) model1"),
    (LUCID_HEADER + "\n0,A,D,1,32,0,fast,B,D,1,32,0,0.9,50,1,1\n", ":2: bad row"),
    (LUCID_HEADER + "\n", "no measured pairs"),
])
def test_bad_lucid_files_are_one_line_errors(tmp_path, text, error):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        LucidTable.load(p)
    with pytest.raises(ValueError, match="cannot read"):
        LucidTable.load(tmp_path / "missing.csv")


@pytest.mark.skipif(not LUCID.exists(), reason=f"no Lucid data at {LUCID}")
def test_the_real_lucid_file():
    t = LucidTable.load(LUCID)
    assert t.rows == 1388 and len(t.configs) == 56 and len(t.models) == 11
    assert t.residual < 0.05  # the fit explains the pairs' utilization within ~3 points
    assert all(0 < u <= 1 for u in t.solo)
    assert all(0 < s <= 1 for s in t.pairs.values())
    solo = dict(zip(t.configs, t.solo))
    # larger batches keep the GPU busier; AMP less (ResNet18 on CIFAR-10, no AMP)
    r = [solo[("ResNet18", "CIFAR-10", b, "0")] for b in ("32", "64", "128")]
    assert r == sorted(r) and solo[("ResNet18", "CIFAR-10", "128", "1")] < r[-1]
    assert max(solo[c] for c in t.configs if c[0] in ("PPO", "TD3")) < 0.15  # small RL models
    assert math.isclose(sum(t.solo) / len(t.solo), 0.37, abs_tol=0.05)
