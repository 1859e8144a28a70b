"""``cluster.frozen.quick_init``: the same records as the dataclass's own ``__init__`` makes, refused where it
could differ."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import events as ev
from cluster import frozen, points, spec
from cluster.frozen import quick_init


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "x"
    c: tuple = ()
    d: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: str = "x"
    c: tuple = ()
    d: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


QUICK = [c for m in (spec, ev, points) for c in vars(m).values()
         if isinstance(c, type) and c.__module__ == m.__name__ and dataclasses.is_dataclass(c)
         and c.__dataclass_params__.frozen and "__slots__" in c.__dict__]


def test_every_frozen_record_of_the_core_is_quick():
    assert len(QUICK) >= 20
    for cls in QUICK:
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
