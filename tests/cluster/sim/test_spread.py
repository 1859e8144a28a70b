"""The simulator's spread model: a gang runs slower by the node and switch factors when its placement spans
more than one node and switch; the same job on one node runs at its solo speed; the factors are checked."""

from __future__ import annotations

import pytest

from cluster.sim import SimConfig
from cluster.sim.network import PUBLISHED, SpreadModel, parse_spread, span
from cluster.spec import NodeSpec
from tests.cluster.sim.helpers import job, run

MODEL = SpreadModel(node=2.0, switch=1.5, rack=1.25)


@pytest.mark.parametrize("nodes, workers, gpus, jct", [
    ([NodeSpec("a", 2, switch="s1", rack="r1")], 2, 1, 100.0),  # one node: solo speed
    ([NodeSpec("a", 1, switch="s1", rack="r1"), NodeSpec("b", 1, switch="s1", rack="r1")], 2, 1, 200.0),  # x node
    ([NodeSpec("a", 1, switch="s1", rack="r1"), NodeSpec("b", 1, switch="s2", rack="r1")], 2, 1, 300.0),  # x switch
    ([NodeSpec("a", 1, switch="s1", rack="r1"), NodeSpec("b", 1, switch="s2", rack="r2")], 2, 1, 375.0),  # x rack
    # unlabelled nodes: switches and racks not known, so the node factor alone (it was 375: each node taken for a
    # switch and a rack of its own, so every multi-node gang paid all three factors)
    ([NodeSpec("a", 1), NodeSpec("b", 1)], 2, 1, 200.0),
    # labelled switches, no racks: no rack factor (it was charged: each switch taken for a rack of its own)
    ([NodeSpec("a", 1, switch="s1"), NodeSpec("b", 1, switch="s2")], 2, 1, 300.0),
    # one node unlabelled: its switch is not known, so only the one switch label counts
    ([NodeSpec("a", 1, switch="s1", rack="r1"), NodeSpec("b", 1)], 2, 1, 200.0),
    ([NodeSpec("a", 1, switch="s1"), NodeSpec("b", 1, switch="s2")], 1, 1, 100.0),  # one worker: no spread
])
def test_a_gang_is_slowed_by_its_spread(nodes, workers, gpus, jct):
    sim, rows, _ = run("gang-binpack", [job("g", 0.0, 100.0, gpus=gpus, workers=workers)], nodes,
                       config=SimConfig(spread=MODEL))
    assert rows[0]["jct_s"] == pytest.approx(jct)
    assert sim.by_id["g"].span[0] == (len(nodes) if workers > 1 else 1)


@pytest.mark.parametrize("busy", [1.0, 0.5])
def test_a_spread_gang_keeps_its_gpus_busy_for_its_work_not_its_stretched_run(busy):
    """Work is conserved (docs/simulator.md): a gang slowed 2x by its spread is busy ``u x duration`` in all, so its
    GPUs' utilization is u / 2 over its 200 s (it read u)."""
    nodes = [NodeSpec("a", 1), NodeSpec("b", 1)]
    _, rows, s = run("gang-binpack", [job("g", 0.0, 100.0, workers=2, busy=busy)], nodes, config=SimConfig(spread=MODEL))
    assert rows[0]["jct_s"] == pytest.approx(200.0)
    assert s["gpu_utilization"] == pytest.approx(busy * 100.0 * 2 / (200.0 * 2)), s


def test_no_spread_model_means_no_slowdown():
    nodes = [NodeSpec("a", 1, switch="s1"), NodeSpec("b", 1, switch="s2")]
    _, rows, _ = run("gang-binpack", [job("g", 0.0, 100.0, workers=2)], nodes)
    assert rows[0]["jct_s"] == pytest.approx(100.0)


def test_span_counts_nodes_switches_racks():
    specs = [NodeSpec("a", 1, switch="s1", rack="r1"), NodeSpec("b", 1, switch="s1", rack="r1"),
             NodeSpec("c", 1, switch="s2", rack="r1"), NodeSpec("d", 1)]
    assert span(specs[:2]) == (2, 1, 1)
    assert span(specs[:3]) == (3, 2, 1)
    assert span(specs) == (4, 2, 1)  # d is under a switch and rack not known
    assert span(specs[3:]) == (1, 1, 1)


@pytest.mark.parametrize("text, expect", [
    ("published", PUBLISHED), ("none", SpreadModel()), ("node=1.5,switch=1.1", SpreadModel(1.5, 1.1, 1.0)),
])
def test_parse_spread(text, expect):
    assert parse_spread(text) == expect


@pytest.mark.parametrize("text, error", [
    ("node=0.5", "must be a number from 1 to 100"), ("node=x", "is not a number"), ("hop=2", "expected published"),
    ("node=1.5,node=2", "expected published"),
    # were taken: the rate became 0 and the gang never finished, reported only as unfinished
    ("node=1e308,switch=1e308", r"node factor must be a number from 1 to 100, got 1e\+308"),
    ("switch=101", "switch factor must be a number from 1 to 100, got 101.0"),
    ("node=inf", "must be a number from 1 to 100"), ("rack=nan", "must be a number from 1 to 100"),
])
def test_bad_spread_models_give_one_line(text, error):
    with pytest.raises(ValueError, match=error):
        parse_spread(text)


def test_simulate_with_a_topology_and_the_published_spread_model(tmp_path, capsys):
    """``colocate simulate --topology 4x2 --spread published``: the topology plugin's gangs span no more
    switches than bin-packing's, the summary says so, and bad values are one line, exit 2."""
    import json

    from colocate.cli import main
    from tests.cluster.sim.test_cli import philly_file

    trace = philly_file(tmp_path / "philly.csv", n=80, bad=False)
    base = ["simulate", "--trace", str(trace), "--cluster", "8x8", "--out", str(tmp_path / "out"), "--quiet",
            "--no-plots", "--colocation-data", "none"]
    assert main(base + ["--policy", "gang-binpack,topology", "--topology", "4x2", "--spread", "published"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    spread = {s["policy"]: s["gang_spread"] for s in summary}
    assert spread["topology"]["jobs"] == spread["gang-binpack"]["jobs"] > 0
    assert spread["topology"]["mean_switches"] <= spread["gang-binpack"]["mean_switches"]
    capsys.readouterr()
    for bad, message in ((["--topology", "3x2"], "covers 6 nodes, the cluster has 8"),
                         (["--spread", "node=0.3"], "must be a number from 1 to 100"),
                         (["--spread", "node=1e308,switch=1e308"], "must be a number from 1 to 100"),
                         (["--topology", str(tmp_path / "none.csv")], "cannot read the topology file")):
        assert main(base + ["--policy", "topology", *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("topology, spread, error", [
    (None, "node=1.5,switch=2,rack=3", "--spread switch=2: no node has a switch label"),
    (None, "switch=1.2", "--spread switch=1.2: no node has a switch label"),
    (None, "rack=3", "--spread rack=3: no node has a rack label"),
    ("4x2", "node=1.5,switch=2,rack=3", "--spread rack=3: no node has a rack label"),  # 4x2 names no racks
    (None, "node=1.5", None),  # the node factor needs no labels
    (None, "published", None),  # its assumed switch factor is not applied without labels (docs/simulator.md)
    ("4x2/2", "node=1.5,switch=2,rack=3", None),
])
def test_switch_and_rack_factors_need_labels(tmp_path, capsys, topology, spread, error):
    """Without --topology every multi-node gang was charged the switch and rack factors too (node=1.5,switch=2,rack=3
    slowed it 9x) and gang_spread said mean_switches == mean_nodes; now a factor no label could ever trigger is
    refused in one line, exit 2, and switches are not reported when no node has a switch label."""
    import json

    from colocate.cli import main
    from tests.cluster.sim.test_cli import philly_file

    trace = philly_file(tmp_path / "philly.csv", n=80, bad=False)
    argv = ["simulate", "--trace", str(trace), "--cluster", "8x8", "--out", str(tmp_path / "out"), "--quiet",
            "--no-plots", "--colocation-data", "none", "--policy", "gang-binpack", "--spread", spread]
    rc = main(argv + (["--topology", topology] if topology else []))
    err = capsys.readouterr().err
    if error:
        assert rc == 2 and error in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
        return
    assert rc == 0
    got = json.loads((tmp_path / "out" / "summary.json").read_text())[0]["gang_spread"]
    assert got["jobs"] > 0 and got["mean_nodes"] > 1
    if topology:
        assert 1 <= got["mean_switches"] <= got["mean_nodes"]
    else:
        assert got["mean_switches"] is None and got["one_switch_share"] is None


def test_without_labels_a_gang_pays_the_node_factor_only():
    nodes = [NodeSpec("a", 1), NodeSpec("b", 1)]
    _, rows, summary = run("gang-binpack", [job("g", 0.0, 100.0, workers=2)], nodes,
                           config=SimConfig(spread=SpreadModel(node=1.5, switch=2.0, rack=3.0)))
    assert rows[0]["jct_s"] == pytest.approx(150.0)  # it was 900: 1.5 x 2 x 3
    assert summary["gang_spread"] == {"jobs": 1, "mean_nodes": 2.0, "mean_switches": None, "one_switch_share": None}
