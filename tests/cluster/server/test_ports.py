"""cluster/server/service.py: a placement's rendezvous port is given back once no worker of it can run."""

from __future__ import annotations

from cluster.server.ports import PortPool
from colocate import protocol as P
from tests.cluster.server.helpers import FakeNode, Harness, one_running_job, replies


def refuse_latest(h: Harness, n: FakeNode, job_id: str) -> str:
    sp = n.inbox(P.StartPlacement)[-1]
    h.send(n.ident, P.StartRefused(node_id=n.node_id, epoch=n.epoch, job_id=job_id, placement_id=sp.placement_id,
                                   reason="user 'bench' has no Unix account 'bench' on this node"))
    return sp.placement_id


def test_a_refused_start_gives_its_port_back_so_refusals_never_exhaust_the_pool(tmp_path):
    h = Harness(tmp_path / "sched.db")
    h.svc.ports = PortPool(size=2)  # two ports: a leak of two refused placements would starve every later start
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    for _ in range(3):
        (job,) = replies(h.submit(gpus=1), P.Submitted)
        pid = refuse_latest(h, n, job.job_id)
        assert pid not in h.svc.ports.held
    (last,) = replies(h.submit(gpus=1), P.Submitted)
    assert n.inbox(P.StartPlacement)[-1].job_id == last.job_id  # placed and sent: a port was free
    assert not h.svc.portless


def test_a_running_placement_keeps_its_port_until_its_job_ends(tmp_path):
    h = Harness(tmp_path / "sched.db")
    n = FakeNode(h, "n1", gpus=2)
    a, pid = one_running_job(h, n)
    (b,) = replies(h.submit(gpus=1), P.Submitted)
    refuse_latest(h, n, b.job_id)  # another job's requeue does not take a running placement's port
    assert pid in h.svc.ports.held
    n.exit(pid, 0)
    assert pid not in h.svc.ports.held
