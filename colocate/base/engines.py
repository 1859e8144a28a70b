"""Engine integrations: how a worker started by Ray or Slurm learns its ``COLOCATE_*`` values.

Contract (docs/engines.md). An engine integration is a package ``colocate.<engine>`` with a module
``worker`` (which imports ``colocate.base.engine_api``, never this module nor the runtime) that defines ``resolve(environ: Mapping[str, str]) -> dict[str, str]``. The job runtime calls
``prepare(os.environ)`` when it installs (right after ``import torch`` in the worker), before it reads any
other variable: with ``COLOCATE_ENGINE`` set, the engine's resolver is imported (lazily: no engine is
imported otherwise) and called once with the worker's environment, and the values it returns are written
into that environment, replacing what was there. The resolver decides per-worker facts (GPU, share, cap,
job id, rank, world size, priority, partition) from what the engine set; it must not start CUDA. It raises
``ValueError`` with one line naming what is wrong (a bad option, a missing grant): the worker then stops
with that line, exit 2. Every key it returns is a ``COLOCATE_*`` variable of ``colocate.base.env``, every value
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

from colocate.base.engine_api import Deferred, within_grant
from colocate.base.env import NAMES
from colocate.base.vocab import Engine

__all__ = ["ENGINES", "Deferred", "Resolver", "prepare", "resolve", "resolver", "within_grant"]

# engine name -> "module:function" of its resolver (imported only when a worker names the engine)
ENGINES: dict[str, str] = {e.value: f"colocate.{e.value}.worker:resolve" for e in Engine}

Resolver = Callable[[Mapping[str, str]], Mapping[str, str]]


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
    ValueError, or a value that is not a ``COLOCATE_*`` variable of ``colocate.base.env``; lets ``Deferred`` through."""
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
