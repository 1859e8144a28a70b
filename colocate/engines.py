"""Engine integrations: how a worker started by Ray or Slurm learns its ``COLOCATE_*`` values.

Contract (docs/engines.md). An engine integration is a package ``colocate.<engine>`` with a module
``worker`` that defines ``resolve(environ: Mapping[str, str]) -> dict[str, str]``. The job runtime calls
``prepare(os.environ)`` when it installs (right after ``import torch`` in the worker), before it reads any
other variable: with ``COLOCATE_ENGINE`` set, the engine's resolver is imported (lazily: no engine is
imported otherwise) and called once with the worker's environment, and the values it returns are written
into that environment, replacing what was there. The resolver decides per-worker facts (GPU, share, cap,
job id, rank, world size, priority, partition) from what the engine set; it must not start CUDA. It raises
``ValueError`` with one line naming what is wrong (a bad option, a missing grant): the worker then stops
with that line, exit 2. Every key it returns is a ``COLOCATE_*`` variable of ``colocate.env``, every value
a string; anything else is a ``ValueError`` too.

Grants only go down: what a task asks of colocate itself (Ray's ``runtime_env`` fields, Slurm's
``--colocate-gpu-mem``/``--colocate-sm-share``) may lower the share and cap its engine granted, never raise
them; ``within_grant`` is the one check every resolver makes, and a value above the grant is a ``ValueError``
naming the grant. Work the engine granted no GPU (opportunistic) has no grant: its fields are requests, and
the node never gives it more than it asked for (``Register.mem_request``/``sm_request`` are ceilings).

After the resolver, a process with no ``COLOCATE_TOKEN`` (one not started by ``colocate run``) draws its
own, so no other process can register on the node under its job id.
"""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Callable, Mapping, MutableMapping

from colocate.env import NAMES
from colocate.units import format_size
from colocate.vocab import Engine

# engine name -> "module:function" of its resolver (imported only when a worker names the engine)
ENGINES: dict[str, str] = {e.value: f"colocate.{e.value}.worker:resolve" for e in Engine}

Resolver = Callable[[Mapping[str, str]], Mapping[str, str]]


_EPS = 1e-9  # engines hand out fractions as floats (Ray: 0.0001 steps); a share equal to the grant is not above it


def within_grant(name: str, asked: float | None, granted: float, engine: str, source: str, *,
                 size: bool = False) -> float:
    """What a task runs with: ``asked`` (its own value of ``name``, as the user wrote the option: a share 0..1,
    or bytes with ``size``) when it is at most ``granted`` (what engine ``engine`` gave it, ``source`` saying
    how: ``"num_gpus"``, ``"--gres=shard:2 of 4"``), ``granted`` when ``asked`` is None. Above the grant:
    ``ValueError``, one line naming the value and the grant. Pure."""
    if asked is None:
        return granted
    if asked > granted + (0 if size else _EPS):
        def show(v: float) -> str:
            if not size:
                return f"{v:g}"
            return format_size(v) if format_size(asked) != format_size(granted) else f"{int(v)} bytes"

        raise ValueError(f"{name} {show(asked)} is above this task's {engine} grant {show(granted)} ({source}); "
                         "a task may only lower its grant")
    return asked


class Deferred(Exception):
    """Raised by a resolver whose worker's facts are not known yet when torch is imported (a Ray Train worker
    imports torch before Ray Train gives it its ranks): nothing is installed now, and the resolver has arranged
    to call ``torch_hooks.install()`` itself once they are, before the worker's own code runs."""


def resolver(name: str, engines: Mapping[str, str] | None = None) -> Resolver:
    """The resolver of engine ``name``; ValueError (one line) when it is unknown or cannot be imported."""
    table = ENGINES if engines is None else engines
    target = table.get(name)
    if target is None:
        raise ValueError(f"COLOCATE_ENGINE={name!r}: must be one of {', '.join(sorted(table))} (or empty)")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"COLOCATE_ENGINE={name}: cannot import {module_name} ({exc}); is colocate's "
                         f"{name} support installed?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"COLOCATE_ENGINE={name}: {module_name} has no {attr}()")
    return fn


def resolve(environ: MutableMapping[str, str], engines: Mapping[str, str] | None = None) -> dict[str, str]:
    """Run the resolver ``COLOCATE_ENGINE`` names on ``environ`` and write its values into it; returns them
    ({} without an engine). Raises ValueError with one line on an unknown engine, a resolver's own
    ValueError, or a value that is not a ``COLOCATE_*`` variable of ``colocate.env``; lets ``Deferred`` through."""
    name = environ.get("COLOCATE_ENGINE") or ""
    if not name:
        return {}
    fn = resolver(name, engines)
    try:
        values = fn(environ)
    except ValueError as exc:
        text = str(exc).strip().splitlines()
        raise ValueError(text[0] if text else f"COLOCATE_ENGINE={name}: the worker's settings were refused") from None
    if not isinstance(values, Mapping):
        raise ValueError(f"COLOCATE_ENGINE={name}: the resolver returned {type(values).__name__}, not a mapping")
    out: dict[str, str] = {}
    for key, value in values.items():
        if key not in NAMES or key == "COLOCATE_ENGINE":
            raise ValueError(f"COLOCATE_ENGINE={name}: the resolver set {str(key)[:60]!r}, which is not a "
                             "COLOCATE_* variable it may set")
        if not isinstance(value, str):
            raise ValueError(f"COLOCATE_ENGINE={name}: the resolver set {key} to a {type(value).__name__}, "
                             "not a string")
        out[key] = value
    environ.update(out)
    return out


def prepare(environ: MutableMapping[str, str], engines: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the job runtime does to the environment before it reads it: ``resolve``, then draw a
    ``COLOCATE_TOKEN`` when there is none. Returns the engine's values. Idempotent for a token once drawn."""
    values = resolve(environ, engines)
    if not environ.get("COLOCATE_TOKEN"):
        environ["COLOCATE_TOKEN"] = secrets.token_hex(16)
    return values
