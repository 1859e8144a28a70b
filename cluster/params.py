"""Typed parameters of the policy config: each plugin (and the ``[scheduler]`` table) declares
``PARAMS = {name: Param(default, kind, check, doc)}``; ``parse_params`` fills defaults and turns a
bad key or value into a one-line ``ValueError`` that names the key (``plugins.backfill.depth``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    default: Any
    kind: str  # int | float | bool | str | list[str] | dict[str,float] | dict[str,int]
    check: Callable[[Any], bool] | None = None
    doc: str = ""
    choices: tuple = ()


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _coerce(where: str, kind: str, v: Any) -> Any:
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: expected an integer, got {v!r}")
        return v
    if kind == "float":
        if not _is_num(v) or math.isnan(v):
            raise ValueError(f"{where}: expected a number, got {v!r}")
        return float(v)
    if kind == "bool":
        if not isinstance(v, bool):
            raise ValueError(f"{where}: expected true or false, got {v!r}")
        return v
    if kind == "str":
        if not isinstance(v, str):
            raise ValueError(f"{where}: expected a string, got {v!r}")
        return v
    if kind == "list[str]":
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x for x in v):
            raise ValueError(f"{where}: expected a list of non-empty strings, got {v!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"{where}: duplicate names in {list(v)!r}")
        return tuple(v)
    if kind in ("dict[str,float]", "dict[str,int]"):
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected a table of name = number, got {v!r}")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"{where}: names must be non-empty strings, got {k!r}")
            out[k] = _coerce(f"{where}.{k}", kind[9:-1], x)
        return out
    raise AssertionError(f"unknown parameter kind {kind}")


def parse_params(where: str, spec: dict[str, Param], table: Any) -> dict[str, Any]:
    """Validate ``table`` against ``spec``; returns every parameter (defaults filled in)."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table, got {table!r}")
    for key in table:
        if key not in spec:
            known = ", ".join(sorted(spec)) or "none"
            raise ValueError(f"{where}.{key}: unknown key (known: {known})")
    out = {}
    for key, p in spec.items():
        if key not in table:
            out[key] = p.default
            continue
        v = _coerce(f"{where}.{key}", p.kind, table[key])
        if p.choices and v not in p.choices:
            raise ValueError(f"{where}.{key}: must be one of {', '.join(map(str, p.choices))}, got {v!r}")
        if p.check is not None and not p.check(v):
            raise ValueError(f"{where}.{key}: bad value {v!r} ({p.doc})")
        out[key] = v
    return out
