"""colocate inside Ray: Ray's fractional GPUs become enforced memory caps and compute shares.

On each node, ``colocate ray start [ray start options]`` runs a ``colocate node`` beside the raylet and
``ray start`` with the ``colocate`` runtime_env plugin (``colocate.ray.plugin``). A task, an actor or a Ray
Train worker then asks for colocate in its runtime_env; the helpers here build the options::

    import colocate.ray
    @colocate.ray.remote(num_gpus=0.5)                        # cap and share: half the GPU
    @colocate.ray.remote(num_gpus=0.25, gpu_mem="1GiB")       # share 0.25, cap 1 GiB
    @colocate.ray.remote(priority="opportunistic")            # no Ray GPU: the node picks one
    f.options(**colocate.ray.options(num_gpus=0.5))           # the same keywords for .options()
    RunConfig(worker_runtime_env=colocate.ray.runtime_env())               # Ray Train: one colocate job

A plain ``runtime_env={"colocate": {...}}`` works on nodes with the plugin; the helpers also make a node without
the plugin fail closed (the worker refuses to run, ``colocate.ray.worker``). No Ray import here: a driver
imports Ray itself.
"""

from __future__ import annotations

import inspect

from colocate.base.engine_api import within_grant
from colocate.base.vocab import JobClass
from colocate.ray.fields import FIELD, KEYS, OPPORTUNISTIC_RESOURCE, Fields, parse_fields

__all__ = ["FIELD", "KEYS", "OPPORTUNISTIC_RESOURCE", "Fields", "options", "parse_fields", "remote", "runtime_env"]


def runtime_env(priority: str | None = None, gpu_mem: str | int | None = None, sm_share: float | None = None,
                on_cap: str | None = None, *, base: dict | None = None) -> dict:
    """A Ray ``runtime_env`` (``base`` plus) asking for colocate with these fields (None: the default).

    A bad field raises ``ValueError`` here, on the driver, with one line. Besides the ``colocate`` field it sets
    ``env_vars`` that turn the runtime on in the worker whatever its node, so that a node without the plugin
    fails closed instead of running the task without limits."""
    from colocate.ray.node import switches

    given = {"priority": priority, "gpu_mem": gpu_mem, "sm_share": sm_share, "on_cap": on_cap}
    fields = {k: v for k, v in given.items() if v is not None}
    parse_fields(fields)
    env = dict(base or {})
    env[FIELD] = fields
    env_vars = dict(env.get("env_vars") or {})
    env_vars.update(switches(env_vars.get("PYTHONPATH")))
    env["env_vars"] = env_vars
    return env


def options(num_gpus: float | None = None, *, priority: str | None = None, gpu_mem: str | int | None = None,
            sm_share: float | None = None, on_cap: str | None = None, base: dict | None = None,
            resources: dict | None = None) -> dict:
    """Keyword arguments for ``.options(...)`` (or ``@ray.remote(...)``) of a colocate task or actor
    (``base``: a runtime_env to add to; ``resources``: other custom resources).

    Guaranteed (default): ``num_gpus`` (a fraction, or 1; default 1) of one GPU, enforced as cap and share.
    Opportunistic: no Ray GPU, one unit of ``OPPORTUNISTIC_RESOURCE`` (the node coordinator picks the GPU).
    A task should be declared with ``max_calls=1`` (``remote`` does it; Ray refuses it in ``.options()``): Ray
    reuses a worker for tasks of one runtime_env, while colocate decides a worker's GPU and limits once, when
    it imports torch."""
    env = runtime_env(priority, gpu_mem, sm_share, on_cap, base=base)
    out: dict = {"runtime_env": env}
    extra = dict(resources or {})
    if priority == JobClass.OPPORTUNISTIC:
        if num_gpus:
            raise ValueError("an opportunistic colocate task asks for no Ray GPU (num_gpus=0): the node "
                             "coordinator picks its GPU")
        out["num_gpus"] = 0
        extra[OPPORTUNISTIC_RESOURCE] = extra.get(OPPORTUNISTIC_RESOURCE, 1)
    else:
        gpus = 1 if num_gpus is None else num_gpus
        if not 0 < gpus <= 1:
            raise ValueError(f"num_gpus must be more than 0 and at most 1 for a colocate worker, got {num_gpus!r}")
        out["num_gpus"] = gpus
        if sm_share is not None:  # the worker checks it too (and gpu_mem, once it knows the GPU's memory)
            within_grant("sm_share", float(sm_share), float(gpus), "Ray", "num_gpus")
    if extra:
        out["resources"] = extra
    return out


_OPTIONS = frozenset(inspect.signature(options).parameters)  # what options() takes; the rest is Ray's


def remote(target=None, **kwargs):
    """``ray.remote`` with ``options(...)`` of the keywords ``options`` takes, every other keyword passed to
    ``ray.remote`` as it is (``num_cpus``, ``max_retries``, ...), and ``max_calls=1`` for a task unless given:
    ``@colocate.ray.remote(num_gpus=0.5, num_cpus=1)`` over a function or an actor class
    (``@colocate.ray.remote`` alone: one whole GPU, guaranteed)."""
    import ray

    ours = {k: v for k, v in kwargs.items() if k in _OPTIONS}
    theirs = {k: v for k, v in kwargs.items() if k not in _OPTIONS}
    if "runtime_env" in theirs:  # options() makes it: a second one would silently win or lose
        raise ValueError("colocate.ray.remote makes the runtime_env itself: give yours as base= (it is added to)")

    def wrap(obj):
        opts = {**options(**ours), **theirs}
        if not isinstance(obj, type):
            opts.setdefault("max_calls", 1)
        return ray.remote(**opts)(obj)

    return wrap(target) if target is not None else wrap
