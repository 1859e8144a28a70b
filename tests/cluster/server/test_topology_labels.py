"""Network labels reach the scheduler: a node's hello carries them (``colocate node --topology``), the
operator's topology file overrides them (``colocate scheduler --topology``), the core places by them, and
``NodesReply`` shows them."""

from __future__ import annotations

import pytest

from cluster.server.views import node_views
from colocate import protocol as P
from tests.cluster.server.helpers import FakeNode, GiB, Harness


class LabelledNode(FakeNode):
    def __init__(self, h, node_id, gpus=2, topology=""):
        super().__init__(h, node_id, gpus)
        self.topology = P.parse_topology(topology)

    def hello(self, status: bool = True) -> list:
        gpus = tuple(P.NodeGpu(index=i, model="sim", mem_total=16 * GiB) for i in range(self.ngpus))
        out = self.h.send(self.ident, P.NodeHello(node_id=self.node_id, epoch=self.epoch, host=self.host, gpus=gpus,
                                                  topology=self.topology))
        return out + (self.status() if status else [])


def placed_nodes(h) -> set[str]:
    """The nodes that were sent a StartPlacement."""
    got = {h.svc.idents[ident] for ident, m in h.sent if isinstance(m, P.StartPlacement)}
    assert got, "nothing was placed"
    return got


@pytest.mark.parametrize("file, expect", [
    (None, {"a", "c"}),  # by the nodes' own labels: a and c share switch s1
    ({"b": ("s1", ""), "c": ("s9", "")}, {"a", "b"}),  # the operator's file wins: now a and b share s1
])
def test_a_gang_goes_under_one_switch_by_the_labels_the_scheduler_believes(tmp_path, file, expect):
    h = Harness(tmp_path / "s.db", policy="topology")
    if file is not None:
        h.svc.topology = file
    for node_id, labels in (("a", "switch=s1"), ("b", "switch=s2"), ("c", "switch=s1,rack=r1")):
        LabelledNode(h, node_id, topology=labels).hello()
    h.submit(workers=2, gpus=2)
    assert placed_nodes(h) == expect
    views = {v.node_id: (v.switch, v.rack) for v in node_views(h.svc.core, h.svc.hosts)}
    want = {"a": ("s1", ""), "b": ("s2", ""), "c": ("s1", "r1")}
    want.update({k: v for k, v in (file or {}).items()})
    assert views == want


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the topology file"),
    ("node,switch\nn1,s1\n", "header must be node_id,switch"),
    ("node_id,switch\nn1,s1\nn1,s2\n", "topology.csv:3: node 'n1' listed twice"),
    pytest.param("node_id,switch\nn1," + "x" * 140_000 + "\n", "topology.csv:2: malformed CSV: field larger than "
                 "field limit", id="a-field-over-the-csv-limit"),
])
def test_a_bad_topology_file_stops_the_scheduler_with_one_line(tmp_path, content, message):
    import subprocess

    from tests.support import PY, REPO, child_env, free_port

    path = tmp_path / "topology.csv"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([PY, "-m", "colocate", "scheduler", "--bind", f"tcp://127.0.0.1:{free_port()}", "--state",
                           str(tmp_path / "s.db"), "--insecure", "--topology", str(path)],
                          capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
