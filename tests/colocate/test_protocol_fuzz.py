"""Property tests of colocate.protocol: decode never raises anything but ProtocolError, and valid messages
round-trip exactly through msgpack and JSON."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colocate import protocol as P
from colocate.base.vocab import SloState
from colocate.protocol import ProtocolError
from tests.support import examples

BYTES = settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
STRUCTURES = settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_protocol_error(data, decoder=P.decode):
    try:
        msg = decoder(data)
    except ProtocolError as e:
        assert e.code in P.ERROR_CODES
        return None
    # whatever decodes is a valid message that encodes again to the same message
    assert type(msg) in P.MESSAGE_TYPES.values()
    assert P.decode(P.encode(msg)) == msg
    return msg


# ------------------------------------------------------------------ valid-message strategies

# ids and names: any text but control characters (the codec refuses those: they reach other users' terminals)
printable = st.characters(exclude_categories=("Cc", "Cs"))
ids = st.text(printable, min_size=1, max_size=P.MAX_ID_CHARS)
texts = st.text(max_size=200) | st.text(min_size=P.MAX_TEXT_CHARS, max_size=P.MAX_TEXT_CHARS)
sizes = st.integers(0, 2**63 - 1)
counts = st.integers(0, 2**63 - 1) | st.integers(0, 100)
seconds = st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False) | st.integers(0, 10**6)
report_seconds = st.floats(0.0, P.MAX_REPORT_S) | st.integers(0, 10**6)  # a BatchReport's (bounded)
shares = st.floats(0.0, 1.0) | st.sampled_from([0, 1])
priorities = st.sampled_from(["guaranteed", "opportunistic"])
pids = st.integers(0, 2**31 - 1)

limits = st.builds(P.Limits, seq=counts, mem_cap=sizes, sm_share=shares, gate=st.booleans())
gpu_infos = st.builds(P.GpuInfo, index=st.integers(0, 64), mem_total=sizes, utilization=shares,
                      kind=st.sampled_from(["sim", "cuda"]))  # fmt: skip
job_infos = st.builds(
    P.JobInfo, job_id=ids, gpu=st.integers(0, 64), priority=priorities, pid=pids, mem_cap=sizes,
    sm_share=shares, mem_reserved=sizes, mem_allocated_peak=sizes, host_bytes=sizes,
    throughput=st.floats(0.0, 1e9), slo_state=st.sampled_from(list(SloState)), iterations=counts,
)  # fmt: skip

names = st.text(printable, max_size=P.MAX_ID_CHARS)
node_ids = st.text(printable, min_size=1, max_size=128)
exit_codes = st.integers(-(2**31), 2**31 - 1)
worker_registers = st.integers(0, 63).flatmap(lambda r: st.builds(
    P.Register, job_id=st.text(printable, min_size=1, max_size=100).map(lambda j: f"{j}/{r}"), pid=pids, gpu=st.integers(0, 64),
    priority=priorities, mem_request=st.none() | sizes, sm_share=shares, mem_cap=sizes, epoch=counts,
    token=st.text(max_size=128), sm_request=shares, rank=st.just(r), world_size=st.integers(r + 1, 1 << 20)))
requests = st.builds(
    P.JobRequest, command=st.lists(st.text(max_size=40), min_size=1, max_size=6), cwd=texts,
    env=st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=60), max_size=6),
    workers=st.integers(1, 4096), gpus=st.integers(0, 64), gpu_mem=sizes, priority=priorities, queue=names,
    name=names, user=names, estimate_s=st.none() | seconds, iterations=st.none() | st.integers(1, 1 << 40),
    epochs=st.none() | st.integers(1, 1 << 20), script_hash=st.just("") | st.text("0123456789abcdef", min_size=64,
                                                                                   max_size=64),
    sm_share=st.none() | st.floats(0.01, 1.0))
auto_requests = st.builds(  # what a submit leaves to its recommendation is not stated too
    P.JobRequest, command=st.lists(st.text(max_size=40), min_size=1, max_size=6), cwd=texts, env=st.just({}),
    auto=st.lists(st.sampled_from(P.AUTO), unique=True, max_size=2).map(tuple))
# what a job teaches the cluster (torch_hooks.features, colocate.node.progress)
kinds = st.text(printable, min_size=1, max_size=64)
flops = st.floats(0.0, 1e30) | st.integers(0, 10**12)
layer_groups = st.builds(P.LayerGroup, kind=kinds, count=st.integers(1, 1 << 40), params=counts, flops=flops,
                         dims=st.dictionaries(st.text(printable, min_size=1, max_size=32), counts, max_size=16))
model_features = st.builds(
    P.ModelFeatures, params=counts, trainable_params=counts, layers=st.lists(layer_groups, max_size=4),
    layer_counts=st.dictionaries(kinds, counts, max_size=6), forward_flops=flops, flops_per_iteration=flops,
    batch_size=st.none() | counts, optimizers=st.lists(kinds, max_size=3),
    param_dtype=st.text(printable, max_size=32), autocast_dtype=st.text(printable, max_size=32))
hardware_features = st.builds(
    P.HardwareFeatures, kind=st.sampled_from(["sim", "cuda"]), name=names, mem_total=sizes, sm_count=counts,
    sm_clock_mhz=counts, mem_clock_mhz=counts, mem_bandwidth=flops, peak_flops=flops, gpus=st.integers(1, 1 << 20))
features = st.builds(P.Features, model=model_features, hardware=hardware_features,
                     loader_batches=st.none() | counts, iterations_hint=st.none() | counts,
                     epochs_hint=st.none() | counts, total_iterations=st.none() | counts, read_s=seconds)
progresses = st.builds(
    P.JobProgress, job_id=ids, rank=counts, iterations=counts, step_p50_s=seconds, step_p90_s=seconds, window=counts,
    mem_reserved_peak=sizes, mem_allocated_peak=sizes, busy_fraction=shares, total_iterations=st.none() | counts,
    since_report_s=seconds, features=st.none() | features)
worker_statuses = st.builds(P.WorkerStatus, job_id=ids, placement_id=names, rank=counts, pid=pids,
                            running=st.booleans(), exit_code=st.none() | exit_codes, oom=st.booleans())
job_views = st.builds(
    P.JobView, job_id=ids, name=names, user=names, queue=names, priority=priorities,
    state=st.sampled_from(["pending", "placing", "running", "succeeded", "failed", "cancelled"]), workers=counts,
    gpus=counts, submitted_at=seconds, started_at=st.none() | seconds, ended_at=st.none() | seconds, reason=texts,
    placement_id=names, nodes=st.lists(names, max_size=4), attempts=counts, exit_code=st.none() | exit_codes,
    progress=st.none() | progresses,
    prediction=st.none() | st.builds(P.PredictionView, p50_s=seconds, p90_s=seconds, level=names, history=counts,
                                     remaining=st.booleans()), advice=texts, learning=st.booleans())
hashes = st.just("") | st.text("0123456789abcdef", min_size=64, max_size=64)
predictions = st.builds(P.PredictionView, p50_s=seconds, p90_s=seconds, level=names, history=counts,
                        remaining=st.booleans())
figures = st.none() | st.builds(P.FigureView, value=seconds, level=names, history=counts, label=names)
recommendations = st.builds(
    P.RecommendationView, exact=names, family=names, identity=names, gpu_mem=figures, sm_share=figures, gpus=figures,
    gpu_type=figures, run_time=st.none() | predictions,
    why_not=st.dictionaries(st.sampled_from(P.FIGURES), texts, max_size=5))
node_views = st.builds(P.NodeView, node_id=names, host=names, up=st.booleans(), gpu_model=names, gpus=counts,
                       gpus_allocated=counts, gpus_shared=counts, utilization=shares, workers=counts)

CLUSTER_MESSAGES = {
    P.NodeHello: st.builds(P.NodeHello, node_id=node_ids, epoch=counts, host=names,
                           gpus=st.lists(st.builds(P.NodeGpu, index=counts, model=names, mem_total=sizes,
                                                   speed=shares), max_size=8),
                           cpu_milli=counts, mem_mib=counts),
    P.NodeHeartbeat: st.builds(P.NodeHeartbeat, node_id=node_ids, epoch=counts),
    P.NodeStatus: st.builds(P.NodeStatus, node_id=node_ids, epoch=counts,
                            gpus=st.lists(st.builds(P.GpuStatus, index=counts, utilization=shares, mem_used=sizes),
                                          max_size=8),
                            workers=st.lists(worker_statuses, max_size=8), progress=st.lists(progresses, max_size=3)),
    P.WorkerStarted: st.builds(P.WorkerStarted, node_id=node_ids, epoch=counts, job_id=ids, placement_id=names,
                               rank=counts, pid=pids, log_path=texts),
    P.WorkerExited: st.builds(P.WorkerExited, node_id=node_ids, epoch=counts, job_id=ids, placement_id=names,
                              rank=counts, exit_code=exit_codes, fenced=st.booleans(), oom=st.booleans()),
    P.StartRefused: st.builds(P.StartRefused, node_id=node_ids, epoch=counts, job_id=ids, placement_id=names,
                              reason=texts),
    P.NodeWelcome: st.builds(P.NodeWelcome, node_id=node_ids, scheduler_epoch=counts,
                             heartbeat_s=st.floats(0.01, 3600.0), liveness=st.integers(1, 1000)),
    P.StartPlacement: st.builds(
        P.StartPlacement, placement_id=names, job_id=ids, priority=priorities, request=requests,
        workers=st.lists(st.builds(P.WorkerLaunch, rank=counts, local_rank=counts,
                                   gpus=st.lists(counts, max_size=8)), max_size=8),
        world_size=st.integers(1, 1 << 20), group_rank=counts, master_addr=names, master_port=st.integers(0, 65535),
        start_mem=sizes, start_share=shares, cap_recommended=st.booleans()),
    P.StopPlacement: st.builds(P.StopPlacement, placement_id=names, job_id=ids, reason=texts,
                               grace_s=st.floats(0.0, 3600.0)),
    P.PromotePlacement: st.builds(P.PromotePlacement, placement_id=names, job_id=ids),
    P.PlacementsSettled: st.builds(P.PlacementsSettled, node_id=ids, placement_ids=st.lists(names, max_size=5).map(tuple)),
    P.Submit: st.builds(P.Submit, request=requests | auto_requests),
    P.Submitted: st.builds(P.Submitted, job_id=ids),
    P.JobsRequest: st.builds(P.JobsRequest, job_id=st.none() | ids, active_only=st.booleans(), offset=counts,
                             limit=st.integers(1, P.MAX_PAGE)),
    P.JobsReply: st.builds(P.JobsReply, jobs=st.lists(job_views, max_size=4), total=counts,
                           queued=st.dictionaries(names, counts, max_size=4)),
    P.NodesRequest: st.builds(P.NodesRequest),
    P.NodesReply: st.builds(P.NodesReply, nodes=st.lists(node_views, max_size=4), scheduler_epoch=counts),
    P.Cancel: st.builds(P.Cancel, job_id=ids),
    P.Ok: st.builds(P.Ok, message=texts),
    P.LogsRequest: st.builds(P.LogsRequest, job_id=ids, rank=st.none() | counts),
    P.LogsReply: st.builds(P.LogsReply, job_id=ids,
                           logs=st.lists(st.builds(P.LogRef, rank=counts, node_id=names, path=texts,
                                                   text=texts, truncated=st.booleans(), error=texts), max_size=4)),
    P.RecommendRequest: st.builds(P.RecommendRequest, job_id=ids, workers=st.integers(1, 4096),
                                  gpus=st.integers(0, 64))
    | st.builds(P.RecommendRequest, command=st.lists(st.text(max_size=40), min_size=1, max_size=6).map(tuple),
                script_hash=hashes, workers=st.integers(1, 4096), gpus=st.integers(0, 64)),
    P.RecommendReply: st.builds(P.RecommendReply, recommendation=recommendations),
    P.LogTailRequest: st.builds(P.LogTailRequest, request_id=names, job_id=ids, rank=counts,
                                max_bytes=st.integers(1, P.LOG_TAIL_MAX_BYTES)),
    P.LogTail: st.builds(P.LogTail, node_id=node_ids, epoch=counts, request_id=names,
                         text=texts,
                         truncated=st.booleans(), error=texts),
}  # fmt: skip

MESSAGES = {
    P.Register: st.builds(P.Register, job_id=ids, pid=pids, gpu=st.integers(0, 64), priority=priorities,
                          mem_request=st.none() | sizes, sm_share=shares, mem_cap=sizes, epoch=counts)
    | worker_registers,
    P.BatchReport: st.builds(P.BatchReport, job_id=ids, seq=counts, t_end=report_seconds, duration_s=report_seconds,
                             busy_s=report_seconds, device_start_s=report_seconds, mem_allocated_peak=sizes,
                             mem_reserved=sizes, mem_floor=sizes, host_bytes=sizes, host_bytes_touched=sizes,
                             limits_seq=counts, mem_reserved_peak=sizes),
    P.FeaturesReport: st.builds(P.FeaturesReport, job_id=ids, features=features),
    P.LimitsApplied: st.builds(P.LimitsApplied, job_id=ids, limits_seq=counts, applied_at=seconds),
    P.Goodbye: st.builds(P.Goodbye, job_id=ids, exit_code=st.none() | st.integers(-(2**31), 2**31 - 1),
                         reason=texts),
    P.Heartbeat: st.builds(P.Heartbeat, job_id=ids, sent_at=seconds),
    P.Welcome: st.builds(P.Welcome, job_id=ids, node_epoch=counts, limits=limits),
    P.SetLimits: st.builds(P.SetLimits, job_id=ids, limits=limits),
    P.Error: st.builds(P.Error, code=st.sampled_from(P.ERROR_CODES),
                       message=texts, job_id=st.none() | ids),
    P.CtlList: st.builds(P.CtlList),
    P.CtlSet: st.builds(P.CtlSet, job_id=ids, mem_cap=st.none() | sizes.filter(bool), sm_share=shares)
    | st.builds(P.CtlSet, job_id=ids, mem_cap=sizes.filter(bool), sm_share=st.none() | shares)
    | st.builds(P.CtlSet, job_id=ids, clear=st.just(True)),
    P.CtlJobs: st.builds(P.CtlJobs, node_epoch=counts, gpus=st.lists(gpu_infos, max_size=8),
                         jobs=st.lists(job_infos, max_size=8)),
    P.CtlOk: st.builds(P.CtlOk, message=texts),
    **CLUSTER_MESSAGES,
}  # fmt: skip
messages = st.one_of(*MESSAGES.values())


def test_strategies_cover_every_message_type():
    assert set(MESSAGES) == set(P.MESSAGE_TYPES.values())


@ROUND_TRIP
@given(messages)
def test_valid_messages_round_trip_exactly(msg):
    data = P.encode(msg)
    assert len(data) <= P.MAX_MESSAGE_BYTES
    out = P.decode(data)
    assert out == msg and type(out) is type(msg)
    assert P.decode_json(P.encode_json(msg)) == msg


# ------------------------------------------------------------------ decode never crashes


@BYTES
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_protocol_error(data):
    _decode_or_protocol_error(data)


@BYTES
@given(st.sampled_from(sorted(P.MESSAGE_TYPES)), st.integers(0, 13), st.binary(max_size=256))
def test_arbitrary_bytes_behind_a_valid_header(type_name, n_fields, tail):
    head = bytes([0x80 | (n_fields + 2)]) + b"".join(map(msgpack.packb, ["v", 1, "t", type_name]))
    _decode_or_protocol_error(head + tail)


scalars = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats() | st.text(max_size=40)
    | st.binary(max_size=20)
)  # fmt: skip
structures = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=12,
)


FIELD_NAMES = sorted({name for specs in P._SPECS.values() for name, _ in specs})


def _pack(obj) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError):  # ints beyond msgpack's 64-bit range
        return b"\xc1"


@STRUCTURES
@given(structures)
def test_arbitrary_msgpack_structures(obj):
    _decode_or_protocol_error(_pack(obj))


@pytest.mark.slow
@pytest.mark.timeout(300)
@STRUCTURES
@given(
    st.sampled_from(sorted(P.MESSAGE_TYPES)),
    st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=8), structures, max_size=14),
    st.sampled_from([1, 1, 1, 0, 2, None, True, "1"]),
)
def test_arbitrary_fields_under_a_valid_header(type_name, fields, version):
    wire = {**fields, "t": type_name}
    if version is not None:
        wire["v"] = version
    _decode_or_protocol_error(_pack(wire))


@STRUCTURES
@given(messages, st.data())
def test_one_field_replaced_by_anything(msg, data):
    wire = P.to_wire(msg)
    key = data.draw(st.sampled_from(sorted(wire)))
    wire[key] = data.draw(structures)
    _decode_or_protocol_error(_pack(wire))


@BYTES
@given(messages, st.data())
def test_mutated_encoding(msg, data):
    buf = bytearray(P.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and buf:
            del buf[pos : pos + data.draw(st.integers(1, 8))]
    _decode_or_protocol_error(bytes(buf))


@BYTES
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_arbitrary_json_text(data):
    _decode_or_protocol_error(data, P.decode_json)


@settings(max_examples=examples(500), deadline=None)
@given(messages, st.data())
def test_mutated_json(msg, data):
    text = P.encode_json(msg)
    pos = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 8))
    text = text[:pos] + data.draw(st.text(max_size=6)) + text[pos + cut :]
    _decode_or_protocol_error(text, P.decode_json)


def _nested_paths(obj, path=()):
    """Every (path, value) under a wire map: the keys and list indices leading to each value."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nested_paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nested_paths(v, path + (i,))


learned = st.one_of(MESSAGES[P.FeaturesReport], MESSAGES[P.NodeStatus].filter(lambda m: m.progress),
                    MESSAGES[P.Submit])


@STRUCTURES
@given(learned, st.data())
def test_a_nested_feature_or_progress_field_replaced_by_anything(msg, data):
    """Deep inside a job's features, progress or hints, any value decodes to a valid message or is refused with
    one line (never another exception)."""
    wire = P.to_wire(msg)
    paths = [p for p, _ in _nested_paths(wire) if len(p) >= 2]
    path = data.draw(st.sampled_from(paths))
    node = wire
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = data.draw(structures)
    try:
        P.decode(_pack(wire))
    except ProtocolError as exc:
        assert exc.code in P.DECODE_ERRORS and "\n" not in str(exc)


@given(text=st.text(alphabet=st.characters(max_codepoint=0x17F), max_size=40))
def test_a_printable_string_rule_refuses_exactly_what_has_a_control_character(text):
    """The ASCII fast path (``str.isprintable``) and the general one (the C0/DEL/C1 pattern) agree."""
    from colocate.protocol.codec import _CONTROL, Str

    rule = Str(printable=True)
    if _CONTROL.search(text):
        with pytest.raises(P.ProtocolError, match="control characters"):
            rule.check(text, "f")
    else:
        assert rule.check(text, "f") == text
