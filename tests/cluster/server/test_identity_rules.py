"""cluster/server/service.py with identities (the ZAP user id a CURVE server reads) and the log relay,
in-process with a fake clock: who may register as which node, submit as whom, cancel what, and logs
asked of the node that holds them."""

from __future__ import annotations

import pytest

from colocate import protocol as P
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, replies


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path / "sched.db")


def hello(h, node: FakeNode, peer):
    gpus = tuple(P.NodeGpu(index=i, model="sim", mem_total=1 << 34) for i in range(node.ngpus))
    return h.send(node.ident, P.NodeHello(node_id=node.node_id, epoch=node.epoch, host="127.0.0.1", gpus=gpus),
                  peer=peer)


def submit(h, peer, ident=CLIENT, user="claimed"):
    req = P.JobRequest(command=("true",), cwd="/tmp", env={}, user=user)
    return h.send(ident, P.Submit(request=req), peer=peer)


@pytest.mark.parametrize("peer, fragment", [
    ("node-n2", "the key of node n2 cannot say hello as node n1"),
    ("user-alice", "the key of user alice cannot register as a node"),
    ("operator-root", "the key of operator root cannot register as a node"),
    ("stranger", "cannot register as a node"),  # a key name with no role
])
def test_a_hello_is_taken_only_from_the_key_of_that_node(h, caplog, peer, fragment):
    n = FakeNode(h, "n1")
    for _ in range(3):
        (err,) = replies(hello(h, n, peer), P.Error, n.ident)
        assert err.code == P.FORBIDDEN and fragment in err.message
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [f"refused: {err.message}"]
    assert isinstance(replies(hello(h, n, "node-n1"), ident=n.ident)[0], P.NodeWelcome)


def test_a_node_id_is_held_by_one_live_connection(h):
    first, second = FakeNode(h, "n1"), FakeNode(h, "n1", epoch=2)
    assert isinstance(replies(hello(h, first, "node-n1"), ident=first.ident)[0], P.NodeWelcome)
    h.now += 2.9
    (err,) = replies(hello(h, second, "node-n1"), P.Error, second.ident)
    assert err.code == P.FORBIDDEN and "held by another live connection" in err.message
    first.heartbeat()  # the first is still alive: the id stays its own
    h.now += 2.9
    assert replies(hello(h, second, "node-n1"), P.Error, second.ident)
    assert isinstance(replies(first.heartbeat(), ident=first.ident)[0], P.NodeHeartbeat)
    h.now += 3.1  # silent past liveness (3 x 1 s)
    assert isinstance(replies(hello(h, second, "node-n1"), ident=second.ident)[0], P.NodeWelcome)
    assert replies(first.heartbeat(), P.Error, first.ident)[0].code == P.UNKNOWN_NODE


def test_the_user_is_the_keys_and_cancel_rights_follow_it(h):
    alice, bob, root = b"alice", b"bob", b"root"
    (a,) = replies(submit(h, "user-alice", alice, user="mallory"), P.Submitted, alice)
    (b,) = replies(submit(h, "user-bob", bob), P.Submitted, bob)
    (jobs,) = replies(h.send(alice, P.JobsRequest(), peer="user-alice"), P.JobsReply, alice)
    assert {v.job_id: v.user for v in jobs.jobs} == {a.job_id: "alice", b.job_id: "bob"}
    (err,) = replies(h.send(bob, P.Cancel(job_id=a.job_id), peer="user-bob"), P.Error, bob)
    assert err.code == P.FORBIDDEN and err.message == f"job {a.job_id} is alice's: only alice or an operator may cancel it"
    assert replies(h.send(alice, P.Cancel(job_id=a.job_id), peer="user-alice"), P.Ok, alice)
    assert replies(h.send(root, P.Cancel(job_id=b.job_id), peer="operator-root"), P.Ok, root)
    node = b"n1"
    for msg in (P.Submit(request=P.JobRequest(command=("true",), cwd="/", env={})), P.Cancel(job_id=a.job_id),
                P.LogsRequest(job_id=a.job_id)):
        (err,) = replies(h.send(node, msg, peer="node-n1"), P.Error, node)
        assert err.code == P.FORBIDDEN and "the key of node n1 cannot" in err.message


def test_logs_are_read_by_the_jobs_user_and_operators_only(h):
    """Issue 22 item 6: a job's output may hold its secrets; bob's key reads no log of alice's job."""
    n = FakeNode(h, "n1")
    n.hello()
    alice, bob, ops = b"alice", b"bob", b"ops"
    (a,) = replies(submit(h, "user-alice", alice), P.Submitted, alice)
    n.start_all()
    (err,) = replies(h.send(bob, P.LogsRequest(job_id=a.job_id), peer="user-bob"), P.Error, bob)
    assert err.code == P.FORBIDDEN
    assert err.message == f"job {a.job_id} is alice's: only alice or an operator may read its logs"
    assert not replies(h.send(bob, P.LogsRequest(job_id=a.job_id), peer="user-bob"), ident=n.ident)  # never asked
    for ident, peer in ((alice, "user-alice"), (ops, "operator-ops")):
        asks = replies(h.send(ident, P.LogsRequest(job_id=a.job_id), peer=peer), ident=n.ident)
        assert [type(m) for m in asks] == [P.LogTailRequest], peer


def test_a_jobs_recommendation_is_asked_by_its_user_and_operators_only(h):
    """It is built from the job's command line and its user's history: bob's key gets none of alice's job."""
    alice, bob, ops = b"alice", b"bob", b"ops"
    (a,) = replies(submit(h, "user-alice", alice), P.Submitted, alice)
    (err,) = replies(h.send(bob, P.RecommendRequest(job_id=a.job_id), peer="user-bob"), P.Error, bob)
    assert err.code == P.FORBIDDEN
    assert err.message == f"job {a.job_id} is alice's: only alice or an operator may ask for its recommendation"
    for ident, peer in ((alice, "user-alice"), (ops, "operator-ops")):
        assert replies(h.send(ident, P.RecommendRequest(job_id=a.job_id), peer=peer), P.RecommendReply, ident), peer
    (err,) = replies(h.send(b"n1", P.RecommendRequest(job_id=a.job_id), peer="node-n1"), P.Error, b"n1")
    assert err.code == P.FORBIDDEN and "the key of node n1 cannot" in err.message


def test_without_keys_the_stated_user_is_recorded_and_anyone_cancels(h):
    (a,) = replies(submit(h, None, user="carol"), P.Submitted)
    (jobs,) = replies(h.send(CLIENT, P.JobsRequest()), P.JobsReply)
    assert jobs.jobs[0].user == "carol"
    assert replies(h.send(b"other", P.Cancel(job_id=a.job_id)), P.Ok, b"other")


def test_logs_are_asked_of_the_node_and_relayed_or_named_missing(h):
    n = FakeNode(h, "n1")
    n.hello()
    (ack,) = replies(h.submit(workers=2, gpus=1), P.Submitted)
    n.start_all()
    out = h.send(CLIENT, P.LogsRequest(job_id=ack.job_id))
    asks = [m for m in replies(out, ident=n.ident) if isinstance(m, P.LogTailRequest)]
    assert sorted(m.rank for m in asks) == [0, 1] and not replies(out, P.LogsReply)
    other = FakeNode(h, "n2")
    other.hello()
    forged = P.LogTail(node_id="n2", epoch=1, request_id=asks[0].request_id, text="forged")
    assert h.send(other.ident, forged) == []  # only the node asked may answer
    assert h.send(n.ident, P.LogTail(node_id="n1", epoch=1, request_id=asks[0].request_id, text="r0")) == []
    assert not replies(h.advance(1.0), P.LogsReply)
    (reply,) = replies(h.advance(1.1), P.LogsReply)  # past the deadline: the silent rank is named
    assert [(r.rank, r.text, r.error) for r in reply.logs] == [
        (asks[0].rank, "r0", ""), (asks[1].rank, "", "node n1 did not answer within 2 s")]
    (err,) = replies(h.send(CLIENT, P.LogsRequest(job_id=ack.job_id, rank=7)), P.Error)
    assert err.code == P.NOT_FOUND and err.message == f"job {ack.job_id} has no worker 7 (it has 2: ranks 0 to 1)"


def test_per_user_quotas_count_the_keys_user_not_the_stated_one(tmp_path):
    policy = tmp_path / "quota.toml"
    policy.write_text('plugins = ["fifo", "gang", "binpack", "quota"]\n'
                      '[plugin.quota]\ntenant = "user"\nquotas = { alice = 2 }\ndefault_quota = -1\n')
    h = Harness(tmp_path / "sched.db", policy=str(policy))
    FakeNode(h, "n1").hello()
    alice, mallory = b"alice", b"mallory"
    assert replies(submit(h, "user-alice", alice, user="bob"), P.Submitted, alice)  # counted as alice's
    (err,) = replies(submit(h, "user-mallory", mallory, user="alice"), P.Error, mallory)  # not alice's quota
    assert err.code == P.INVALID and "mallory" in err.message


@pytest.mark.parametrize("peer, asker, found", [
    (None, "alice", True),  # without keys: the user the client states, as its submit said
    (None, "bob", False),  # another user's history is not this one's
    ("user-alice", "mallory", True),  # with keys: the key's user, whatever the request says
])
def test_a_recommendation_is_for_the_user_the_submit_would_be_from(h, peer, asker, found):
    """`colocate recommend -- CMD` finds the history `colocate submit CMD` made: the same user in the fingerprint
    (without keys a recommendation was asked as user "", so it never found the history of any submit)."""
    from tests.cluster.server.test_advice import run_to_end

    n = FakeNode(h, "n1")
    n.hello()
    req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env={}, user="alice", gpus=1)
    (ack,) = replies(h.send(CLIENT, P.Submit(request=req), peer=peer), P.Submitted)
    run_to_end(h, n, ack.job_id, peak=500 << 20)
    ask = P.RecommendRequest(command=("python", "train.py"), user=asker)
    (reply,) = replies(h.send(CLIENT, ask, peer=peer), P.RecommendReply)
    mem = reply.recommendation.gpu_mem
    assert (mem is not None and mem.level == "exact") == found, reply.recommendation
