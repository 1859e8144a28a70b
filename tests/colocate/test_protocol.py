"""Table-driven tests of colocate.protocol: round trips of every message, and rejected inputs."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import pytest

from colocate import protocol as P
from colocate.protocol import ProtocolError

LIMITS = P.Limits(seq=3, mem_cap=2 << 30, sm_share=0.25, gate=True)
GPU = P.GpuInfo(index=0, mem_total=16 << 30, utilization=0.5, kind="sim")
JOB = P.JobInfo(
    job_id="train-a", gpu=0, priority="guaranteed", pid=4242, mem_cap=8 << 30, sm_share=1.0,
    mem_reserved=3 << 30, mem_allocated_peak=5 << 30, host_bytes=0, throughput=27.5, slo_state="ok",
    iterations=1000,
)  # fmt: skip

VALID = [
    P.Register("train-a", pid=4242, gpu=0, priority="guaranteed", mem_request=None, sm_share=1.0,
               mem_cap=8 << 30, epoch=0),
    P.Register("opp-b", pid=7, gpu=1, priority="opportunistic", mem_request=1 << 30, sm_share=0.3,
               mem_cap=1 << 30, epoch=5),
    P.BatchReport("train-a", seq=17, t_end=1234.5, duration_s=0.036, busy_s=0.02, device_start_s=0.004,
                  mem_allocated_peak=5 << 30, mem_reserved=6 << 30, mem_floor=0, host_bytes=1 << 20,
                  host_bytes_touched=4096, limits_seq=3),
    P.LimitsApplied("opp-b", limits_seq=4, applied_at=99.0),
    P.Goodbye("opp-b", exit_code=0, reason="finished"),
    P.Goodbye("opp-b", exit_code=-9, reason="killed by SIGKILL"),
    P.Goodbye("opp-b", exit_code=None, reason=""),
    P.Heartbeat("train-a", sent_at=12.25),
    P.Welcome("train-a", node_epoch=2, limits=LIMITS),
    P.SetLimits("opp-b", limits=P.Limits(seq=9, mem_cap=0, sm_share=0.0, gate=False)),
    P.Error(code="version", message="expected protocol version 1, got 2", job_id=None),
    P.Error(code="unknown_job", message="no such job", job_id="ghost"),
    P.CtlList(),
    P.CtlSet("opp-b", mem_cap=512 << 20, sm_share=None),
    P.CtlSet("opp-b", mem_cap=None, sm_share=0.5),
    P.CtlSet("opp-b", mem_cap=1, sm_share=1.0),
    P.CtlJobs(node_epoch=1, gpus=(GPU, P.GpuInfo(1, 80 << 30, 0.0, "cuda")), jobs=(JOB,)),
    P.CtlJobs(node_epoch=0, gpus=(), jobs=()),
    P.CtlOk(message="opp-b: mem_cap set to 512 MiB"),
    P.Register("ü-ジョブ-" + "x" * 120, pid=1, gpu=0, priority="guaranteed", mem_request=0, sm_share=0,
               mem_cap=0, epoch=0),
    P.Register("ddp-1/1", pid=9, gpu=1, priority="guaranteed", mem_request=None, sm_share=1.0, mem_cap=8 << 30,
               epoch=1, token="t" * 32, sm_request=1.0, rank=1, world_size=2),  # a torchrun worker: JOB/RANK
    P.Register("a/b/0", pid=9, gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0, mem_cap=0,
               epoch=1, rank=0, world_size=4),  # a job id may itself hold "/"
]  # fmt: skip


REQUEST = P.JobRequest(command=("torchrun", "--nproc-per-node", "2", "train.py"), cwd="/home/u/proj",
                       env={"PATH": "/usr/bin", "HOME": "/home/u"}, workers=2, gpus=1, gpu_mem=8 << 30,
                       priority="opportunistic", queue="research", name="ddp", user="u", estimate_s=3600.0)
CLUSTER = [
    P.NodeHello("n1", epoch=1700000000000, host="10.0.0.5", gpus=(P.NodeGpu(0, "NVIDIA H100", 80 << 30),),
                cpu_milli=16000, mem_mib=131072),
    P.NodeHello("n2", epoch=0, host="", gpus=()),
    P.NodeHeartbeat("n1", epoch=3),
    P.NodeStatus("n1", epoch=3, gpus=(P.GpuStatus(0, 0.5, 1 << 30), P.GpuStatus(1, 0.0, 0)),
                 workers=(P.WorkerStatus("ddp-1", "p-1", 0, 4242, True),
                          P.WorkerStatus("ddp-1", "p-1", 1, 4243, False, exit_code=143))),
    P.WorkerStarted("n1", epoch=3, job_id="ddp-1", placement_id="p-1", rank=1, pid=4243,
                    log_path="/var/log/colocate/ddp-1/worker-1.log"),
    P.WorkerExited("n1", epoch=3, job_id="ddp-1", placement_id="p-1", rank=1, exit_code=-1),
    P.StartRefused("n1", epoch=3, job_id="ddp-1", placement_id="p-1", reason="GPU 7 is not on this node"),
    P.NodeWelcome("n1", scheduler_epoch=9, heartbeat_s=1.0, liveness=3),
    P.StartPlacement("p-1", job_id="ddp-1", priority="opportunistic", request=REQUEST,
                     workers=(P.WorkerLaunch(0, 0, (0,)), P.WorkerLaunch(1, 1, (1,))), world_size=2, group_rank=0,
                     master_addr="10.0.0.5", master_port=29500),
    P.StopPlacement("p-1", job_id="ddp-1", reason="preempted"),
    P.StopPlacement("p-1", job_id="ddp-1", reason="", grace_s=0.0),
    P.PromotePlacement("p-1", job_id="ddp-1"),
    P.PlacementsSettled(node_id="n1", placement_ids=("p-1", "p-2")),
    P.Submit(REQUEST),
    P.Submit(P.JobRequest(command=("python", "t.py"), cwd="/", env={})),
    P.Submitted("ddp-1"),
    P.JobsRequest(),
    P.JobsRequest(job_id="ddp-1", active_only=True, offset=10, limit=5),
    P.JobsReply(jobs=(P.JobView("ddp-1", "ddp", "u", "research", "opportunistic", "running", 2, 1, 1.7e9, 1.7e9 + 5,
                                None, "", "p-1", ("n1",), 1, None),), total=1, queued={"research": 3}),
    P.NodesRequest(),
    P.NodesReply(nodes=(P.NodeView("n1", "10.0.0.5", True, "NVIDIA H100", 8, 2, 1, 0.25, 3),), scheduler_epoch=9),
    P.Cancel("ddp-1"),
    P.Ok("cancelled"),
    P.LogsRequest("ddp-1"),
    P.LogsRequest("ddp-1", rank=1),
    P.LogsReply("ddp-1", logs=(P.LogRef(1, "n1", text="step 1\n", truncated=True),
                               P.LogRef(2, "n2", error="node n2 is down"))),
    P.LogTailRequest(request_id="7.1", job_id="ddp-1", rank=1, max_bytes=4096),
    P.LogTail(node_id="n1", epoch=3, request_id="7.1", text="step 1\n", truncated=False),
]  # fmt: skip

# what a job teaches the cluster: its features (job -> node), its progress (node -> scheduler), its total (submit)
FEATURES = P.Features(
    model=P.ModelFeatures(
        params=62006, trainable_params=62006,
        layers=(P.LayerGroup("Conv2d", 2, 2432, 1.2e8, {"in": 3, "out": 16, "kernel": 9, "stride": 1, "groups": 1}),
                P.LayerGroup("LSTM", 1, 8448, 3.0e6, {"in": 32, "hidden": 32, "layers": 1, "directions": 1,
                                                     "seq": 20})),
        layer_counts={"Conv2d": 2, "LSTM": 1, "ReLU": 2}, forward_flops=1.23e8, flops_per_iteration=3.69e8,
        batch_size=32, optimizers=("Adam",), param_dtype="float32", autocast_dtype="bfloat16"),
    hardware=P.HardwareFeatures("cuda", "NVIDIA H100 80GB HBM3", 80 << 30, 132, 1980, 2619, 3.35e12, 6.7e13, 8),
    loader_batches=500, iterations_hint=None, epochs_hint=3, total_iterations=1500, read_s=0.002)
PROGRESS = P.JobProgress("ddp-1", rank=0, iterations=120, step_p50_s=0.031, step_p90_s=0.04, window=64,
                         mem_reserved_peak=3 << 30, mem_allocated_peak=2 << 30, busy_fraction=0.6,
                         total_iterations=1500, since_report_s=0.2, features=FEATURES)
LEARNED = [
    P.FeaturesReport("ddp-1/0", features=FEATURES),
    P.NodeStatus("n1", epoch=3, gpus=(), workers=(), progress=(PROGRESS, dataclasses.replace(PROGRESS, rank=1,
                                                                                             features=None))),
    P.Submit(dataclasses.replace(REQUEST, iterations=1500, epochs=None)),
    P.JobsReply(jobs=(P.JobView("ddp-1", "ddp", "u", "q", "guaranteed", "running", 2, 1, 1.7e9, 1.7e9 + 5, None, "",
                                "p-1", ("n1",), 1, None, progress=PROGRESS),), total=1),
]  # fmt: skip
CLUSTER += LEARNED
# what the cluster recommends (colocate recommend; submit --gpu-mem auto --sm-share auto)
RECOMMENDED = [
    P.RecommendRequest(command=("python", "train.py", "--bs", "64"), script_hash="ab" * 32, gpus=2),
    P.RecommendRequest(job_id="ddp-1"),
    P.RecommendReply(P.RecommendationView(
        exact="0123456789abcdef", family="fedcba9876543210", identity="content",
        gpu_mem=P.FigureView(600 << 20, "family", 4), sm_share=P.FigureView(0.4, "exact", 2),
        gpu_type=P.FigureView(0.12, "family", 4, label="V100"),
        run_time=P.PredictionView(p50_s=300.0, p90_s=420.0, level="exact+gpus", history=3),
        why_not={"gpus": "no: runs at one GPU count only (1), a scaling fit needs two or more"})),
    P.Submit(dataclasses.replace(REQUEST, gpu_mem=0, auto=("gpu_mem", "sm_share"))),
    P.StartPlacement(placement_id="p-1", job_id="ddp-1", priority="opportunistic", request=REQUEST,
                     workers=(P.WorkerLaunch(0, 0, (1,)),), world_size=1, group_rank=0, master_addr="10.0.0.5",
                     master_port=29500, start_mem=600 << 20, start_share=0.4),
]  # fmt: skip
CLUSTER += RECOMMENDED


@pytest.mark.parametrize("msg", CLUSTER, ids=lambda m: m.TYPE)
def test_round_trip_cluster_messages(msg):
    assert P.decode(P.encode(msg)) == msg
    assert P.decode_json(P.encode_json(msg)) == msg


def test_every_message_type_has_a_sample():
    assert {type(m) for m in VALID + CLUSTER} == set(P.MESSAGE_TYPES.values())
    for name, cls in P.MESSAGE_TYPES.items():
        assert cls.TYPE == name


@pytest.mark.parametrize("msg", VALID, ids=lambda m: m.TYPE)
def test_round_trip_msgpack(msg):
    data = P.encode(msg)
    assert isinstance(data, bytes)
    out = P.decode(data)
    assert out == msg and type(out) is type(msg)
    assert P.decode(bytearray(data)) == msg and P.decode(memoryview(data)) == msg


@pytest.mark.parametrize("msg", VALID, ids=lambda m: m.TYPE)
def test_round_trip_json(msg):
    text = P.encode_json(msg)
    assert P.decode_json(text) == msg
    assert P.decode_json(text.encode()) == msg


@pytest.mark.parametrize("msg", VALID, ids=lambda m: m.TYPE)
def test_wire_map_carries_version_and_type(msg):
    wire = msgpack.unpackb(P.encode(msg), raw=False)
    assert wire["v"] == P.PROTOCOL_VERSION == 3
    assert wire["t"] == msg.TYPE
    left_off = {f for f, d in P.codec._OPTIONAL[type(msg)].items() if getattr(msg, f) == d}  # optional, at default
    assert set(wire) - {"v", "t"} == {f for f, _ in P._SPECS[type(msg)]} - left_off


def test_messages_are_frozen_and_hashable():
    with pytest.raises(AttributeError):
        VALID[0].pid = 1  # type: ignore[misc]
    assert len(set(VALID)) == len(VALID)


def test_ints_become_floats_where_floats_are_expected():
    msg = P.decode(_pack(_wire(VALID[0], sm_share=1)))
    assert type(msg.sm_share) is float and msg.sm_share == 1.0
    assert type(P.Heartbeat("j", 3).sent_at) is float


def test_lists_become_tuples():
    msg = P.CtlJobs(node_epoch=0, gpus=[GPU], jobs=[JOB])
    assert msg.gpus == (GPU,) and msg.jobs == (JOB,)


def test_protocol_error_is_a_value_error_and_becomes_an_error_reply():
    with pytest.raises(ValueError) as info:
        P.decode(_pack(_wire(VALID[0], v=1)))
    err = info.value
    assert isinstance(err, ProtocolError) and err.code == "version"
    reply = err.to_error(job_id="train-a")
    assert reply == P.Error(code="version", message=str(err), job_id="train-a")
    assert P.decode(P.encode(reply)) == reply


def test_construction_validates_like_decode():
    with pytest.raises(ProtocolError) as info:
        P.Limits(seq=0, mem_cap=0, sm_share=1.5, gate=False)
    assert info.value.code == "invalid" and "sm_share" in str(info.value)
    with pytest.raises(ProtocolError):
        P.Welcome("j", node_epoch=0, limits={"seq": 0, "mem_cap": 0, "sm_share": 0.5, "gate": False})
    with pytest.raises(ProtocolError):
        P.Register("j", pid=1, gpu=0, priority="guaranteed", mem_request=None, sm_share=0.5,
                   mem_cap=-1, epoch=0)  # fmt: skip


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError):
        P.encode({"v": 3, "t": "ctl_list"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        P.encode(LIMITS)  # a nested record is not a message


# ------------------------------------------------------------------ invalid inputs


def _wire(msg, drop=(), **changes):
    wire = P.to_wire(msg)
    for key in drop:
        del wire[key]
    wire.update(changes)
    return wire


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


REG, BATCH, WELCOME, GOODBYE, CTLJOBS = VALID[0], VALID[2], VALID[8], VALID[4], VALID[16]
JOB_WIRE, GPU_WIRE = P.to_wire(CTLJOBS)["jobs"][0], P.to_wire(CTLJOBS)["gpus"][0]
GOOD = P.encode(REG)
LIMITS_WIRE = P.to_wire(WELCOME)["limits"]

INVALID = [
    # (id, raw bytes, expected code)
    ("garbage", b"\xc1\xc1\xc1", "malformed"),
    ("empty", b"", "malformed"),
    ("truncated", GOOD[:-3], "malformed"),
    ("trailing-bytes", GOOD + b"\x00", "malformed"),
    ("oversize", b"\x80" * (P.MAX_MESSAGE_BYTES + 1), "malformed"),
    ("oversize-valid-prefix", GOOD + b" " * P.MAX_MESSAGE_BYTES, "malformed"),
    ("non-map-list", _pack([1, 2, 3]), "malformed"),
    ("non-map-int", _pack(7), "malformed"),
    ("non-map-nil", _pack(None), "malformed"),
    ("bad-utf8", b"\x82\xa1v\x01\xa1t\xa2\xff\xfe", "malformed"),
    ("non-str-key", b"\x81\x01\x01", "malformed"),
    ("too-many-keys", _pack({str(i): i for i in range(P.MAX_LIST_ITEMS + 1)}), "malformed"),
    ("missing-v", _pack(_wire(REG, drop=["v"])), "version"),
    ("wrong-version", _pack(_wire(REG, v=1)), "version"),
    ("version-zero", _pack(_wire(REG, v=0)), "version"),
    ("version-as-str", _pack(_wire(REG, v="2")), "version"),
    ("version-as-bool", _pack(_wire(REG, v=True)), "version"),
    ("version-as-float", _pack(_wire(REG, v=3.0)), "version"),
    ("wrong-version-unknown-type", _pack({"v": 99, "t": "from_the_future"}), "version"),
    ("missing-t", _pack(_wire(REG, drop=["t"])), "malformed"),
    ("t-not-str", _pack(_wire(REG, t=3)), "malformed"),
    ("unknown-type", _pack(_wire(REG, t="launch_missiles")), "unknown_type"),
    ("type-case", _pack(_wire(REG, t="Register")), "unknown_type"),
    ("missing-field", _pack(_wire(REG, drop=["epoch"])), "invalid"),
    ("extra-field", _pack(_wire(REG, color="red")), "invalid"),
    ("bytes-key-extra", b"\x83\xa1v\x03\xa1t\xa8ctl_list\xc4\x01x\x01", "invalid"),
    ("bool-as-int", _pack(_wire(REG, pid=True)), "invalid"),
    ("bool-as-float", _pack(_wire(REG, sm_share=False)), "invalid"),
    ("float-as-int", _pack(_wire(REG, mem_cap=1.0)), "invalid"),
    ("str-as-int", _pack(_wire(REG, gpu="0")), "invalid"),
    ("nil-not-optional", _pack(_wire(REG, mem_cap=None)), "invalid"),
    ("int-as-bool", _pack(_wire(WELCOME, limits={**LIMITS_WIRE, "gate": 1})), "invalid"),
    ("nan", _pack(_wire(BATCH, duration_s=math.nan)), "invalid"),
    ("inf", _pack(_wire(BATCH, busy_s=math.inf)), "invalid"),
    ("neg-inf", _pack(_wire(BATCH, t_end=-math.inf)), "invalid"),
    ("negative-duration", _pack(_wire(BATCH, duration_s=-0.1)), "invalid"),
    ("negative-size", _pack(_wire(BATCH, mem_reserved=-1)), "invalid"),
    ("negative-optional-size", _pack(_wire(REG, mem_request=-5)), "invalid"),
    ("negative-seq", _pack(_wire(BATCH, seq=-1)), "invalid"),
    ("int-over-i64", _pack(_wire(BATCH, host_bytes=2**64 - 1)), "invalid"),
    ("share-1.5", _pack(_wire(REG, sm_share=1.5)), "invalid"),
    ("share-negative", _pack(_wire(REG, sm_share=-0.01)), "invalid"),
    ("nested-share-1.5", _pack(_wire(WELCOME, limits={**LIMITS_WIRE, "sm_share": 1.5})), "invalid"),
    ("nested-not-map", _pack(_wire(WELCOME, limits=[3, 0, 0.5, True])), "invalid"),
    ("nested-missing", _pack(_wire(WELCOME, limits={"seq": 1})), "invalid"),
    ("nested-extra", _pack(_wire(WELCOME, limits={**LIMITS_WIRE, "v": 3})), "invalid"),
    ("bad-priority", _pack(_wire(REG, priority="best-effort")), "invalid"),
    ("empty-id", _pack(_wire(REG, job_id="")), "invalid"),
    ("too-long-id", _pack(_wire(REG, job_id="x" * 129)), "invalid"),
    ("too-long-message", _pack(_wire(GOODBYE, reason="y" * 4097)), "invalid"),
    ("too-long-slo-state", _pack(_wire(CTLJOBS, jobs=[{**JOB_WIRE, "slo_state": "z" * 33}])), "invalid"),
    ("exit-code-overflow", _pack(_wire(GOODBYE, exit_code=2**40)), "invalid"),
    ("list-not-list", _pack(_wire(CTLJOBS, gpus={"0": 1})), "invalid"),
    ("list-item-bad", _pack(_wire(CTLJOBS, gpus=[{**GPU_WIRE, "kind": "tpu"}])), "invalid"),
    ("list-item-not-map", _pack(_wire(CTLJOBS, jobs=[1])), "invalid"),
    ("utilization-1.5", _pack(_wire(CTLJOBS, gpus=[{**GPU_WIRE, "utilization": 1.5}])), "invalid"),
    ("ctlset-both-none", _pack({"v": 3, "t": "ctl_set", "job_id": "a", "mem_cap": None, "sm_share": None}),
     "invalid"),
    ("ctllist-extra", _pack({"v": 3, "t": "ctl_list", "x": 1}), "invalid"),
    ("error-empty-code", _pack({"v": 3, "t": "error", "code": "", "message": "", "job_id": None}), "invalid"),
    ("ext-type", _pack(_wire(REG, pid=msgpack.ExtType(5, b"ab"))), "invalid"),
    ("bin-as-str", _pack(_wire(REG, job_id=b"train-a")), "invalid"),
    ("register-missing-rank", _pack(_wire(REG, drop=["rank"])), "invalid"),  # protocol 2's Register
    ("rank-not-in-id", _pack(_wire(REG, rank=1, world_size=2)), "invalid"),  # "train-a" is no "JOB/1"
    ("rank-outside-world", _pack(_wire(REG, job_id="j/2", rank=2, world_size=2)), "invalid"),
    ("world-size-zero", _pack(_wire(REG, world_size=0)), "invalid"),
    ("negative-rank", _pack(_wire(REG, job_id="j/-1", rank=-1)), "invalid"),
    # ids and names are printed on other users' terminals: no newline, escape or other control character
    ("id-with-escape", _pack(_wire(REG, job_id="a\x1b[2Jb")), "invalid"),
    ("id-with-newline", _pack(_wire(REG, job_id="a\nb")), "invalid"),
    ("id-with-c1", _pack(_wire(REG, job_id="a\x9bb")), "invalid"),
    ("id-with-del", _pack(_wire(REG, job_id="a\x7f")), "invalid"),
]  # fmt: skip


@pytest.mark.parametrize("data,code", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_input_is_rejected_with_code(data, code):
    with pytest.raises(ProtocolError) as info:
        P.decode(data)
    assert info.value.code == code, str(info.value)
    assert info.value.code in P.ERROR_CODES


def test_version_error_names_expected_and_got():
    with pytest.raises(ProtocolError) as info:
        P.decode(_pack(_wire(REG, v=7)))
    assert f"expected {P.PROTOCOL_VERSION}" in str(info.value) and "got 7" in str(info.value)


def test_field_error_names_the_field():
    with pytest.raises(ProtocolError) as info:
        P.decode(_pack(_wire(WELCOME, limits={**LIMITS_WIRE, "sm_share": 1.5})))
    assert "Limits.sm_share" in str(info.value)


@pytest.mark.parametrize("kw, named", [
    ({"command": ("python", "x" * 5000)}, "JobRequest.command[1]: expected a string of 0..4096 characters"),
    ({"command": ("python", "\udcff")}, "JobRequest.command[1]: expected valid unicode text"),
    ({"env": {"A": "ok", "B": 3}}, "JobRequest.env['B']: expected a string, got 3"),
    ({"env": {"A": "é\udcff"}}, "JobRequest.env['A']: expected valid unicode text"),
])
def test_an_item_error_names_the_item(kw, named):
    """Lists and maps name the bad item (its index, its key), though valid items are checked without building
    their names."""
    with pytest.raises(ProtocolError) as info:
        P.JobRequest(**{"command": ("python",), "cwd": "/", "env": {}, **kw})
    assert str(info.value).startswith(named)


@pytest.mark.parametrize("data", [None, 5, "text", [b"\x80"]], ids=repr)
def test_decode_rejects_non_bytes(data):
    with pytest.raises(ProtocolError) as info:
        P.decode(data)  # type: ignore[arg-type]
    assert info.value.code == "malformed"


def test_ctlset_with_both_none_cannot_be_built():
    with pytest.raises(ProtocolError) as info:
        P.CtlSet("a", mem_cap=None, sm_share=None)
    assert info.value.code == "invalid"


JSON_INVALID = [
    ("garbage", "{not json", "malformed"),
    ("nan-literal", '{"v": 3, "t": "heartbeat", "job_id": "a", "sent_at": NaN}', "invalid"),
    ("huge-float", '{"v": 3, "t": "heartbeat", "job_id": "a", "sent_at": 1e999}', "invalid"),
    ("huge-int", '{"v": 3, "t": "heartbeat", "job_id": "a", "sent_at": ' + "9" * 400 + "}", "invalid"),
    ("too-many-digits", '{"v": 3, "t": "heartbeat", "job_id": "a", "sent_at": ' + "9" * 5000 + "}",
     "malformed"),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000, "malformed"),
    ("lone-surrogate", '{"v": 3, "t": "heartbeat", "job_id": "\\ud800", "sent_at": 1}', "invalid"),
    ("wrong-version", '{"v": 1, "t": "heartbeat", "job_id": "a", "sent_at": 1}', "version"),
    ("bad-utf8-bytes", b'{"v": 3, "t": "\xff"}', "malformed"),
    ("non-map", "[1, 2]", "malformed"),
    ("oversize", " " * (P.MAX_MESSAGE_BYTES + 1), "malformed"),
]


@pytest.mark.parametrize("data,code", [c[1:] for c in JSON_INVALID], ids=[c[0] for c in JSON_INVALID])
def test_invalid_json_is_rejected_with_code(data, code):
    with pytest.raises(ProtocolError) as info:
        P.decode_json(data)
    assert info.value.code == code, str(info.value)


def test_direction_groups_cover_every_message():
    groups = (P.JOB_TO_NODE + P.NODE_TO_JOB + P.CTL_TO_NODE + P.NODE_TO_CTL + P.NODE_TO_SCHEDULER
              + P.SCHEDULER_TO_NODE + P.CLIENT_TO_SCHEDULER + P.SCHEDULER_TO_CLIENT)
    assert set(groups) == set(P.MESSAGE_TYPES.values())
    assert P.Error in P.JOB_TO_NODE and P.Error in P.NODE_TO_JOB and P.Error in P.NODE_TO_CTL


def test_register_names_the_job_of_a_worker():
    assert VALID[-2].job == "ddp-1" and VALID[-1].job == "a/b" and REG.job == "train-a" and REG.rank is None


@pytest.mark.parametrize("name", ["a\nb", "\x1b[31mred", "tab\there", "c1\x85"])
def test_a_job_name_with_control_characters_is_refused_at_construction(name):
    with pytest.raises(ProtocolError, match="name: expected text without control characters"):
        P.JobRequest(command=("python", "t.py"), cwd="/", env={}, name=name)
    assert P.JobRequest(command=("python", "t.py"), cwd="/", env={}, name="ünïcode names-are_fine.2").name


def test_free_text_may_hold_newlines():
    assert P.Goodbye(job_id="a", exit_code=1, reason="line one\nline two").reason == "line one\nline two"


@pytest.mark.parametrize("wire_path, value, says", [
    (("request", "iterations"), 0, "JobRequest.iterations"),
    (("request", "epochs"), -1, "JobRequest.epochs"),
    (("request", "iterations"), "100", "JobRequest.iterations"),
])
def test_a_bad_hint_is_refused_in_one_line(wire_path, value, says):
    wire = P.to_wire(P.Submit(dataclasses.replace(REQUEST, iterations=10)))
    wire[wire_path[0]][wire_path[1]] = value
    with pytest.raises(ProtocolError) as info:
        P.from_wire(wire)
    assert info.value.code == P.INVALID and says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("change, says", [
    (lambda w: w["features"]["model"]["layers"][0].update(count=0), "LayerGroup.count"),
    (lambda w: w["features"]["model"]["layers"].extend([w["features"]["model"]["layers"][0]] * P.MAX_LAYER_GROUPS),
     "ModelFeatures.layers"),
    (lambda w: w["features"]["model"]["layer_counts"].update({"Lin\near": 1}), "ModelFeatures.layer_counts"),
    (lambda w: w["features"]["hardware"].update(kind="tpu"), "HardwareFeatures.kind"),
    (lambda w: w["features"]["hardware"].update(gpus=0), "HardwareFeatures.gpus"),
    (lambda w: w["features"]["model"].update(forward_flops=float("inf")), "ModelFeatures.forward_flops"),
    (lambda w: w["features"].update(read_s=-1.0), "Features.read_s"),
    (lambda w: w["features"]["model"].pop("optimizers"), "ModelFeatures: missing fields ['optimizers']"),
])
def test_bad_features_are_refused_in_one_line(change, says):
    wire = P.to_wire(P.FeaturesReport("ddp-1/0", features=FEATURES))
    change(wire)
    with pytest.raises(ProtocolError) as info:
        P.from_wire(wire)
    assert info.value.code == P.INVALID and says in str(info.value) and "\n" not in str(info.value)


def test_bad_progress_is_refused_in_one_line():
    wire = P.to_wire(LEARNED[1])
    wire["progress"][0]["busy_fraction"] = 1.5
    with pytest.raises(ProtocolError, match=r"JobProgress.busy_fraction"):
        P.from_wire(wire)


def _submit(last: int, n: int = 16) -> P.Submit:
    """A Submit of ``n`` variables of 60,000 characters and one of ``last`` (256..65,535: one msgpack header size)."""
    env = tuple((f"PAD{i}", "a" * 60_000) for i in range(n)) + (("LAST", "b" * last),)
    req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env=env, user="alice", gpus=1)
    return P.Submit(request=req, request_id="0" * 32)


def test_a_submit_leaves_room_for_the_start_placement_it_becomes():
    """The largest Submit accepted becomes a StartPlacement (with a node's 64 workers) that still fits one message;
    a larger Submit is refused by encode and by decode alike (invalid: one line naming the limit)."""
    limit = P.MAX_BYTES_OF["submit"]
    assert P.MAX_MESSAGE_BYTES - limit == P.START_HEADROOM and P.MAX_FRAME_BYTES > P.MAX_MESSAGE_BYTES
    base = len(msgpack.packb(P.to_wire(_submit(1000)), use_bin_type=True))
    fits = _submit(1000 + limit - base)
    assert len(P.encode(fits)) == limit and P.decode(P.encode(fits)) == fits
    start = P.StartPlacement(placement_id="9" * 40, job_id="9" * 40, priority="guaranteed", request=fits.request,
                             workers=tuple(P.WorkerLaunch(rank=r, local_rank=r, gpus=(r,)) for r in range(64)),
                             world_size=1 << 20, group_rank=4095, master_addr="m" * 128, master_port=65535,
                             cluster_id="c" * 128, start_mem=1 << 40, start_share=0.5, cap_recommended=True)
    assert len(P.encode(start)) <= P.MAX_MESSAGE_BYTES  # it can be sent to a node
    over = _submit(1000 + limit - base + 1)
    with pytest.raises(P.ProtocolError, match=f"over {limit}") as info:
        P.encode(over)
    assert info.value.code == P.INVALID
    data = msgpack.packb(P.to_wire(over), use_bin_type=True)  # what a client that does not check would send
    with pytest.raises(P.ProtocolError, match="over its") as info:
        P.decode(data)
    assert info.value.code == P.INVALID


@pytest.mark.parametrize("field", ["t_end", "duration_s", "busy_s", "device_start_s"])
def test_a_reports_seconds_are_bounded_so_what_a_node_derives_stays_finite(field):
    """QA: reports of 1e308 s were accepted, and their sum overflowed to inf in the node's progress."""
    ok = dataclasses.replace(VALID[2], **{field: P.MAX_REPORT_S})
    assert P.decode(P.encode(ok)) == ok
    for value in (1e308, P.MAX_REPORT_S * 1.0001):
        with pytest.raises(ProtocolError) as info:
            dataclasses.replace(VALID[2], **{field: value})
        assert info.value.code == "invalid" and field in str(info.value)
        with pytest.raises(ProtocolError) as info:
            P.decode(_pack(_wire(BATCH, **{field: value})))
        assert info.value.code == "invalid"
    assert sum([P.MAX_REPORT_S] * 10**6) < math.inf  # a million reports at the bound still sum to a number


def test_ctl_clear_round_trips_and_an_older_peer_without_the_field_sets_as_before():
    msg = P.CtlSet("opp-b", clear=True)
    assert P.decode(P.encode(msg)) == msg
    wire = P.to_wire(P.CtlSet("opp-b", mem_cap=1, sm_share=None))
    wire.pop("clear", None)
    assert P.from_wire(wire) == P.CtlSet("opp-b", mem_cap=1, sm_share=None)
