"""The protocol's vocabulary fields (job class, job state, device kind, error and refusal codes): each is its
``StrEnum`` member after a decode, travels as the member's plain string, and a string outside the vocabulary is
refused by the decoder as ``invalid``, in one line naming the field."""

from __future__ import annotations

import typing
from enum import StrEnum

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colocate import protocol as P
from colocate.base.vocab import DeviceKind, JobClass, JobState, SloState
from colocate.protocol.codec import Choice, Opt, Str
from tests.support import examples

REQUEST = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env=(), priority=JobClass.OPPORTUNISTIC)
VIEW = P.JobView(job_id="j1", name="n", user="u", queue="q", priority="opportunistic", state="running", workers=1,
                 gpus=1, submitted_at=0.0, started_at=None, ended_at=None, reason="", placement_id="", nodes=(),
                 attempts=0, exit_code=None)
INFO = P.JobInfo(job_id="j1", gpu=0, priority="guaranteed", pid=1, mem_cap=0, sm_share=1.0, mem_reserved=0,
                 mem_allocated_peak=0, host_bytes=0, throughput=0.0, slo_state="ok", iterations=0)
GPU = P.GpuInfo(index=0, mem_total=1 << 30, utilization=0.0, kind="sim")

# (message, path to a vocabulary field in its wire map, the field's vocabulary)
CASES = [
    (P.Register(job_id="j", pid=1, gpu=0, priority="guaranteed", mem_request=None, sm_share=1.0, mem_cap=0, epoch=0),
     ("priority",), JobClass),
    (P.Submit(request=REQUEST), ("request", "priority"), JobClass),
    (P.StartPlacement(placement_id="j.1", job_id="j", priority="opportunistic", request=REQUEST, workers=(),
                      world_size=1, group_rank=0, master_addr="h", master_port=1), ("priority",), JobClass),
    (P.JobsReply(jobs=(VIEW,), total=1), ("jobs", 0, "priority"), JobClass),
    (P.JobsReply(jobs=(VIEW,), total=1), ("jobs", 0, "state"), JobState),
    (P.CtlJobs(node_epoch=0, gpus=(GPU,), jobs=(INFO,)), ("gpus", 0, "kind"), DeviceKind),
    (P.CtlJobs(node_epoch=0, gpus=(GPU,), jobs=(INFO,)), ("jobs", 0, "priority"), JobClass),
    (P.CtlJobs(node_epoch=0, gpus=(GPU,), jobs=(INFO,)), ("jobs", 0, "slo_state"), SloState),
    (P.StartRefused(node_id="n", epoch=0, job_id="j", placement_id="j.1", reason="r", code="stale"), ("code",),
     P.Refusal),
    (P.Error(code="invalid", message="m", job_id=None), ("code",), P.ErrorCode),
]
IDS = [f"{type(m).__name__}.{'.'.join(map(str, path))}" for m, path, _ in CASES]


def _get(obj, path):
    for key in path:
        obj = obj[key] if isinstance(obj, (dict, list, tuple)) else getattr(obj, key)
    return obj


def _with(msg: P.Message, path, value) -> bytes:
    """``msg``'s msgpack encoding with the field at ``path`` set to ``value``."""
    wire = P.to_wire(msg)
    target = wire
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msgpack.packb(wire, use_bin_type=True)


@pytest.mark.parametrize(("msg", "path", "vocab"), CASES, ids=IDS)
def test_a_vocabulary_field_is_its_enum_member_after_decode_and_a_plain_string_on_the_wire(msg, path, vocab):
    for value in vocab:
        decoded = _get(P.decode(_with(msg, path, value.value)), path)
        assert type(decoded) is vocab and decoded is value
    raw = msgpack.unpackb(P.encode(P.decode(_with(msg, path, next(iter(vocab)).value))), raw=False)
    assert type(_get(raw, path)) is str  # the wire keeps the string, not an extension type


@pytest.mark.parametrize(("msg", "path", "vocab"), CASES, ids=IDS)
def test_an_unknown_vocabulary_value_is_refused_by_the_decoder_in_one_line(msg, path, vocab):
    with pytest.raises(P.ProtocolError) as e:
        P.decode(_with(msg, path, "no-such-value"))
    assert e.value.code == P.INVALID
    text = str(e.value)
    assert "\n" not in text and path[-1] in text and "no-such-value" in text
    assert "|".join(vocab) in text  # the choices are named
    with pytest.raises(P.ProtocolError):  # the JSON decoder refuses it the same way
        P.decode_json(P.encode_json(msg).replace(f'"{_get(msg, path)}"', '"no-such-value"'))


@settings(max_examples=examples(300), deadline=None)
@given(case=st.sampled_from(CASES), value=st.text(max_size=40) | st.integers(-(2**63), 2**64 - 1) | st.none() | st.booleans())
def test_any_value_outside_the_vocabulary_is_refused_and_any_inside_decodes_to_the_member(case, value):
    msg, path, vocab = case
    if isinstance(value, str) and value in tuple(vocab):
        assert _get(P.decode(_with(msg, path, value)), path) is vocab(value)
        return
    with pytest.raises(P.ProtocolError) as e:
        P.decode(_with(msg, path, value))
    assert e.value.code == P.INVALID and "\n" not in str(e.value)


def test_every_vocabulary_field_is_declared_as_its_enum():
    """Every field whose rule is a vocabulary (``Choice``) is annotated as that enum, and no string field keeps
    a list of choices of its own (a vocabulary is an enum, decoded into the member)."""
    checked = 0
    for cls, specs in P._SPECS.items():
        hints = typing.get_type_hints(cls)
        for name, spec in specs:
            inner = spec.inner if isinstance(spec, Opt) else spec
            assert not (isinstance(inner, Str) and inner.choices), f"{cls.__name__}.{name}: a Str with choices"
            if isinstance(inner, Choice):
                want = inner.vocab if inner is spec else inner.vocab | None
                assert issubclass(inner.vocab, StrEnum) and hints[name] == want, f"{cls.__name__}.{name}"
                checked += 1
    assert checked >= len({(type(m), p[-1]) for m, p, _ in CASES})
