"""The ``topology`` placement plugin, table-driven on small labelled clusters: a gang spans the fewest
nodes, then switches, then racks; ``wait_s`` holds a gang for a tighter placement on the core's clock,
then lets it take a looser one; the topology file and shape readers; the node labels' parser."""

from __future__ import annotations

import pytest

from cluster import events as ev
from cluster.spec import NodeSpec
from cluster.traces.nodes import parse_shape
from cluster.traces.topology import label_nodes, load_topology, parse_topology_csv, shape_topology
from colocate.protocol import parse_topology
from tests.cluster.helpers import config, finish, job, make_core, run, starts, submit


def N(node_id, gpus, switch="", rack=""):
    return NodeSpec(node_id, gpus, switch=switch, rack=rack)


def spread(core, placement):
    """(nodes, switches, racks) a placement spans."""
    specs = [core.state.nodes[n].spec for n in placement.nodes()]
    return len(specs), len({s.switch for s in specs}), len({s.rack for s in specs})


FOUR_BY_TWO = [N("a1", 4, "s1", "r1"), N("a2", 4, "s1", "r1"), N("b1", 4, "s2", "r1"), N("b2", 4, "s2", "r1"),
               N("c1", 4, "s3", "r2"), N("c2", 4, "s3", "r2")]


@pytest.mark.parametrize("used, gang, expect", [
    # every node free: a 2x4 gang takes both nodes of one switch (2 nodes, 1 switch, 1 rack)
    ({}, job("g", 4, workers=2), (2, 1, 1)),
    # a1 half used: a 4x1 gang fits whole on one free node rather than on a1's 2 + a2's 2
    ({"a1": 2}, job("g", 1, workers=4), (1, 1, 1)),
    # only 1 GPU free on each of s1's nodes and s2's nodes, all of s3 free: 8 x 1 GPU goes to s3 (2 nodes)
    ({"a1": 3, "a2": 3, "b1": 3, "b2": 3}, job("g", 1, workers=8), (2, 1, 1)),
    # s3 gone too: 4 x 1 GPU must span 4 nodes; it stays in rack r1 (2 switches, 1 rack)
    ({"a1": 3, "a2": 3, "b1": 3, "b2": 3, "c1": 4, "c2": 4}, job("g", 1, workers=4), (4, 2, 1)),
    # 3 x 2 GPUs with 2 free on a1, b1, c1 and 4 on c2: fewest nodes first (c2 + one more), the
    # other being c1 keeps it in one switch
    ({"a1": 2, "a2": 4, "b1": 2, "b2": 4, "c1": 2}, job("g", 2, workers=3), (2, 1, 1)),
    # one GPU free on a1, b1 and c1: 2 x 1 GPU spans two switches either way, one rack (r1) when a1 + b1
    ({"a1": 3, "a2": 4, "b1": 3, "b2": 4, "c1": 3, "c2": 4}, job("g", 1, workers=2), (2, 2, 1)),
])
def test_a_gang_spans_the_fewest_nodes_then_switches_then_racks(used, gang, expect):
    core = make_core(config(["fifo", "gang", "topology"]), FOUR_BY_TWO)
    for i, (node, k) in enumerate(used.items()):
        _fill(core, node, k, i)
    p = run(core, gang, now=10.0)
    assert gang.job_id in p, "the gang was not placed"
    assert spread(core, p[gang.job_id]) == expect
    core.state.check_invariants()


def _fill(core, node, used, i):
    """Hold ``used`` GPUs of ``node`` with a job pinned there by a GPU model only that node has."""
    st = core.state.nodes[node]
    spec = st.spec
    core.handle(ev.NodeLost(node, "relabel"), 0.0)
    core.handle(ev.NodeJoined(NodeSpec(node, spec.gpus, gpu_model=f"M-{node}", switch=spec.switch, rack=spec.rack), 2), 0.0)
    p = run(core, job(f"fill{i}", used, gpu_model=f"M-{node}"), now=0.0)
    assert p[f"fill{i}"].slots[0].node_id == node


def test_binpack_is_blind_to_switches_where_topology_is_not():
    """The same cluster state, two policies: bin-packing takes the two nodes it meets first (two switches),
    the topology plugin two nodes under one switch. Breaking ``plan``'s per-switch candidates makes the
    second placement span two switches too."""
    nodes = [N("x1", 8, "s1"), N("y1", 8, "s2"), N("x2", 8, "s1"), N("y2", 8, "s2")]
    got = {}
    for policy in ("binpack", "topology"):
        core = make_core(config(["fifo", "gang", policy]), nodes)
        p = run(core, job("g", 8, workers=2))
        got[policy] = spread(core, p["g"])
    assert got == {"binpack": (2, 2, 1), "topology": (2, 1, 1)}


def test_unlabelled_nodes_are_placed_by_node_count_alone():
    core = make_core(config(["fifo", "gang", "topology"]), [N("n1", 2), N("n2", 4), N("n3", 8)])
    p = run(core, job("g", 1, workers=6))
    assert [s.node_id for s in p["g"].slots] == ["n3"] * 6  # one node: the one that holds it all


@pytest.mark.parametrize("wait_s, waited, placed", [
    (0.0, 0.0, True),  # no waiting: the looser placement at once
    (300.0, 100.0, False),  # within the wait: held, hoping for one switch
    (300.0, 300.0, True),  # the wait is over: it takes two switches
])
def test_wait_s_holds_a_gang_for_a_tighter_placement(wait_s, waited, placed):
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": wait_s}), nodes)
    _fill(core, "a2", 4, 0)
    _fill(core, "b2", 4, 1)  # one free node per switch: 2 x 4 GPUs spans two switches now
    p = starts(submit(core, job("g", 4, workers=2), now=0.0))
    p.update(starts(core.handle(ev.Tick(), waited)))
    assert ("g" in p) == placed
    if placed:
        assert spread(core, p["g"]) == (2, 2, 1)
    else:
        assert core.job("g").state == "pending"
        assert "tighter placement" in str(core.fw.blocked["default"][1])


def test_a_waiting_gang_takes_the_tight_placement_when_it_frees_up():
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": 600.0}), nodes)
    _fill(core, "a2", 4, 0)
    _fill(core, "b2", 4, 1)
    submit(core, job("g", 4, workers=2), now=0.0)
    assert core.job("g").state == "pending"
    out = finish(core, "fill0", 50.0)  # a2 frees: a1 + a2 under s1
    p = starts(out)
    assert "g" in p and spread(core, p["g"]) == (2, 1, 1)


def test_the_wait_counts_from_the_first_loose_chance_not_from_submission():
    """A gang queued for 1000 s with no room at all still waits wait_s once a loose placement appears."""
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": 300.0}), nodes)
    for i, n in enumerate(("a1", "a2", "b1", "b2")):
        _fill(core, n, 4, i)
    assert starts(submit(core, job("g", 4, workers=2), now=0.0)) == {}  # no room at all
    assert "g" not in starts(finish(core, "fill0", 1000.0))  # a1 free: still no room for 2 x 4
    assert "g" not in starts(finish(core, "fill3", 1000.0))  # b2 too: a loose placement; the wait starts now
    assert "g" not in starts(core.handle(ev.Tick(), 1200.0))
    p = starts(core.handle(ev.Tick(), 1300.0))
    assert "g" in p and spread(core, p["g"]) == (2, 2, 1)


@pytest.mark.parametrize("behind, passes", [
    (job("small", 1), True),  # fits on a2's free GPU, which no worker of the gang could use
    (job("whole", 4), False),  # would take a1 or b1, the nodes the gang waits with
    (job("pair", 2), False),  # the same: only a1 and b1 have 2 free
    (job("g2", 4, workers=2), False),  # a gang behind is no exception
])
def test_a_waiting_gang_lets_later_jobs_pass_but_not_onto_its_nodes(behind, passes):
    """While g waits for a1 + a2 (a2 busy), a job behind it may start only where no worker of g fits: had it
    taken a1 or b1, a2 freeing would no longer give g one switch, and waiting could never pay off."""
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": 600.0}), nodes)
    _fill(core, "a2", 3, 0)
    _fill(core, "b2", 4, 1)
    p = run(core, job("g", 4, workers=2), behind, now=0.0)
    assert "g" not in p and (behind.job_id in p) == passes
    if passes:
        assert {s.node_id for s in p[behind.job_id].slots} == {"a2"}
        finish(core, behind.job_id, 40.0)
    p = starts(finish(core, "fill0", 50.0))  # a2 frees within the wait: g gets one switch
    assert "g" in p and spread(core, p["g"]) == (2, 1, 1)
    if not passes:  # and the job behind it then takes what is left, or waits for it
        assert behind.job_id in p or core.job(behind.job_id).state == "pending"
    core.state.check_invariants()


@pytest.mark.parametrize("depth, placed", [(1, set()), (2, {"small"})])
def test_a_waiting_gang_lets_depth_jobs_behind_it_be_examined(depth, placed):
    """Not the whole queue: with holds that last, every cycle walked every pending job (24x the CPU of a
    3,000-job Philly replay on 64 x 8)."""
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": 600.0, "depth": depth}), nodes)
    _fill(core, "a2", 3, 0)
    _fill(core, "b2", 4, 1)
    p = run(core, job("g", 4, workers=2), job("whole", 4), job("small", 1), now=0.0)
    assert set(p) == placed


def test_the_nodes_are_kept_only_while_the_wait_lasts():
    nodes = [N("a1", 4, "s1"), N("a2", 4, "s1"), N("b1", 4, "s2"), N("b2", 4, "s2")]
    core = make_core(config(["fifo", "gang", "topology"], topology={"wait_s": 300.0}), nodes)
    _fill(core, "a2", 4, 0)
    _fill(core, "b2", 4, 1)
    assert run(core, job("g", 4, workers=2), job("w", 4), now=0.0) == {}
    assert core.fw.plugin("topology").wake_at() == 300.0  # when the simulator ticks for it
    p = starts(core.handle(ev.Tick(), 300.0))  # the wait is over: g spans two switches and w waits for room
    assert set(p) == {"g"} and spread(core, p["g"]) == (2, 2, 1)
    assert core.fw.plugin("topology").wake_at() is None


# ---------------------------------------------------------------- labels and topology files


@pytest.mark.parametrize("text, expect", [
    ("switch=s1,rack=r2", (("switch", "s1"), ("rack", "r2"))),
    ("rack=r2, switch=s1", (("switch", "s1"), ("rack", "r2"))),
    ("switch=leaf-03", (("switch", "leaf-03"),)),
    ("", ()),
])
def test_node_labels_parse(text, expect):
    assert parse_topology(text) == expect


@pytest.mark.parametrize("text, error", [
    ("switch", "expected switch=LABEL"),
    ("row=3", "expected switch=LABEL"),
    ("switch=a,switch=b", "switch given twice"),
    ("switch=", "must be 1-64"),
    ("switch=a b", "must be 1-64"),
    ("rack=" + "x" * 65, "must be 1-64"),
    pytest.param("switch=" + "a" * 100_000, r"switch label 'a{64}'\.\.\. \(100,000 characters\) must be 1-64",
                 id="a-long-label"),
    ("switch=a\u2028b", r"switch label 'a\\u2028b' must be 1-64"),
    pytest.param("hop=" + "b" * 100_000, r"got 'hop=b{60}'\.\.\. \(100,004 characters\)", id="a-long-part"),
])
def test_bad_node_labels_give_one_line(text, error):
    """One line, with a long value cut (it was echoed whole: a 100 KB error line) and a line break escaped."""
    with pytest.raises(ValueError, match=error) as e:
        parse_topology(text)
    assert "\n" not in str(e.value) and "\u2028" not in str(e.value) and len(str(e.value)) < 200


@pytest.mark.parametrize("text", [
    "# racks\nnode_id,switch,rack\nn1,s1,r1\nn2,s1,\nn3,s2,r1\n",
    "\ufeffnode_id,switch,rack\r\nn1,s1,r1\r\nn2,s1,\r\n\r\n# n3 too\r\nn3,s2,r1\r\n",  # a BOM, CRLF (as the trace readers take)
    "rack,node_id,switch\n r1 , n1 , s1 \n,n2,s1\nr1,n3,s2",  # any column order; cells stripped; an empty cell: not stated
])
def test_topology_csv(text):
    assert parse_topology_csv(text, "t.csv") == {"n1": ("s1", "r1"), "n2": ("s1", ""), "n3": ("s2", "r1")}


def test_topology_shape():
    nodes = [NodeSpec(f"node-{i}", 8) for i in range(6)]
    assert [(n.switch, n.rack) for n in label_nodes(nodes, shape_topology("3x2", nodes))] == [
        ("sw00", ""), ("sw00", ""), ("sw01", ""), ("sw01", ""), ("sw02", ""), ("sw02", "")]
    assert [n.rack for n in load_topology("3x2/2", nodes)] == ["rack00"] * 4 + ["rack01"] * 2


@pytest.mark.parametrize("text, error", [
    ("", "t.csv: empty topology file"),
    ("# only a comment\n\n", "t.csv: empty topology file"),
    ("node,switch\nn1,s1\n", "t.csv:1: header must be node_id,switch"),
    ("node_id,switch\nn1,s1,x\n", "t.csv:2: 3 fields, expected 2"),
    # the file's line numbers, comments and blank lines counted (it said row 3)
    ("# racks\n\nnode_id,switch\nn1,s1\n# again\n\nn1,s2\n", "t.csv:7: node 'n1' listed twice"),
    ("node_id,switch\nn1,s 1\n", "t.csv:2: topology: switch label"),
    ("node_id,switch\n,s1\n", "t.csv:2: empty node_id"),
    ("node_id,switch,switch\nn1,a,b\n", "t.csv:1: column 'switch' appears twice in the header"),  # was taken
    ("\ufeffnode_id,node_id,switch\nn1,n2,a\n", "t.csv:1: column 'node_id' appears twice in the header"),
    # U+2028 is no line break in a CSV file (it split the row in two): a label or node id holding one is refused
    ("node_id,switch\nn1,a\u2028b\n", r"t.csv:2: topology: switch label 'a\\u2028b' must be"),
    ("node_id,switch\nn\u20281,s1\n", r"t.csv:2: node id 'n\\u20281' must be 1-128 printable characters"),
    ("node_id,switch\n" + "n" * 200 + ",s1\n", r"t.csv:2: node id 'n{64}'\.\.\. \(200 characters\) must be"),
    pytest.param("node_id,switch\nn1,s1\nn2," + "a" * 100_000 + "\n", r"t.csv:3: topology: switch label 'a{64}'\.\.\. "
                 r"\(100,000 characters\)", id="a-long-label"),
    ('node_id,switch\nn1,s1\nn2,"s\0"\n', r"t.csv:3: topology: switch label 's\\x00' must be"),
])
def test_bad_topology_files_give_one_line(text, error):
    with pytest.raises(ValueError, match=error) as e:
        parse_topology_csv(text, "t.csv")
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_topology_shape_must_cover_the_cluster():
    nodes = [NodeSpec(f"n{i}", 8) for i in range(4)]
    with pytest.raises(ValueError, match="covers 6 nodes, the cluster has 4"):
        shape_topology("3x2", nodes)
    with pytest.raises(ValueError, match="not in the cluster"):
        label_nodes(nodes, {"zz": ("s", "")})


def test_an_unknown_node_names_the_clusters_node_ids():
    """A topology CSV written with the wrong ids (``node-0`` for a shape's ``node-0000``) is told the form the
    cluster's ids take, not left to trial and error."""
    with pytest.raises(ValueError) as e:
        label_nodes(parse_shape("16x8"), {"node-0": ("s1", ""), "node-0001": ("s1", "")}, "t.csv")
    assert str(e.value) == ("t.csv: 1 node(s) not in the cluster, e.g. 'node-0'; the cluster's nodes are "
                            "node-0000..node-0015 (16 nodes)")
    with pytest.raises(ValueError, match="the cluster's nodes are a, b$"):
        label_nodes([NodeSpec("a", 8), NodeSpec("b", 8)], {"c": ("s", "")})
    assert [n.node_id for n in parse_shape("9999x1")][-1] == "node-9998"
    assert [n.node_id for n in parse_shape("10001x1")][::10000] == ["node-00000", "node-10000"]  # docs/simulator.md
