"""Optional wire fields (``_f(..., optional=True)``): left off the wire at their default and filled in
when missing, so a node or scheduler that predates a field still reads and writes the message. The
first is ``NodeHello.topology`` (and ``NodeView.switch``/``rack``)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from colocate import protocol as P


def hello(**kw):
    return P.NodeHello(node_id="n1", epoch=1, host="127.0.0.1", gpus=(P.NodeGpu(0, "sim", 1 << 30),), **kw)


def test_an_optional_field_at_its_default_is_left_off_the_wire():
    wire = P.to_wire(hello())
    assert "topology" not in wire  # a scheduler that predates it reads this hello
    assert P.decode(P.encode(hello())) == hello()


def test_a_message_from_a_peer_that_predates_the_field_decodes_with_the_default():
    old = {k: v for k, v in P.to_wire(hello(topology=(("switch", "s1"),))).items() if k != "topology"}
    got = P.from_wire(old)
    assert got.topology == ()


def test_topology_labels_travel():
    msg = hello(topology=P.parse_topology("switch=s1,rack=r2"))
    got = P.decode(P.encode(msg))
    assert dict(got.topology) == {"switch": "s1", "rack": "r2"}
    view = P.NodeView("n1", "h", True, "sim", 2, 0, 0, 0.0, 0, switch="s1", rack="r2")
    assert P.decode(P.encode(P.NodesReply(nodes=(view,), scheduler_epoch=1))).nodes[0].switch == "s1"


@pytest.mark.parametrize("topology", [{"row": "x"}, {"switch": ""}, {"switch": "a\nb"}, ["switch"]])
def test_bad_topology_on_the_wire_is_invalid(topology):
    wire = P.to_wire(hello())
    wire["topology"] = topology
    with pytest.raises(P.ProtocolError) as e:
        P.decode(msgpack.packb(wire))
    assert e.value.code == P.INVALID


def test_other_missing_fields_are_still_required_and_extra_ones_refused():
    wire = P.to_wire(hello())
    del wire["host"]
    with pytest.raises(P.ProtocolError, match="missing fields"):
        P.from_wire(wire)
    wire = {**P.to_wire(hello()), "colour": "red"}
    with pytest.raises(P.ProtocolError, match="unexpected fields"):
        P.from_wire(wire)


def test_an_optional_field_needs_a_default():
    with pytest.raises(TypeError, match="needs a default"):
        P.codec._f(P.NAME, optional=True)


def request(**kw):
    return P.JobRequest(command=("python", "train.py"), cwd="/tmp", env=(), **kw)


def test_a_script_hash_travels_and_is_left_off_when_unknown():
    assert "script_hash" not in P.to_wire(P.Submit(request=request()))["request"]
    digest = "ab" * 32
    got = P.decode(P.encode(P.Submit(request=request(script_hash=digest))))
    assert got.request.script_hash == digest


@pytest.mark.parametrize("bad", ["x", "AB" * 32, "ab" * 31, "ab" * 33, 7])
def test_a_bad_script_hash_is_invalid(bad):
    wire = P.to_wire(P.Submit(request=request()))
    wire["request"]["script_hash"] = bad
    with pytest.raises(P.ProtocolError) as e:
        P.decode(msgpack.packb(wire))
    assert e.value.code == P.INVALID


def test_an_exit_out_of_memory_travels_and_a_plain_one_leaves_the_flag_off():
    plain = P.WorkerExited(node_id="n1", epoch=1, job_id="7", placement_id="7.1", rank=0, exit_code=1)
    assert "oom" not in P.to_wire(plain)  # a scheduler that predates it reads this exit
    oom = P.WorkerExited(node_id="n1", epoch=1, job_id="7", placement_id="7.1", rank=0, exit_code=1, oom=True)
    assert P.decode(P.encode(oom)).oom is True
    status = P.WorkerStatus(job_id="7", placement_id="7.1", rank=0, pid=5, running=False, exit_code=1, oom=True)
    assert P.decode(P.encode(P.NodeStatus(node_id="n1", epoch=1, gpus=(), workers=(status,)))).workers[0].oom
    wire = P.to_wire(oom)
    wire["oom"] = "yes"
    with pytest.raises(P.ProtocolError) as e:
        P.decode(msgpack.packb(wire))
    assert e.value.code == P.INVALID


def test_a_jobs_prediction_travels_and_a_view_without_one_leaves_it_off():
    view = P.JobView("7", "t", "u", "q", "guaranteed", "pending", 1, 1, 1.0, None, None, "", "", (), 0, None)
    assert "prediction" not in P.to_wire(P.JobsReply(jobs=(view,), total=1))["jobs"][0]
    pred = P.PredictionView(p50_s=60.0, p90_s=90.0, level="family", history=4)
    got = P.decode(P.encode(P.JobsReply(jobs=(dataclasses.replace(view, prediction=pred),), total=1)))
    assert got.jobs[0].prediction == pred
    wire = P.to_wire(P.JobsReply(jobs=(dataclasses.replace(view, prediction=pred),), total=1))
    wire["jobs"][0]["prediction"]["p90_s"] = -1.0
    with pytest.raises(P.ProtocolError) as e:
        P.decode(msgpack.packb(wire))
    assert e.value.code == P.INVALID
