"""The readers over the real traces in ../shared/traces (skipped when the folder is absent).
The expected numbers are those the traces' README states or that docs/traces.md reports."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cluster.traces import allowed_models, load_nodes, load_trace, model_allows, read_alibaba_pods, read_philly

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no traces at {TRACES}")
ALI = TRACES / "alibaba-gpu-v2023"


def test_philly_whole_file_as_documented():
    # how fast it loads is benchmarks/simulator.py's to say: a test never fails because the machine was slow
    r = read_philly(TRACES / "philly-pollux" / "philly.csv")
    assert r.rows == 82247 and len(r.jobs) == 82247 and not r.skipped
    hist = Counter(j.spec.total_gpus for j in r.jobs)
    assert (hist[1], hist[2], hist[4], hist[8], hist[16], hist[32], max(hist)) == \
        (76627, 1818, 1870, 1643, 199, 67, 128)
    assert r.jobs[0].spec.submit_time == 0.0 and r.jobs[-1].spec.submit_time == 9408690.0
    durations = sorted(j.duration_s for j in r.jobs)
    assert durations[len(durations) // 2] == 1144.0
    assert len({j.spec.queue for j in r.jobs}) == 15


def test_alibaba_default_pods():
    r = read_alibaba_pods(ALI / "openb_pod_list_default.csv")
    assert (r.rows, len(r.jobs), dict(r.skipped)) == (8152, 7255, {"never scheduled": 897})
    r = read_alibaba_pods(ALI / "openb_pod_list_default.csv", allow_no_duration=True)
    specs = [j.spec for j in r.jobs]
    assert len(specs) == 8152 and not r.skipped
    assert sum(1 for s in specs if s.gpu_milli < 1000) == 3078
    assert sum(1 for s in specs if s.gpus == 0) == 1088
    assert sum(1 for s in specs if s.klass == "opportunistic") == 3398


def test_every_variant_reads_cleanly_and_constraints_name_real_models():
    node_models = {n.gpu_model for n in load_nodes(ALI / "openb_node_list_all_node.csv").nodes if n.gpus}
    for path in sorted(ALI.glob("openb_pod_list_*.csv")):
        r = load_trace(path, allow_no_duration=True)
        assert r.format == "alibaba2023" and not r.skipped and len(r.jobs) == r.rows, path.name
        for constraint in {j.spec.gpu_model for j in r.jobs if j.spec.gpu_model}:
            assert allowed_models(constraint) <= node_models, (path.name, constraint)
            assert any(model_allows(constraint, m) for m in node_models)


def test_node_lists():
    r = load_nodes(ALI / "openb_node_list_all_node.csv")
    assert (len(r.nodes), sum(n.gpus for n in r.nodes), sum(1 for n in r.nodes if n.gpus == 0)) == (1523, 6212, 310)
    g = load_nodes(ALI / "openb_node_list_gpu_node.csv")
    assert (len(g.nodes), sum(n.gpus for n in g.nodes)) == (1213, 6212)
    p = load_nodes(TRACES / "alibaba-pai-v2020" / "pai_machine_spec_with_header.csv")
    assert p.format == "pai2020" and not p.skipped
    assert (len(p.nodes), sum(n.gpus for n in p.nodes)) == (1897, 6742)
