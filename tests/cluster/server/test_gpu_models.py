"""GPU models in the live scheduler: a job that names a model (``JobRequest.gpu_model``, ``colocate submit
--gpu-model``), nodes of one model and nodes of several (``cluster.server.node_gpus.node_model``), and the GPU types a
recommendation may offer (``cluster.server.advice.offers``)."""

import pytest

from cluster.server.advice import offers
from colocate import protocol as P
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, replies

MIXED = ("V100", "V100", "T4", "T4")


@pytest.fixture
def h(tmp_path):
    h = Harness(tmp_path / "state.db")
    yield h
    h.journal.close()


def nodes_view(h) -> dict[str, str]:
    (reply,) = replies(h.send(CLIENT, P.NodesRequest()), P.NodesReply)
    return {n.node_id: n.gpu_model for n in reply.nodes}


def placed_on(h, nodes) -> dict[str, str]:
    """job id -> the node its placement went to, from the StartPlacements the nodes received."""
    return {m.job_id: n.node_id for n in nodes for m in n.inbox(P.StartPlacement)}


def test_a_node_of_several_models_has_none_in_the_core_and_is_listed_with_all_of_them(h):
    mixed, v100 = FakeNode(h, "mixed", models=MIXED), FakeNode(h, "v100", models=("V100", "V100"))
    mixed.hello()
    v100.hello()
    assert {n.node_id: n.model for n in h.svc.core.state.nodes.values()} == {"mixed": "", "v100": "V100"}
    assert nodes_view(h) == {"mixed": "V100+T4", "v100": "V100"}


def test_a_job_that_names_a_model_goes_only_to_a_node_of_that_model(h):
    mixed, v100 = FakeNode(h, "mixed", models=MIXED), FakeNode(h, "v100", models=("V100", "V100"))
    mixed.hello()
    v100.hello()
    (a,) = replies(h.submit(gpus=2, gpu_model="V100"), P.Submitted)
    (c,) = replies(h.submit(gpus=2), P.Submitted)  # any model: the node of several takes it
    (b,) = replies(h.submit(gpus=2, gpu_model="A100 | V100"), P.Submitted)  # one of several, spaces ignored
    assert placed_on(h, (mixed, v100)) == {a.job_id: "v100", c.job_id: "mixed"}
    assert h.journal.job(b.job_id)["state"] == "pending"  # the V100 node is full; the mixed one could mix models


def test_a_model_that_only_a_node_of_several_has_is_refused_at_submit(h):
    FakeNode(h, "mixed", models=MIXED).hello()
    FakeNode(h, "v100", models=("V100", "V100")).hello()
    (err,) = replies(h.submit(gpus=1, gpu_model="T4"), P.Error)
    assert err.code == P.INVALID and err.message.endswith("no known node has T4 GPUs (models: V100, unnamed or mixed)")


@pytest.mark.parametrize("bad, why", [
    ("T4@0.6", "a model name has no @"),
    ("V100||T4", "an empty model name"),
    ("|", "an empty model name"),
    ("x" * 65, "a model name of 65 characters"),
])
def test_a_malformed_model_constraint_is_refused_on_the_wire(bad, why):
    with pytest.raises(P.ProtocolError, match=why):
        P.JobRequest(command=("python", "train.py"), cwd="/tmp", env=(), gpu_model=bad)


@pytest.mark.parametrize("nodes, per_worker, constraint, want", [
    # each node: its GPUs' models, and how many of them hold a guaranteed worker already
    ([(("A",) * 3, 0)], 1, "", [("A", 3)]),
    ([(("A",) * 3, 0)], 2, "", [("A", 2)]),  # a worker's GPUs are on one node: 3 free GPUs hold one 2-GPU worker
    ([(("A",) * 2, 0), (("A",) * 2, 0)], 4, "", [("A", 0)]),  # 4 free A GPUs, but no node has 4
    ([(("A",) * 4, 1), (("B",) * 2, 0)], 2, "", [("A", 2), ("B", 2)]),
    ([(("A",) * 2, 0), (("B",) * 2, 0)], 1, "B", [("B", 2)]),  # the job's constraint
    ([(("A", "B"), 0), (("B",) * 2, 0)], 1, "", [("B", 2)]),  # a node of several models offers no type
])
def test_the_types_a_recommendation_offers_count_what_whole_workers_could_use(h, nodes, per_worker, constraint, want):
    fakes = [FakeNode(h, f"n{i}", models=models) for i, (models, _) in enumerate(nodes)]
    for n in fakes:
        n.hello()
    for n, (models, busy) in zip(fakes, nodes):
        for _ in range(busy):
            (ack,) = replies(h.submit(gpus=1, gpu_model=models[0]), P.Submitted)
            assert placed_on(h, fakes)[ack.job_id] == n.node_id
    got = offers(h.svc.core, {}, per_worker, constraint)
    assert [(o.model, o.free) for o in got] == want

