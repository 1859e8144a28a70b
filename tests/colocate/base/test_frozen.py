"""``colocate.base.frozen.quick_init``: the same records as the dataclass's own ``__init__`` makes, refused where it
could differ."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import events as ev
from cluster import points, spec
from colocate import protocol as P
from colocate.base import frozen
from colocate.base.frozen import quick_init


def _record(name: str) -> type:
    """The same frozen, slotted dataclass each call (a fresh class, named ``name`` so that pickle finds it here):
    the reference and the one made quick."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Rec:
        a: int
        b: str = "x"
        c: tuple = ()
        d: list = dataclasses.field(default_factory=list)

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a must be >= 0")

    Rec.__name__ = Rec.__qualname__ = name
    return Rec


Plain = _record("Plain")
Quick = quick_init(_record("Quick"))


QUICK = [c for m in (spec, ev, points) for c in vars(m).values()
         if isinstance(c, type) and c.__module__ == m.__name__ and dataclasses.is_dataclass(c)
         and c.__dataclass_params__.frozen and "__slots__" in c.__dict__]


def test_every_frozen_record_of_the_core_and_the_protocol_is_quick():
    assert len(QUICK) >= 20 and len(P._SPECS) >= 40
    for cls in [*QUICK, *P._SPECS]:
        assert cls.__init__.__globals__.get("_MISSING") is frozen._MISSING, cls


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_the_signature_is_the_dataclass_one(cls):
    got = inspect.signature(cls.__init__)
    want = [(f.name, f.default) for f in dataclasses.fields(cls)]
    assert [(p.name, p.default if p.default is not inspect.Parameter.empty else dataclasses.MISSING)
            for p in list(got.parameters.values())[1:]] == want


@given(a=st.integers(0, 10**6), b=st.text(max_size=5), c=st.tuples(st.integers()), positional=st.booleans())
def test_same_records_as_the_dataclass_init(a, b, c, positional):
    q, p = (Quick(a, b, c), Plain(a, b, c)) if positional else (Quick(b=b, a=a, c=c), Plain(b=b, a=a, c=c))
    assert dataclasses.astuple(q) == dataclasses.astuple(p)
    assert repr(q).replace("Quick", "Plain") == repr(p)
    assert q == Quick(a, b, c) and q != Quick(a + 1, b, c)


def test_defaults_factories_post_init_and_immutability():
    q = Quick(1)
    assert (q.b, q.c, q.d) == ("x", (), [])
    assert Quick(1).d is not Quick(1).d  # a fresh list per instance, as default_factory promises
    with pytest.raises(ValueError, match="a must be >= 0"):
        Quick(-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, e=2)  # type: ignore[call-arg]
    assert dataclasses.replace(q, a=5) == Quick(5)
    assert pickle.loads(pickle.dumps(q)) == q


def test_a_job_spec_still_validates_and_converts():
    s = spec.JobSpec("j", klass="opportunistic")
    assert s.klass is spec.JobClass.OPPORTUNISTIC
    assert hash(s) == hash(spec.JobSpec("j", klass=spec.JobClass.OPPORTUNISTIC)) and s != spec.JobSpec("j")
    for bad in ({"job_id": ""}, {"job_id": "j", "workers": 0}, {"job_id": "j", "klass": "vip"},
                {"job_id": "j", "klass": 3}, {"job_id": "j", "estimate_s": -1.0}):
        with pytest.raises(spec.SpecError):
            spec.JobSpec(**bad)


def test_refused_where_it_could_differ():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class KwOnly:
        a: int = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True, slots=True)
    class NoInit:
        a: int = dataclasses.field(init=False, default=1)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    for cls in (NoSlots, NotFrozen, KwOnly, NoInit, WithInitVar, int):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


def test_checks_store_what_the_check_returns_in_field_order_then_the_named_method():
    seen = []

    def upper(v, label):
        seen.append(label)
        if not isinstance(v, str):
            raise ValueError(f"{label}: not a string")
        return v.upper()

    @dataclasses.dataclass(frozen=True, slots=True)
    class Rec:
        a: str
        b: str = "x"
        n: int = 0

        def __post_init__(self) -> None:
            raise AssertionError("then= replaces __post_init__")

        def after(self) -> None:
            seen.append(("after", self.a, self.b))

    quick_init(Rec, checks={"a": (upper, "Rec.a"), "b": (upper, "Rec.b")}, then="after")
    r = Rec("p", n=3)
    assert (r.a, r.b, r.n) == ("P", "X", 3) and seen == ["Rec.a", "Rec.b", ("after", "P", "X")]
    with pytest.raises(ValueError, match="Rec.a: not a string"):
        Rec(1, 2)  # the first field's rule speaks first, as the dataclass's post-init loop did
    with pytest.raises(TypeError, match="no fields"):
        quick_init(Rec, checks={"z": (upper, "Rec.z")})


def test_a_protocol_record_is_checked_and_normalized_as_it_is_made():
    err = P.Error(code="invalid", message="m", job_id=None)
    assert err.code is P.ErrorCode.INVALID  # the wire string made the member by its rule
    with pytest.raises(P.ProtocolError, match="Error.message"):
        P.Error(code="invalid", message=3, job_id=None)
    with pytest.raises(P.ProtocolError, match="Error.code"):
        P.Error(code="nope", message=3, job_id=None)  # fields in order: the first bad one is named


def test_a_subclass_stores_its_parents_fields_through_their_slots():
    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Child(Base):
        b: str = "y"

    c = Child(1)
    assert (c.a, c.b) == (1, "y") and c == Child(1, "y") and c != Child(2)
