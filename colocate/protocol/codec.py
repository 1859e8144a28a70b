"""The wire codec every colocate link shares: field rules, message records, version, errors.

Wire format: one msgpack map per ZeroMQ frame, ``{"v": PROTOCOL_VERSION, "t": TYPE, <field>: <value>, ...}``;
nested records are maps of their fields. ``encode_json`` and ``decode_json`` give the same map as JSON, for
debugging only. Every message carries ``"v"``; a peer that receives another version (or none) answers
``Error(code="version")``; ``ProtocolError.to_error()`` builds that reply (and the ``Error`` reply to any
other message it cannot decode).

Units: sizes are bytes (int >= 0); times and durations are seconds (finite float >= 0; ints are accepted
and become floats); shares and utilization are fractions in [0, 1].

``decode``/``decode_json`` raise only ``ProtocolError`` (a ``ValueError``) with one of the
``DECODE_ERRORS`` codes, whatever the input. Constructing a message validates it the same way, so an
invalid message can be neither built nor received. Field rules are declared once, as dataclass field
metadata (``_f(spec)``); a message class is declared with ``@_record("wire_name")``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, dataclass_transform

import msgpack

from colocate.base.frozen import quick_init
from colocate.base.vocab import JobClass

PROTOCOL_VERSION = 3  # 3: Register.rank and world_size (torchrun workers)
MAX_MESSAGE_BYTES = 1 << 20  # inputs above this are rejected before unpacking
# a socket's frame limit (ZMQ_MAXMSGSIZE): a message's bytes plus what CURVE adds on the wire (its box and nonce:
# 33 bytes), so that every message ``encode`` accepts is delivered, and none much larger is read
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES + 4096
# a job's request travels again inside the StartPlacement the scheduler sends a node (with this node's workers, at
# most one per GPU, and the rendezvous): a Submit leaves this room, so every job accepted can be started
START_HEADROOM = 64 << 10
MAX_BYTES_OF = {"submit": MAX_MESSAGE_BYTES - START_HEADROOM}  # a message type's own limit, where lower
MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1
MAX_LIST_ITEMS = 1024
_I64 = (1 << 63) - 1
_RESERVED_KEYS = ("v", "t")



class ErrorCode(StrEnum):
    """An ``Error`` reply's code (meanings: ``colocate.protocol``); the value is the wire string."""

    MALFORMED = "malformed"
    VERSION = "version"
    UNKNOWN_TYPE = "unknown_type"
    INVALID = "invalid"
    FORBIDDEN = "forbidden"
    REJECTED = "rejected"
    UNKNOWN_JOB = "unknown_job"
    UNKNOWN_NODE = "unknown_node"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"


MALFORMED, VERSION, UNKNOWN_TYPE, INVALID = ErrorCode.MALFORMED, ErrorCode.VERSION, ErrorCode.UNKNOWN_TYPE, ErrorCode.INVALID
FORBIDDEN, REJECTED, UNKNOWN_JOB = ErrorCode.FORBIDDEN, ErrorCode.REJECTED, ErrorCode.UNKNOWN_JOB
UNKNOWN_NODE, NOT_FOUND, UNAVAILABLE = ErrorCode.UNKNOWN_NODE, ErrorCode.NOT_FOUND, ErrorCode.UNAVAILABLE
DECODE_ERRORS = (MALFORMED, VERSION, UNKNOWN_TYPE, INVALID)
ERROR_CODES = tuple(ErrorCode)


class ProtocolError(ValueError):
    """A message that cannot be encoded or decoded; ``code`` is one of ``ERROR_CODES``."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code

    def to_error(self, job_id: str | None = None) -> Error:
        """The ``Error`` reply a daemon sends back for this failure."""
        return Error(code=self.code, message=str(self)[:MAX_TEXT_CHARS], job_id=job_id)


def printable(text: str) -> str:
    """``text`` with each control character replaced by "?": for names written before the codec refused them
    (an older scheduler's journal), so that they can still be shown and sent."""
    return _CONTROL.sub("?", text)


def _bad(name: str, want: str, got: Any) -> ProtocolError:
    shown = repr(got)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ProtocolError(INVALID, f"{name}: expected {want}, got {shown}")


# ---------------------------------------------------------------- field rules


class _Spec:
    """A field rule. ``check`` validates a Python value and returns it normalized (run on construction);
    ``load`` turns a decoded wire value into a Python value, ``dump`` does the reverse."""

    def check(self, v: Any, name: str) -> Any:
        return v

    def load(self, v: Any, name: str) -> Any:
        return v

    def dump(self, v: Any) -> Any:
        return v


@dataclass(frozen=True)
class Num(_Spec):
    """An exact int (``kind=int``; bool is no int) or a finite float (``kind=float``; ints become floats)."""

    kind: type = int
    lo: float = 0
    hi: float = _I64

    def check(self, v: Any, name: str) -> Any:
        want = "an integer" if self.kind is int else "a finite number"
        if isinstance(v, bool) or not isinstance(v, int if self.kind is int else (int, float)):
            raise _bad(name, want, v)
        try:
            v = self.kind(v)
        except OverflowError:
            raise _bad(name, want, v) from None
        if not ((self.kind is int or math.isfinite(v)) and self.lo <= v <= self.hi):
            raise _bad(name, f"{want} in [{self.lo}, {self.hi}]", v)
        return v


class Bool(_Spec):
    def check(self, v: Any, name: str) -> bool:
        if type(v) is not bool:
            raise _bad(name, "a boolean", v)
        return v


@dataclass(frozen=True)
class Str(_Spec):
    max_len: int = MAX_TEXT_CHARS
    min_len: int = 0
    choices: tuple = ()
    printable: bool = False  # no control characters: ids and names are printed on other users' terminals

    def check(self, v: Any, name: str) -> str:
        if v.__class__ is not str:
            if not isinstance(v, str):
                raise _bad(name, "a string", v)
            v = str.__str__(v)  # a vocabulary member (colocate.base.vocab) travels as its plain wire string
        if self.choices and v not in self.choices:
            raise _bad(name, "one of " + "|".join(self.choices), v)
        if not self.min_len <= len(v) <= self.max_len:
            raise _bad(name, f"a string of {self.min_len}..{self.max_len} characters", v)
        if v.isascii():
            control = self.printable and not v.isprintable()  # in ASCII, exactly what _CONTROL finds: C0 and DEL
        else:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad(name, "valid unicode text", v) from None
            control = self.printable and _CONTROL.search(v) is not None
        if control:
            raise _bad(name, "text without control characters (newlines, escapes)", v)
        return v


@dataclass(frozen=True)
class Choice(_Spec):
    """One member of a vocabulary (a ``StrEnum``, e.g. ``colocate.base.vocab.JobClass``): the member's value string
    on the wire, the member in Python. A string outside the vocabulary is refused (``invalid``), in one line."""

    vocab: type[StrEnum]

    def check(self, v: Any, name: str) -> StrEnum:
        if isinstance(v, self.vocab):
            return v
        if not isinstance(v, str):
            raise _bad(name, "a string", v)
        try:
            return self.vocab(v)
        except ValueError:
            raise _bad(name, "one of " + "|".join(self.vocab), v) from None

    def dump(self, v: Any) -> str:
        return str.__str__(v)  # the plain wire string


@dataclass(frozen=True)
class Opt(_Spec):  # None or what ``inner`` accepts
    inner: _Spec

    def check(self, v: Any, name: str) -> Any:
        return None if v is None else self.inner.check(v, name)

    def load(self, v: Any, name: str) -> Any:
        return None if v is None else self.inner.load(v, name)

    def dump(self, v: Any) -> Any:
        return None if v is None else self.inner.dump(v)


@dataclass(frozen=True)
class Nested(_Spec):  # a record, a map on the wire
    cls: type

    def check(self, v: Any, name: str) -> Any:
        if type(v) is not self.cls:
            raise _bad(name, f"a {self.cls.__name__}", v)
        return v

    def load(self, v: Any, name: str) -> Any:
        if type(v) is not dict:
            raise _bad(name, f"a map ({self.cls.__name__})", v)
        return _from_map(self.cls, v)

    def dump(self, v: Any) -> Any:
        return _to_map(v)


@dataclass(frozen=True)
class ListOf(_Spec):
    """A list on the wire, a tuple in Python (messages stay hashable)."""

    item: _Spec
    max_len: int = MAX_LIST_ITEMS
    min_len: int = 0

    def check(self, v: Any, name: str) -> tuple:
        if not isinstance(v, (list, tuple)) or not self.min_len <= len(v) <= self.max_len:
            raise _bad(name, f"a list of {self.min_len} to {self.max_len} items" if self.min_len
                       else f"a list of at most {self.max_len} items", v)
        check = self.item.check
        try:
            return tuple(check(x, name) for x in v)
        except ProtocolError:  # again, to name the item in the error (a name built per item only for this)
            for i, x in enumerate(v):
                check(x, f"{name}[{i}]")
            raise

    def load(self, v: Any, name: str) -> Any:
        if type(v) is not list:
            raise _bad(name, "a list", v)
        return [self.item.load(x, f"{name}[{i}]") for i, x in enumerate(v)]

    def dump(self, v: Any) -> Any:
        return [self.item.dump(x) for x in v]


@dataclass(frozen=True)
class MapOf(_Spec):
    """A map of string keys on the wire, a tuple of sorted (key, value) pairs in Python (messages stay
    hashable); ``dict(...)`` of it gives the mapping back. A dict is accepted on construction."""

    key: _Spec
    value: _Spec
    max_len: int = MAX_LIST_ITEMS

    def check(self, v: Any, name: str) -> tuple:
        items = v.items() if isinstance(v, dict) else v
        if not isinstance(items, (list, tuple, type({}.items()))):
            raise _bad(name, f"a map of at most {self.max_len} entries", v)
        pairs: list[tuple[Any, Any]] = []
        kv: Any
        kcheck, vcheck, kname = self.key.check, self.value.check, f"{name} key"
        for kv in items:
            if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
                raise _bad(name, "(key, value) pairs", kv)
            try:
                value = vcheck(kv[1], name)
            except ProtocolError:  # again, to name the entry in the error (a name built per entry only for this)
                vcheck(kv[1], f"{name}[{kv[0]!r:.40}]")
                raise
            pairs.append((kcheck(kv[0], kname), value))
        if len(pairs) > self.max_len:
            raise _bad(name, f"a map of at most {self.max_len} entries", f"{len(pairs)} entries")
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise _bad(name, "unique keys", keys)
        return tuple(sorted(pairs))

    def load(self, v: Any, name: str) -> Any:
        if type(v) is not dict:
            raise _bad(name, "a map", v)
        return list(v.items())

    def dump(self, v: Any) -> Any:
        return {k: x for k, x in v}


def _f(spec: _Spec, *, default: Any = MISSING, init: bool = True, optional: bool = False) -> Any:
    """Declare a dataclass field with its wire rule. A default only eases construction: on the wire every
    field is required, except an ``optional`` one (it needs a default), which is left off the wire while it
    holds its default and takes its default when missing, so peers that predate it still read and write
    the message (a field added without bumping ``PROTOCOL_VERSION``)."""
    if optional and default is MISSING:
        raise TypeError("an optional wire field needs a default")
    return field(default=default, init=init, metadata={"spec": spec, "optional": optional})


JOB_ID = Str(MAX_ID_CHARS, min_len=1, printable=True)
NODE_ID = Str(MAX_ID_CHARS, min_len=1, printable=True)
TEXT = Str(MAX_TEXT_CHARS)
SIZE = Num(int)  # bytes
COUNT = Num(int)  # seq, epoch, iterations, indices
PID = Num(int, 0, (1 << 31) - 1)
EXIT_CODE = Num(int, -(1 << 31), (1 << 31) - 1)
SECONDS = Num(float, 0.0, math.inf)
SHARE = Num(float, 0.0, 1.0)
JOB_CLASS = Choice(JobClass)
NAME = Str(MAX_ID_CHARS, printable=True)  # node ids, placement ids, queue, user and job names (may be empty where optional)


def _loader(spec: _Spec) -> Callable[[Any, str], Any] | None:
    """``spec.load``, or None where it returns its value as it is (most rules: the record's check does the work)."""
    if type(spec).load is _Spec.load:
        return None
    if isinstance(spec, Opt) and _loader(spec.inner) is None:
        return None
    return spec.load


# ---------------------------------------------------------------- message classes

_SPECS: dict[type, tuple[tuple[str, _Spec], ...]] = {}
_LABELLED: dict[type, tuple[tuple[str, _Spec, str], ...]] = {}  # the same, with each field's name in errors
_LOADS: dict[type, tuple[tuple[str, Callable[[Any, str], Any] | None, str], ...]] = {}  # name, wire loader, label
_NAMES: dict[type, frozenset[str]] = {}  # record -> its wire field names
_WIRE_DEFAULTS: dict[type, dict[str, Any]] = {}  # record -> its optional fields' defaults in wire form (made at first use)
_OPTIONAL: dict[type, dict[str, Any]] = {}  # record -> its optional wire fields and their defaults
MESSAGE_TYPES: dict[str, type] = {}


class _Record:
    """Base of every message and nested record: validates and normalizes its fields on construction (each field
    through its rule's ``check`` as it is stored, in field order, then ``_check``; ``colocate.base.frozen``)."""

    __slots__ = ()

    def _check(self) -> None:
        """Cross-field rules; overridden where a message has any."""


class Message(_Record):
    """Base of the top-level messages; ``TYPE`` is the wire name."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""


_R = TypeVar("_R", bound=_Record)


@dataclass_transform(frozen_default=True, field_specifiers=(_f,))
def _record(type_name: str = "") -> Callable[[type[_R]], type[_R]]:
    """Make ``cls`` a frozen dataclass with registered field rules; with ``type_name``, a message."""

    def wrap(cls: type[_R]) -> type[_R]:
        cls = dataclass(frozen=True, slots=True)(cls)
        _SPECS[cls] = tuple((f.name, f.metadata["spec"]) for f in fields(cls))  # type: ignore[arg-type]
        _LABELLED[cls] = tuple((n, spec, f"{cls.__name__}.{n}") for n, spec in _SPECS[cls])
        _NAMES[cls] = frozenset(n for n, _ in _SPECS[cls])
        _LOADS[cls] = tuple((n, _loader(spec), label) for n, spec, label in _LABELLED[cls])
        quick_init(cls, checks={n: (spec.check, label) for n, spec, label in _LABELLED[cls]}, then="_check")
        _OPTIONAL[cls] = {f.name: f.default for f in fields(cls) if f.metadata.get("optional")}  # type: ignore[arg-type]
        assert not {n for n, _ in _SPECS[cls]} & set(_RESERVED_KEYS), cls
        if type_name:
            assert type_name not in MESSAGE_TYPES, type_name
            setattr(cls, "TYPE", type_name)  # noqa: B010 (Message.TYPE: _R is any record)
            MESSAGE_TYPES[type_name] = cls
        return cls

    return wrap


# every link, both directions
@_record("error")
class Error(Message):
    code: ErrorCode = _f(Choice(ErrorCode))
    message: str = _f(TEXT)
    job_id: str | None = _f(Opt(JOB_ID))


# ---------------------------------------------------------------- codec


def _to_map(rec: _Record) -> dict:
    out = {name: spec.dump(getattr(rec, name)) for name, spec in _SPECS[type(rec)]}
    for name, default in _OPTIONAL[type(rec)].items():
        if getattr(rec, name) == default:
            del out[name]  # left off while at its default: a peer that predates the field reads the message
    return out


def _from_map(cls: type, m: dict) -> Any:
    specs = _SPECS[cls]
    opt = _OPTIONAL[cls]
    if opt and any(n not in m for n in opt):
        m = {**_dumped_defaults(cls), **m}
    if m.keys() != _NAMES[cls]:
        names = _NAMES[cls]
        missing = [n for n, _ in specs if n not in m]
        extra = [k for k in m if k not in names]
        what = (f"missing fields {missing}" if missing else "") + (" " if missing and extra else "")
        what += f"unexpected fields {extra!r:.200}" if extra else ""
        raise ProtocolError(INVALID, f"{cls.__name__}: {what}")
    kw = {}
    for name, load, label in _LOADS[cls]:
        kw[name] = m[name] if load is None else load(m[name], label)
    return cls(**kw)


def _dumped_defaults(cls: type) -> dict[str, Any]:
    """The wire form of ``cls``'s optional fields' defaults (what a peer that predates them leaves off); made once
    per class (the loaders never change what they are given)."""
    got = _WIRE_DEFAULTS.get(cls)
    if got is None:
        specs = dict(_SPECS[cls])
        got = _WIRE_DEFAULTS[cls] = {n: specs[n].dump(d) for n, d in _OPTIONAL[cls].items()}
    return got


def record_map(rec: _Record) -> dict:
    """A nested record (not a message) as its wire map: plain JSON data (maps as dicts, lists as lists)."""
    return _to_map(rec)


def to_wire(msg: Message) -> dict:
    """The map ``encode`` packs: ``{"v": ..., "t": ..., fields...}``."""
    if not isinstance(msg, Message) or type(msg) not in _SPECS:
        raise TypeError(f"not a protocol message: {msg!r:.80}")
    return {"v": PROTOCOL_VERSION, "t": msg.TYPE, **_to_map(msg)}


def from_wire(obj: Any) -> Message:
    """Validate an unpacked map and build its message; raises only ``ProtocolError``."""
    if type(obj) is not dict:
        raise ProtocolError(MALFORMED, f"expected a map, got {type(obj).__name__}")
    if "v" not in obj:
        raise ProtocolError(VERSION, f"missing protocol version: expected {PROTOCOL_VERSION}")
    v = obj["v"]
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise ProtocolError(VERSION, f"version mismatch: expected {PROTOCOL_VERSION}, got {v!r:.40}")
    t = obj.get("t")
    if type(t) is not str:
        raise ProtocolError(MALFORMED, "missing message type 't'")
    cls = MESSAGE_TYPES.get(t)
    if cls is None:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {t!r:.80}")
    return _from_map(cls, {k: x for k, x in obj.items() if k not in _RESERVED_KEYS})


def _check_size(n: int) -> None:
    if n > MAX_MESSAGE_BYTES:
        raise ProtocolError(MALFORMED, f"message of {n} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")


def encode(msg: Message) -> bytes:
    """msgpack bytes of ``msg``; ``ProtocolError`` (invalid) over its type's limit (``MAX_BYTES_OF``, else
    ``MAX_MESSAGE_BYTES``)."""
    data = msgpack.packb(to_wire(msg), use_bin_type=True)
    limit = MAX_BYTES_OF.get(msg.TYPE, MAX_MESSAGE_BYTES)
    if len(data) > limit:
        raise ProtocolError(INVALID, f"encoded {msg.TYPE} is {len(data)} bytes, over {limit}")
    return data


def decode(data: bytes) -> Message:
    """Message from msgpack bytes; raises only ``ProtocolError``, whatever ``data`` holds (over its type's limit,
    ``MAX_BYTES_OF``: invalid)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(MALFORMED, f"expected bytes, got {type(data).__name__}")
    _check_size(memoryview(data).nbytes)
    try:
        obj = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=MAX_MESSAGE_BYTES, max_bin_len=4 * MAX_TEXT_CHARS,
            max_array_len=MAX_LIST_ITEMS, max_map_len=MAX_LIST_ITEMS, max_ext_len=4 * MAX_TEXT_CHARS,
        )  # fmt: skip
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise ProtocolError(MALFORMED, f"undecodable msgpack: {type(e).__name__}: {e}"[:200]) from None
    msg = from_wire(obj)
    n, limit = memoryview(data).nbytes, MAX_BYTES_OF.get(msg.TYPE, MAX_MESSAGE_BYTES)
    if n > limit:  # a message its own type's limit refuses (a Submit that could not be started as one message)
        raise ProtocolError(INVALID, f"a {msg.TYPE} of {n} bytes is over its {limit}-byte limit")
    return msg


def encode_json(msg: Message) -> str:
    """The same map as JSON (debugging aid)."""
    return json.dumps(to_wire(msg), allow_nan=False, ensure_ascii=False)


def decode_json(data: str | bytes) -> Message:
    """Message from ``encode_json`` text; raises only ``ProtocolError``."""
    if not isinstance(data, (str, bytes, bytearray)):
        raise ProtocolError(MALFORMED, f"expected text, got {type(data).__name__}")
    _check_size(len(data))
    try:
        obj = json.loads(data)
    except Exception as e:  # JSONDecodeError, UnicodeDecodeError, RecursionError, int-digit limit...
        raise ProtocolError(MALFORMED, f"undecodable JSON: {type(e).__name__}: {e}"[:200]) from None
    return from_wire(obj)
