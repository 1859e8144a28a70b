"""The Slurm engine's resolver: what Slurm granted a task, as colocate limits.

``resolve(environ)`` runs inside each task (``colocate.base.engines`` calls it when the task imports torch,
before anything reads the job's variables); the SPANK plugin or the TaskProlog only turned colocate on.
It reads Slurm's variables and the ones the plugin set, and returns the ``COLOCATE_*`` values to set:

* ``--gres=shard:N`` on a GPU of S shards (``COLOCATE_SLURM_SHARDS``, the site's count): a guaranteed
  **partition** (``COLOCATE_PARTITION=1``) with compute share N/S and memory cap N/S of the device's
  memory, split evenly between the step's tasks on the node;
* ``--gres=gpu:K``: a guaranteed job on those whole GPUs; the task with ``SLURM_LOCALID=i`` uses the
  i-th (modulo K), as torchrun's workers do;
* no Slurm GPU (``--colocate=opportunistic``, or ``--colocate`` without a GPU): opportunistic, the node
  coordinator picks the GPU (``COLOCATE_GPUS=node``).

The user's ``--colocate-gpu-mem``/``--colocate-sm-share`` (``COLOCATE_GPU_MEM``/``COLOCATE_SM_SHARE``)
only ever lower what Slurm granted: a value above the grant (a share above N/S, a cap above N/S of the GPU's
memory, or above the whole memory for a whole GPU) is refused in one line naming the grant
(``colocate.base.engines.within_grant``); without a Slurm GPU they are requests, which the node never exceeds. Every task of one step is one colocate job, ``slurm-JOB.STEP``, with
ranks from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``. A grant colocate cannot enforce raises
``ValueError`` naming it (the task then stops with one line: fail closed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from colocate.base.engine_api import within_grant
from colocate.base.env import DEFAULT_SIM_GPU_MEM, PICK_GPU, parse_gpus
from colocate.base.units import format_size, parse_fraction, parse_size
from colocate.base.vocab import DeviceKind, JobClass

AUTO = "auto"  # --colocate without a mode: guaranteed with a Slurm GPU, opportunistic without
MODES = (AUTO,) + tuple(JobClass)
# the user's own values, named both ways: the SPANK plugin's options and the TaskProlog's environment
_MEM, _SHARE = "--colocate-gpu-mem (COLOCATE_GPU_MEM)", "--colocate-sm-share (COLOCATE_SM_SHARE)"


def resolve(environ: Mapping[str, str], memory_total: Callable[[int], int] | None = None) -> dict[str, str]:
    """The ``COLOCATE_*`` values for this task (see the module's docstring); ValueError on a grant that
    colocate cannot enforce or a bad value. ``memory_total(gpu)`` gives a CUDA GPU's bytes (default NVML)."""
    mode = environ.get("COLOCATE_SLURM") or AUTO
    if mode not in MODES:
        raise ValueError(f"COLOCATE_SLURM={mode!r}: use one of {', '.join(MODES)}")
    out = _identity(environ)
    shards = _int(environ, "SLURM_SHARDS_ON_NODE")
    gpus = _step_gpus(environ)
    if mode == JobClass.OPPORTUNISTIC:
        if shards or gpus:
            raise ValueError("--colocate=opportunistic takes no Slurm GPU (the node picks one): drop --gres=gpu/shard, "
                             "or ask for guaranteed work")
        return out | _opportunistic(environ)
    if shards:
        return out | _partition(environ, shards, gpus, memory_total)
    if gpus:
        return out | _whole_gpus(environ, gpus, memory_total)
    if mode == JobClass.GUARANTEED:
        raise ValueError("--colocate=guaranteed needs a Slurm GPU: add --gres=gpu:K or --gres=shard:N")
    return out | _opportunistic(environ)


def _identity(environ: Mapping[str, str]) -> dict[str, str]:
    """The step's job id and this task's ranks."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        raise ValueError("COLOCATE_ENGINE=slurm but SLURM_JOB_ID is not set: start the task with srun or sbatch")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    out = {"COLOCATE_JOB_ID": f"slurm-{job}" + (f".{step}" if step else "")}
    for name, slurm in (("COLOCATE_RANK", "SLURM_PROCID"), ("COLOCATE_LOCAL_RANK", "SLURM_LOCALID"),
                        ("COLOCATE_WORLD_SIZE", "SLURM_NTASKS")):
        value = _int(environ, slurm)
        if value is not None:
            out[name] = str(value)
    return out


def _opportunistic(environ: Mapping[str, str]) -> dict[str, str]:
    """No Slurm GPU, so no grant: the user's options are requests, which the node never exceeds."""
    out = {"COLOCATE_PRIORITY": JobClass.OPPORTUNISTIC, "COLOCATE_GPUS": PICK_GPU}
    asked_mem, asked_share = _asked(environ)
    if asked_mem is not None:
        out["COLOCATE_GPU_MEM"] = str(asked_mem)
    if asked_share is not None:
        out["COLOCATE_SM_SHARE"] = repr(asked_share)
    return out


def _whole_gpus(environ: Mapping[str, str], gpus: tuple[int, ...],
                memory_total: Callable[[int], int] | None) -> dict[str, str]:
    local = _int(environ, "SLURM_LOCALID") or 0
    gpu = gpus[local % len(gpus)]
    out = {"COLOCATE_PRIORITY": JobClass.GUARANTEED, "COLOCATE_GPUS": ",".join(map(str, gpus)),
           "COLOCATE_GPU": str(gpu)}
    asked_mem, asked_share = _asked(environ)  # the whole GPU: share 1 (no share is above it), all its memory
    if asked_mem is not None:
        source = f"--gres=gpu:{len(gpus)}: the whole GPU {gpu}"
        out["COLOCATE_GPU_MEM"] = str(int(within_grant(
            _MEM, asked_mem, _device_memory(environ, gpu, memory_total), "Slurm", source, size=True)))
    if asked_share is not None:
        out["COLOCATE_SM_SHARE"] = repr(asked_share)
    return out


def _partition(environ: Mapping[str, str], shards: int, gpus: tuple[int, ...],
               memory_total: Callable[[int], int] | None) -> dict[str, str]:
    per_gpu = _int(environ, "COLOCATE_SLURM_SHARDS")
    if not per_gpu:
        raise ValueError("this task holds GPU shards but COLOCATE_SLURM_SHARDS (the shards per GPU) is not set: "
                         "the site's plugstack.conf line needs shards=S (`colocate slurm config`)")
    if len(gpus) != 1:
        raise ValueError(f"--gres=shard:{shards} was given on {len(gpus) or 'no'} GPU(s) "
                         f"(SLURM_STEP_GPUS={environ.get('SLURM_STEP_GPUS', '')!r}); colocate enforces shards on "
                         "one GPU: ask for fewer shards, or whole GPUs with --gres=gpu:K")
    if shards > per_gpu:
        raise ValueError(f"SLURM_SHARDS_ON_NODE={shards} is more than the {per_gpu} shards per GPU the site "
                         "configured (COLOCATE_SLURM_SHARDS): the plugin's shards= must match gres.conf")
    gpu = gpus[0]
    tasks = _local_tasks(environ)
    share = shards / per_gpu / tasks
    total = _device_memory(environ, gpu, memory_total)
    source = f"--gres=shard:{shards} of {per_gpu}" + (f" between {tasks} tasks" if tasks > 1 else "")
    asked_mem, asked_share = _asked(environ)
    out = {"COLOCATE_PRIORITY": JobClass.GUARANTEED, "COLOCATE_PARTITION": "1", "COLOCATE_GPUS": str(gpu)}
    share = within_grant(_SHARE, asked_share, share, "Slurm", source)
    cap = within_grant(_MEM, asked_mem, int(total * shards / per_gpu / tasks), "Slurm",
                       f"{source} of the GPU's {format_size(total)}", size=True)
    return out | {"COLOCATE_GPU_MEM": str(int(cap)), "COLOCATE_SM_SHARE": repr(float(share))}


def _asked(environ: Mapping[str, str]) -> tuple[int | None, float | None]:
    """The user's own cap and share (``--colocate-gpu-mem``/``--colocate-sm-share``, or the TaskProlog's
    ``COLOCATE_GPU_MEM``/``COLOCATE_SM_SHARE``), None where not given; ValueError on a bad value."""
    asked_mem = asked_share = None
    raw_mem = environ.get("COLOCATE_GPU_MEM")
    if raw_mem:
        try:
            asked_mem = parse_size(raw_mem)
        except ValueError as exc:
            raise ValueError(f"--colocate-gpu-mem (COLOCATE_GPU_MEM={raw_mem!r}): {exc}") from None
    raw_share = environ.get("COLOCATE_SM_SHARE")
    if raw_share:
        try:
            asked_share = parse_fraction(raw_share, "the compute share")
        except ValueError as exc:
            raise ValueError(f"--colocate-sm-share (COLOCATE_SM_SHARE={raw_share!r}): {exc}") from None
    return asked_mem, asked_share


def _device_memory(environ: Mapping[str, str], gpu: int, memory_total: Callable[[int], int] | None) -> int:
    if (environ.get("COLOCATE_DEVICE") or DeviceKind.SIM) == DeviceKind.SIM:
        raw = environ.get("COLOCATE_SIM_GPU_MEM")
        try:
            return parse_size(raw) if raw else DEFAULT_SIM_GPU_MEM
        except ValueError as exc:
            raise ValueError(f"COLOCATE_SIM_GPU_MEM={raw!r}: {exc}") from None
    if memory_total is None:
        from colocate.gpus import nvml

        memory_total = nvml.memory_total
    return memory_total(gpu)


def _step_gpus(environ: Mapping[str, str]) -> tuple[int, ...]:
    """The GPUs Slurm gave this step on this node (node indices, gres.conf order), () for none."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        raw = environ.get(name)
        if raw:
            try:
                return parse_gpus(raw)
            except ValueError as exc:
                raise ValueError(f"{name}={raw!r}: {exc}") from None
    return ()


def _local_tasks(environ: Mapping[str, str]) -> int:
    """The step's tasks on this node (``SLURM_GTIDS`` lists their global ranks), at least 1."""
    raw = environ.get("SLURM_GTIDS") or ""
    return max(1, len([w for w in raw.split(",") if w.strip()]))


def _int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer")
    return value
