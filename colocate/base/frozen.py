"""Frozen records that are quick to make.

``@quick_init`` above ``@dataclass(frozen=True, slots=True)`` replaces the class's generated ``__init__`` with one
of the same signature (the same parameters, order and defaults; ``default_factory`` fields made fresh per
instance) that stores each field through its slot's descriptor and then calls ``__post_init__`` when the class
has one. Everything else (immutability, ``__eq__``, ``__hash__``, ``__repr__``, ``dataclasses.replace``,
pickling) is the dataclass's own.

``quick_init(cls, checks={field: (check, label)}, then="_check")`` also passes each listed parameter through
``check(value, label)`` and stores what it returns (the protocol's field rules validate and normalize in the same
pass as the store), then calls ``then`` instead of ``__post_init__``.

Why: a frozen dataclass's ``__init__`` stores each field with ``object.__setattr__`` looked up per field, about
twice the cost of the descriptor call, and a ``__post_init__`` that normalizes stores every field again. The
scheduler makes one ``JobSpec`` (18 fields) per job and several event and decision records per job event (the
Philly replay makes millions), and the server decodes a message of nested records per request.

Supported: fields with ``init=True`` and no ``kw_only``; anything else is a ``TypeError`` at class creation,
never a silent difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_MISSING = object()  # a default_factory field's parameter default: "not given, make one"


def quick_init(cls: T, *, checks: Mapping[str, tuple[Callable[[Any, str], Any], str]] | None = None,
               then: str | None = "__post_init__") -> T:
    """Give the frozen slotted dataclass ``cls`` the quick ``__init__`` (module docstring); returns ``cls``.
    ``checks``: field -> (check, label), the stored value is ``check(value, label)``; ``then``: the method called
    last, when the class has it (None: none)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__qualname__} must be a @dataclass(frozen=True, slots=True) class")
    if not params.init or "__init__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__qualname__} has no dataclass __init__ to replace")
    declared = getattr(cls, "__dataclass_fields__").values()  # noqa: B009 (T is any class: mypy knows no dataclass)
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in declared):  # type: ignore[attr-defined]
        raise TypeError(f"quick_init: {cls.__qualname__} has an InitVar")
    fields = dataclasses.fields(cls)
    checks = dict(checks or {})
    if set(checks) - {f.name for f in fields}:
        raise TypeError(f"quick_init: {cls.__qualname__} has no fields {sorted(set(checks) - {f.name for f in fields})}")
    ns: dict = {"_MISSING": _MISSING}
    args: list[str] = []
    body: list[str] = []
    for f in fields:
        if not f.init or f.kw_only:
            raise TypeError(f"quick_init: {cls.__qualname__}.{f.name}: init=False and kw_only fields are not supported")
        name = f.name
        ns[f"_set_{name}"] = next(k.__dict__[name] for k in cls.__mro__ if name in k.__dict__).__set__  # its slot
        value = name
        if f.default is not dataclasses.MISSING:
            ns[f"_d_{name}"] = f.default
            args.append(f"{name}=_d_{name}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_f_{name}"] = f.default_factory
            args.append(f"{name}=_MISSING")
            value = f"(_f_{name}() if {name} is _MISSING else {name})"
        else:
            args.append(name)
        if name in checks:
            ns[f"_c_{name}"], ns[f"_l_{name}"] = checks[name]
            value = f"_c_{name}({value}, _l_{name})"
        body.append(f"_set_{name}(self, {value})")
    if then is not None and hasattr(cls, then):
        body.append(f"self.{then}()")
    src = f"def __init__(self, {', '.join(args)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(src, ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__dict__["__init__"].__annotations__)
    setattr(cls, "__init__", init)  # noqa: B010 (the class's own __init__ is what is replaced)
    return cls
