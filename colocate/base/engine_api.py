"""What an engine's resolver (``colocate.<engine>.worker:resolve``, called by ``colocate.base.engines``) may use:
``within_grant``, the one check of a task's fields against its engine's grant, and ``Deferred``, its answer
when the worker's facts come later. A resolver imports this module, never ``colocate.base.engines`` (which imports
the resolvers) nor the job runtime."""

from __future__ import annotations

from collections.abc import Callable

from colocate.base.units import format_size

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
    imports torch before Ray Train gives it its ranks). It carries what the resolver needs: ``when(callback)``
    arranges for ``callback()`` to be called once the facts are known, before the worker's own code runs. The
    runtime installs nothing now and passes ``when`` its own install step; a resolver never imports the
    runtime. ``callback`` takes no argument; what it raises propagates into the engine's code that called it."""

    def __init__(self, reason: str, when: Callable[[Callable[[], None]], None]):
        super().__init__(reason)
        self.when = when
