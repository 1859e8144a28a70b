"""``resolve(environ)``: a Ray worker's colocate variables, decided inside the worker when torch is imported.

Called by the runtime (``colocate.base.engines``) in a process with ``COLOCATE_ENGINE=ray``, before anything reads
the job's variables; returns the ``COLOCATE_*`` values to set. Raises ``ValueError`` with one line (the runtime
prints it and the process exits 2) when the worker must not run: its node has no colocate plugin (no
``COLOCATE_RAY``), no node coordinator (no ``COLOCATE_NODE``), or what it asked of Ray does not fit colocate.

From Ray (``ray.get_gpu_ids()``, ``get_runtime_context().get_assigned_resources()``):

* a guaranteed worker with a fraction ``f < 1`` of a GPU is a fixed partition (``COLOCATE_PARTITION=1``): memory
  cap ``f`` of the device's memory unless ``gpu_mem`` lowers it, compute share ``f`` unless ``sm_share``
  does; the node admits partitions on one GPU while their shares and caps fit;
* a guaranteed worker with a whole GPU is a guaranteed job of the node's policy (cap and share only if given);
* an opportunistic worker holds no Ray GPU (it asked for the ``colocate_opportunistic`` resource):
  ``COLOCATE_GPUS=node``, the node coordinator picks its GPU; its fields are requests the node never exceeds.

A field above Ray's grant (``sm_share`` above ``f``, ``gpu_mem`` above ``f`` of the GPU's memory, or above the
whole memory for a whole GPU) is refused in one line naming the grant (``granted``): a task may only lower it.

A process a Ray worker starts inherits the worker's resolved variables (its ``COLOCATE_JOB_ID`` among them)
and keeps them. A Ray Train (V2) worker imports torch before Ray Train gives it its context (run and ranks):
its resolver defers (``colocate.base.engines.Deferred``) and installs the runtime right after Ray Train sets the
context, before the training function runs (tests/colocate/ray/test_cluster.py fails should a Ray release
set it another way). Identity: the workers of one Ray Train run are one colocate job
(``raytrain-NAME-RUNID``, ranks from Ray Train's context); any other actor is a job of its own
(``ray-actor-ID``), a task too (``ray-task-ID``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from colocate.base.engine_api import Deferred, within_grant
from colocate.base.env import PICK_GPU
from colocate.base.units import format_size
from colocate.base.vocab import DeviceKind, JobClass
from colocate.ray.fields import OPPORTUNISTIC_RESOURCE, Fields

NO_PLUGIN = ("this Ray node does not load the colocate plugin, and the task asked for colocate: start the node "
             "with `colocate ray start` (or add the plugin to RAY_RUNTIME_ENV_PLUGINS, docs/ray.md)")
NO_NODE = "this Ray node runs no colocate node coordinator: start the node with `colocate ray start`"
TRAIN_WORKER = "ray.train.v2._internal.execution.worker_group.worker"  # Ray Train V2's worker actor
MAX_NAME = 48  # characters of a Ray Train run's name kept in the job id


def resolve(environ: Mapping[str, str]) -> dict[str, str]:
    raw = environ.get("COLOCATE_RAY")
    if not raw:
        raise ValueError(NO_PLUGIN)
    fields = Fields.from_json(raw)
    if not environ.get("COLOCATE_NODE"):
        raise ValueError(NO_NODE)
    ray = sys.modules.get("ray")  # a Ray worker has imported it; any other process is not one
    if ray is None or not ray.is_initialized():
        if environ.get("COLOCATE_JOB_ID"):
            return {}  # a process its Ray worker started (a spawned DataLoader worker): the worker's values hold
        raise ValueError("COLOCATE_ENGINE=ray in a process that is neither a Ray worker nor started by one")
    ctx = ray.get_runtime_context()
    when = _train_context_wait() if ctx.get_actor_id() else None
    if when is not None:
        raise Deferred("a Ray Train worker: colocate installs once Ray Train has given it its ranks", when)
    gpu_ids = list(ray.get_gpu_ids())
    fraction = float(ctx.get_assigned_resources().get("GPU", 0.0))
    out = {"COLOCATE_PRIORITY": str(fields.priority), "COLOCATE_ON_CAP": str(fields.on_cap)}
    out.update(identity(ctx))
    if fields.priority == JobClass.OPPORTUNISTIC:
        if gpu_ids:
            raise ValueError(f"an opportunistic colocate task asks for no Ray GPU (num_gpus=0) and one unit of the "
                             f"{OPPORTUNISTIC_RESOURCE!r} resource: the node coordinator picks its GPU")
        out["COLOCATE_GPUS"] = PICK_GPU  # no Ray grant to stay within: the fields are requests, the node's ceilings
        if fields.gpu_mem is not None:
            out["COLOCATE_GPU_MEM"] = str(fields.gpu_mem)
        if fields.sm_share is not None:
            out["COLOCATE_SM_SHARE"] = repr(fields.sm_share)
        return out
    if not gpu_ids or fraction <= 0:
        raise ValueError("a guaranteed colocate task needs a Ray GPU: ask for num_gpus (a fraction, or 1); "
                         "opportunistic work asks for none")
    if len(gpu_ids) > 1 or fraction > 1:
        raise ValueError(f"colocate holds one GPU per Ray worker, this one has {len(gpu_ids)} "
                         f"({fraction:g} GPU): ask for num_gpus <= 1 per worker")
    gpu = _index(gpu_ids[0])
    out.update(_gpus(environ, gpu))
    return out | granted(fields, fraction, lambda: device_memory(environ, gpu))


def granted(fields: Fields, fraction: float, memory: Callable[[], int]) -> dict[str, str]:
    """A guaranteed worker's ``COLOCATE_SM_SHARE``/``COLOCATE_GPU_MEM``/``COLOCATE_PARTITION`` from Ray's grant
    (``fraction`` of one GPU of ``memory()`` bytes, read only when needed) and the task's own fields, which may
    lower the grant, never raise it (``colocate.base.engines.within_grant``: ValueError naming the grant). A fraction
    below 1 is a fixed partition (share and cap: the fraction, or the fields); a whole GPU is a guaranteed job
    of the node's policy (share and cap only if given; a cap above the GPU's memory is refused). Pure but for
    ``memory()`` (the simulated GPU's size, or NVML's total)."""
    source = f"num_gpus={fraction:g}" if fraction < 1 else "num_gpus=1: the whole GPU"
    if fraction < 1:
        total = memory()
        share = within_grant("sm_share", fields.sm_share, fraction, "Ray", "num_gpus")
        cap = within_grant("gpu_mem", fields.gpu_mem, int(total * fraction), "Ray",
                           f"{source} of the GPU's {format_size(total)}", size=True)
        return {"COLOCATE_PARTITION": "1", "COLOCATE_SM_SHARE": repr(float(share)), "COLOCATE_GPU_MEM": str(int(cap))}
    out = {}
    if fields.gpu_mem is not None:
        out["COLOCATE_GPU_MEM"] = str(int(within_grant("gpu_mem", fields.gpu_mem, memory(), "Ray", source, size=True)))
    if fields.sm_share is not None:
        out["COLOCATE_SM_SHARE"] = repr(fields.sm_share)
    return out


def identity(ctx) -> dict[str, str]:
    """``COLOCATE_JOB_ID`` and, for a Ray Train worker, its ranks."""
    train = _train_context()
    if train is not None:
        run = train.train_run_context
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(run.run_config.name or "run"))[:MAX_NAME]
        dist = train.distributed_context
        return {"COLOCATE_JOB_ID": f"raytrain-{name}-{run.run_id[:12]}", "COLOCATE_RANK": str(dist.world_rank),
                "COLOCATE_WORLD_SIZE": str(dist.world_size), "COLOCATE_LOCAL_RANK": str(dist.local_rank)}
    actor = ctx.get_actor_id()
    if actor:
        return {"COLOCATE_JOB_ID": f"ray-actor-{actor[:24]}"}  # its unique part (the rest names the Ray job)
    return {"COLOCATE_JOB_ID": f"ray-task-{ctx.get_task_id()[:16]}"}  # ditto (the rest names the parent)


def _train_context_wait() -> Callable[[Callable[[], None]], None] | None:
    """In a Ray Train worker that has no context yet (torch is imported while Ray Train hands the worker its
    context, ranks included): how to call back right after Ray Train sets it (``Deferred.when``); None when
    this is no such worker."""
    worker: Any = sys.modules.get(TRAIN_WORKER)
    if worker is None or _train_context() is not None or not callable(getattr(worker, "set_train_context", None)):
        return None

    def when(callback: Callable[[], None]) -> None:
        original = worker.set_train_context

        def set_train_context(context) -> None:
            original(context)
            worker.set_train_context = original
            callback()

        worker.set_train_context = set_train_context

    return when


def _train_context():
    """Ray Train (V2)'s context in this worker, or None. Read without its lock: torch may be imported while
    Ray Train holds it."""
    module = sys.modules.get("ray.train.v2._internal.execution.context")
    return getattr(module, "_train_context", None) if module is not None else None


def _index(gpu_id) -> int:
    try:
        return int(gpu_id)
    except (TypeError, ValueError):
        raise ValueError(f"colocate needs GPU indices from Ray, got {gpu_id!r} (start the node's Ray with index "
                         f"CUDA_VISIBLE_DEVICES, as `colocate ray start` does)") from None


def _gpus(environ: Mapping[str, str], gpu: int) -> dict[str, str]:
    """``COLOCATE_GPU`` and ``COLOCATE_GPUS``: the GPUs this process sees (``CUDA_VISIBLE_DEVICES``, which Ray
    Train widens to the node's union), in that order, so the device is ``cuda:<position of gpu>``."""
    try:
        visible = [int(w) for w in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if w.strip()]
    except ValueError:
        visible = []
    if gpu not in visible or len(set(visible)) != len(visible):
        visible = [gpu]
    return {"COLOCATE_GPU": str(gpu), "COLOCATE_GPUS": ",".join(map(str, visible))}


def device_memory(environ: Mapping[str, str], gpu: int) -> int:
    """Bytes of memory of GPU ``gpu`` on this node: the simulated GPU's size, or NVML's total."""
    from colocate.base.env import DEFAULT_SIM_GPU_MEM
    from colocate.base.units import parse_size

    if environ.get("COLOCATE_DEVICE", DeviceKind.SIM) == DeviceKind.CUDA:
        from colocate.gpus.nvml import memory_total

        return int(memory_total(gpu))
    raw = environ.get("COLOCATE_SIM_GPU_MEM")
    return parse_size(raw) if raw else DEFAULT_SIM_GPU_MEM



