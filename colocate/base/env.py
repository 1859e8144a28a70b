"""The one table of ``COLOCATE_*`` environment variables.

The launcher (``colocate run``) writes these into the job's environment; the job
runtime (``torch_hooks.install``) reads them in every Python process the job
starts. ``VARIABLES`` is the single source of truth: the README table is
generated from it (``colocate env``) and ``JobEnv`` parses exactly these names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from colocate.base.units import parse_fraction, parse_size
from colocate.base.vocab import DeviceKind, JobClass, OnCap, YieldMode, member

_E = TypeVar("_E", bound=StrEnum)

PREFIX = "COLOCATE_"


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str
    scope: str = "job"  # job: set by the launcher, read by the runtime (JobEnv); client: read by commands/daemons;
    # engine: read only by an engine's resolver (colocate.<engine>.worker), before JobEnv; node: set by a node in the
    # workers it places, read by their launchers and by the node (colocate.node.fencing)


VARIABLES: tuple[Variable, ...] = (
    Variable("COLOCATE_ENABLED", "0", "1 in a process started by `colocate run`: install the runtime when torch is imported."),
    Variable("COLOCATE_JOB_ID", "<pid>", "Job identifier used in statistics, logs and the node protocol."),
    Variable("COLOCATE_DEVICE", DeviceKind.SIM, "Device kind the job runs on: `sim` or `cuda` (the launcher resolves `auto`)."),
    Variable("COLOCATE_ENGINE", "", "The engine that started this worker (`ray`, `slurm`): when the runtime installs, before any other variable is read, `colocate.<engine>.worker:resolve(environ)` returns the `COLOCATE_*` values this worker runs with (GPU, share, cap, job id, rank, priority, partition; docs/engines.md). Empty: none (`colocate run` wrote the variables)."),
    Variable("COLOCATE_GPUS", "0", "The job's GPUs, comma-separated node indices (simulated or NVML), written by `colocate run --gpus`; a process with torchrun's `LOCAL_RANK` (or COLOCATE_LOCAL_RANK) uses GPU number LOCAL_RANK of the list (modulo its length; on CUDA, `CUDA_VISIBLE_DEVICES` lists the same GPUs in the same order, so it is device `cuda:LOCAL_RANK`), any other process the first. `node` (an opportunistic worker with COLOCATE_NODE): the node coordinator picks this process's GPU when it registers, before CUDA starts (the least utilized over the last 10 s, under 80%, where the memory fits); none fits: the process exits with one line."),
    Variable("COLOCATE_GPU", "<from COLOCATE_GPUS>", "This process's GPU (a node index), when it must differ from what COLOCATE_GPUS and LOCAL_RANK give; it must be one of COLOCATE_GPUS when both are set. The launcher never writes it."),
    Variable("COLOCATE_GPU_MEM", "<device total>", "Device memory cap in bytes; over it, allocations go to host or fail (COLOCATE_ON_CAP)."),
    Variable("COLOCATE_SM_SHARE", "1.0", "Compute share 0..1: the job's device busy fraction is held at or below it; 0 pauses at the next mini-batch."),
    Variable("COLOCATE_PRIORITY", JobClass.GUARANTEED, "`guaranteed` or `opportunistic`."),
    Variable("COLOCATE_PARTITION", "0", "1: a guaranteed worker holding a fixed partition of its GPU, its COLOCATE_SM_SHARE and COLOCATE_GPU_MEM (both required). The node admits several partitions on one GPU while their shares sum to at most 1 and their caps to at most the GPU's memory, never changes their limits, and refuses one that does not fit: the process exits with the node's one line. Opportunistic workers on that GPU get what the partitions leave."),
    Variable("COLOCATE_RANK", "<RANK>", "This worker's rank in its job, when the engine's name for it is not torchrun's `RANK` (read when this is unset). Workers with one COLOCATE_JOB_ID and ranks are one job: each registers as `JOB/RANK`."),
    Variable("COLOCATE_WORLD_SIZE", "<WORLD_SIZE>", "The number of workers in the job (torchrun's `WORLD_SIZE` when unset)."),
    Variable("COLOCATE_LOCAL_RANK", "<LOCAL_RANK>", "This worker's rank on its machine (torchrun's `LOCAL_RANK` when unset): picks its GPU from COLOCATE_GPUS."),
    Variable("COLOCATE_ON_CAP", "host", "`host`: allocations over the cap are served from host memory; `error`: the job stops with one line."),
    Variable("COLOCATE_STATS_DIR", "", "Directory where each job process writes `stats-<pid>.json` at exit (the launcher merges them)."),
    Variable("COLOCATE_TOKEN", "<random>", "Secret the launcher draws per job (a process started without the launcher draws its own); the node binds the job id to it, so no other process can register as this job."),
    Variable("COLOCATE_NODE", "", "Endpoint of the node coordinator (`colocate node` listens on ipc:///tmp/colocate-$UID/node.sock by default); empty: run standalone."),
    Variable("COLOCATE_NODE_REQUIRED", "0", "1: fail closed. The process exits with one line, naming `colocate node`, when the node coordinator at COLOCATE_NODE does not welcome it within COLOCATE_NODE_WAIT_S of install; it never runs without its limits. A registration the node refuses stops the process in one line either way; 0: with no answer it runs on at its own limits."),
    Variable("COLOCATE_NODE_WAIT_S", "5", "Seconds a process with COLOCATE_NODE waits at install for the node's answer to its registration before it runs (then: it stops where it must register, COLOCATE_NODE_REQUIRED, COLOCATE_PARTITION, COLOCATE_GPUS=node, else runs on)."),
    Variable("COLOCATE_RAY", "", "Written by the Ray runtime_env plugin (`colocate.ray.plugin`) in a worker that asked for colocate: its `colocate` fields as JSON. A worker with COLOCATE_ENGINE=ray and none ran on a node without the plugin, and refuses to run (docs/ray.md).", "engine"),
    Variable("COLOCATE_YIELD_VIA", "priority", "How an opportunistic job gives way when the node says so (limits `gate`): `priority` runs it at low device priority (sim: the GPU core's idle scheduling class), `gate` holds its operators while the guaranteed job's device phase runs or is due (sim); comma-separated, or `none`."),
    Variable("COLOCATE_SIM_CORE", "<gpu index mod cores>", "sim: CPU core that is the simulated GPU's compute; the job is pinned to it."),
    Variable("COLOCATE_SIM_GPU_MEM", "16GiB", "sim: total memory of the simulated GPU in bytes (the cap when none is given)."),
    Variable("COLOCATE_SIM_HOST_GBPS", "2.0", "sim: modelled host-memory bandwidth (GB/s); host-served bytes touched per mini-batch cost bytes/bandwidth of device time."),
    Variable("COLOCATE_CHAIN_SITECUSTOMIZE", "", "Set by the launcher: the sys.path entries searched for a pre-existing sitecustomize to run first."),
    Variable("COLOCATE_BOUNDARY_WARN_S", "60", "Seconds of device work with no mini-batch boundary after which the job says so once on stderr, naming `torch_hooks.step()`; 0 disables."),
    Variable("COLOCATE_ITERATIONS", "", "The job's total mini-batches, as its submitter said (`colocate submit --iterations`, `colocate run --iterations`): the total the job reports to its node and the scheduler (`colocate status JOB`). Empty: not said."),
    Variable("COLOCATE_EPOCHS", "", "The job's epochs, as its submitter said (`--epochs`): the total is then the training DataLoader's length times this (seen at the first mini-batch), unless COLOCATE_ITERATIONS says it. Empty: not said."),
    Variable("COLOCATE_LOG", "warning", "Log level of the runtime inside the job (debug, info, warning)."),
    Variable("COLOCATE_SLURM", "", "Slurm: the task asks for colocate (`--colocate[=MODE]` sets it; with the TaskProlog, the user does): `auto` (guaranteed with a Slurm GPU or shard, opportunistic without), `guaranteed` or `opportunistic`; read by `colocate.slurm.worker`.", "engine"),
    Variable("COLOCATE_SLURM_SHARDS", "", "Slurm: shards per GPU on this node, as gres.conf configures them (the site's plugstack.conf `shards=` or TaskProlog setting); `--gres=shard:N` becomes compute share N/S and memory cap N/S.", "engine"),
    Variable("COLOCATE_PLACEMENT", "", "Set by `colocate node` in each worker it places (and passed on to every process of the job): `CLUSTER/PLACEMENT@EPOCH`, the placement and the node incarnation that started it. The worker's launcher stops it when the node's lease file does not cover that incarnation (the node restarted without it); a node starting on the same state folder kills every process so marked that its table does not hold.", "node"),
    Variable("COLOCATE_NODE_STATE", "", "Set by `colocate node` beside COLOCATE_PLACEMENT: the node's state folder, absolute (which node's worker a marked process is).", "node"),
    Variable("COLOCATE_SCHEDULER", "tcp://127.0.0.1:5555", "Clients and nodes: the scheduler's endpoint when `--scheduler` is not given.", "client"),
    Variable("COLOCATE_KEYS", "", "The scheduler, nodes and clients: folder of CURVE keys (`colocate keys generate`) when `--keys` is not given; empty: `$XDG_CONFIG_HOME/colocate/keys` (`~/.config/colocate/keys`), made on first use. No CURVE only with `--insecure`, on loopback.", "client"),
)

NAMES = frozenset(v.name for v in VARIABLES)

DEVICES = tuple(DeviceKind)  # concrete device kinds
DEVICE_CHOICES = ("auto",) + DEVICES  # what a user may ask for; auto = cuda when NVML sees a GPU
ON_CAP = tuple(OnCap)
LOG_LEVELS = ("debug", "info", "warning", "error")
YIELD_MODES = tuple(YieldMode)
DEFAULT_YIELD = (YieldMode.PRIORITY,)  # measured: the gate's polling adds nothing on top of priority (benchmarks/RESULTS.md)

DEFAULT_SIM_GPU_MEM = 16 << 30
DEFAULT_BOUNDARY_WARN_S = 60.0
DEFAULT_NODE_WAIT_S = 5.0
PICK_GPU = "node"  # COLOCATE_GPUS=node: the node coordinator picks this process's GPU


def _get(env: Mapping[str, str], name: str) -> str | None:
    assert name in NAMES, name
    value = env.get(name)
    return value if value not in (None, "") else None


@dataclass(frozen=True)
class JobEnv:
    """Typed view of the job's ``COLOCATE_*`` variables (see ``VARIABLES``)."""

    enabled: bool = False
    job_id: str = ""
    token: str = ""
    device: DeviceKind = DeviceKind.SIM
    gpu: int = 0  # this process's GPU (a node index)
    gpus: tuple[int, ...] = ()  # the job's GPUs (COLOCATE_GPUS), in CUDA_VISIBLE_DEVICES order; () = just (gpu,)
    gpu_mem: int | None = None
    sm_share: float = 1.0
    klass: JobClass = JobClass.GUARANTEED  # the job class (COLOCATE_PRIORITY)
    on_cap: OnCap = OnCap.HOST
    stats_dir: str | None = None
    node: str | None = None
    sim_core: int | None = None
    sim_gpu_mem: int = DEFAULT_SIM_GPU_MEM
    sim_host_gbps: float = 2.0
    log: str = "warning"
    boundary_warn_s: float = DEFAULT_BOUNDARY_WARN_S
    yield_via: tuple[YieldMode, ...] = DEFAULT_YIELD
    rank: int | None = None  # COLOCATE_RANK/LOCAL_RANK/WORLD_SIZE, else torchrun's RANK, ... (None: unset)
    local_rank: int | None = None
    world_size: int | None = None
    engine: str = ""  # COLOCATE_ENGINE (already resolved by colocate.base.engines when the runtime reads this)
    partition: bool = False  # a guaranteed fixed partition: gpu_mem and sm_share are its cap and share
    pick_gpu: bool = False  # COLOCATE_GPUS=node: the node picks ``gpu`` at registration (0 until then)
    node_required: bool = False
    node_wait_s: float = DEFAULT_NODE_WAIT_S
    iterations: int | None = None  # COLOCATE_ITERATIONS: the total mini-batches the submitter said
    epochs: int | None = None  # COLOCATE_EPOCHS
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        """A vocabulary field given as its string becomes the member (ValueError, one line, for another string)."""
        for name, vocab in (("device", DeviceKind), ("klass", JobClass), ("on_cap", OnCap)):
            object.__setattr__(self, name, member(vocab, getattr(self, name), name))
        object.__setattr__(self, "yield_via", tuple(member(YieldMode, m, "yield_via") for m in self.yield_via))

    @property
    def worker_id(self) -> str:
        """This process's id on the node link: ``JOB/RANK`` when torchrun's ``RANK`` is set, else ``JOB``."""
        return self.job_id if self.rank is None else f"{self.job_id}/{self.rank}"

    @property
    def device_index(self) -> int:
        """This process's GPU as the job's device ordinal: its position in ``gpus`` (CUDA: ``cuda:N``)."""
        return self.gpus.index(self.gpu) if self.gpu in self.gpus else 0

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> JobEnv:
        """Parse the variables; raise ValueError naming the variable on a bad value."""
        env = os.environ if env is None else env

        def parsed(name, fn, default):
            raw = _get(env, name)
            if raw is None:
                return default
            try:
                return fn(raw)
            except ValueError as exc:
                raise ValueError(f"{name}={raw!r}: {exc}") from None

        pick_gpu = _get(env, "COLOCATE_GPUS") == PICK_GPU
        gpus = () if pick_gpu else parsed("COLOCATE_GPUS", parse_gpus, ())
        explicit = parsed("COLOCATE_GPU", _nonneg_int, None)
        rank = parsed("COLOCATE_RANK", _nonneg_int, _torchrun_int(env, "RANK"))
        local_rank = parsed("COLOCATE_LOCAL_RANK", _nonneg_int, _torchrun_int(env, "LOCAL_RANK"))
        world_size = parsed("COLOCATE_WORLD_SIZE", _positive_int, _torchrun_int(env, "WORLD_SIZE"))
        if gpus and explicit is not None and explicit not in gpus:
            raise ValueError(f"COLOCATE_GPU={explicit}: must be one of COLOCATE_GPUS ({','.join(map(str, gpus))})")
        gpu = explicit if explicit is not None else (gpus[(local_rank or 0) % len(gpus)] if gpus else 0)
        klass = parsed("COLOCATE_PRIORITY", _member(JobClass), JobClass.GUARANTEED)
        partition = parsed("COLOCATE_PARTITION", _flag, False)
        node = _get(env, "COLOCATE_NODE")
        if partition and (klass != JobClass.GUARANTEED or _get(env, "COLOCATE_SM_SHARE") is None
                          or _get(env, "COLOCATE_GPU_MEM") is None):
            raise ValueError("COLOCATE_PARTITION=1: a partition is guaranteed and needs both COLOCATE_SM_SHARE "
                             "and COLOCATE_GPU_MEM (its share and cap)")
        node_required = parsed("COLOCATE_NODE_REQUIRED", _flag, False)
        if node_required and node is None:
            raise ValueError("COLOCATE_NODE_REQUIRED=1: COLOCATE_NODE is not set (the node coordinator's endpoint)")
        if pick_gpu and (klass != JobClass.OPPORTUNISTIC or node is None or explicit is not None):
            raise ValueError("COLOCATE_GPUS=node: only an opportunistic worker with COLOCATE_NODE (and no "
                             "COLOCATE_GPU) has its GPU picked by the node")
        return cls(
            enabled=_get(env, "COLOCATE_ENABLED") == "1",
            job_id=_get(env, "COLOCATE_JOB_ID") or str(os.getpid()),
            token=_get(env, "COLOCATE_TOKEN") or "",
            device=parsed("COLOCATE_DEVICE", _member(DeviceKind), DeviceKind.SIM),
            gpu=gpu,
            gpus=gpus,
            gpu_mem=parsed("COLOCATE_GPU_MEM", parse_size, None),
            sm_share=parsed("COLOCATE_SM_SHARE", lambda r: parse_fraction(r, "share"), 1.0),
            klass=klass,
            on_cap=parsed("COLOCATE_ON_CAP", _member(OnCap), OnCap.HOST),
            stats_dir=_get(env, "COLOCATE_STATS_DIR"),
            node=node,
            sim_core=parsed("COLOCATE_SIM_CORE", _cpu_core, None),
            sim_gpu_mem=parsed("COLOCATE_SIM_GPU_MEM", parse_size, DEFAULT_SIM_GPU_MEM),
            sim_host_gbps=parsed("COLOCATE_SIM_HOST_GBPS", _positive_float, 2.0),
            log=parsed("COLOCATE_LOG", _choice(LOG_LEVELS), "warning"),
            boundary_warn_s=parsed("COLOCATE_BOUNDARY_WARN_S", _nonneg_float, DEFAULT_BOUNDARY_WARN_S),
            yield_via=parsed("COLOCATE_YIELD_VIA", parse_yield, DEFAULT_YIELD),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            engine=_get(env, "COLOCATE_ENGINE") or "",
            partition=partition,
            pick_gpu=pick_gpu,
            node_required=node_required,
            node_wait_s=parsed("COLOCATE_NODE_WAIT_S", _positive_float, DEFAULT_NODE_WAIT_S),
            iterations=parsed("COLOCATE_ITERATIONS", _positive_int, None),
            epochs=parsed("COLOCATE_EPOCHS", _positive_int, None),
        )

    def to_environ(self) -> dict[str, str]:
        """The variables that reproduce this value (only those that are set; ``COLOCATE_GPU`` only where
        ``gpus`` does not give ``gpu``). Ranks (``COLOCATE_RANK``, torchrun's ``RANK``, ...) and the engine
        are not written: they belong to the process, not to the job."""
        out = {
            "COLOCATE_ENABLED": "1" if self.enabled else "0",
            "COLOCATE_JOB_ID": self.job_id,
            "COLOCATE_DEVICE": self.device,
            "COLOCATE_SM_SHARE": repr(float(self.sm_share)),
            "COLOCATE_PRIORITY": self.klass,
            "COLOCATE_ON_CAP": self.on_cap,
            "COLOCATE_SIM_GPU_MEM": str(self.sim_gpu_mem),
            "COLOCATE_SIM_HOST_GBPS": repr(float(self.sim_host_gbps)),
            "COLOCATE_LOG": self.log,
        }
        if self.pick_gpu:
            out["COLOCATE_GPUS"] = PICK_GPU
        elif self.gpus:
            out["COLOCATE_GPUS"] = format_gpus(self.gpus)
        if not self.pick_gpu and (not self.gpus or self.gpu != self.gpus[0]):
            out["COLOCATE_GPU"] = str(self.gpu)
        if self.partition:
            out["COLOCATE_PARTITION"] = "1"
        if self.node_required:
            out["COLOCATE_NODE_REQUIRED"] = "1"
        if self.node_wait_s != DEFAULT_NODE_WAIT_S:
            out["COLOCATE_NODE_WAIT_S"] = repr(float(self.node_wait_s))
        if self.gpu_mem is not None:
            out["COLOCATE_GPU_MEM"] = str(self.gpu_mem)
        if self.token:
            out["COLOCATE_TOKEN"] = self.token
        if self.stats_dir:
            out["COLOCATE_STATS_DIR"] = self.stats_dir
        if self.node:
            out["COLOCATE_NODE"] = self.node
        if self.sim_core is not None:
            out["COLOCATE_SIM_CORE"] = str(self.sim_core)
        if self.boundary_warn_s != DEFAULT_BOUNDARY_WARN_S:
            out["COLOCATE_BOUNDARY_WARN_S"] = repr(float(self.boundary_warn_s))
        if self.iterations is not None:
            out["COLOCATE_ITERATIONS"] = str(self.iterations)
        if self.epochs is not None:
            out["COLOCATE_EPOCHS"] = str(self.epochs)
        if self.yield_via != DEFAULT_YIELD:
            out["COLOCATE_YIELD_VIA"] = ",".join(self.yield_via) or "none"
        assert set(out) <= NAMES
        return out


# the validators of ``JobEnv.from_environ``: each takes the raw text and returns the value, or raises
# ValueError saying what the value must be


def _member(vocab: type[_E]) -> Callable[[str], _E]:
    def fn(raw: str) -> _E:
        if raw not in tuple(vocab):
            raise ValueError(f"must be one of {', '.join(vocab)}")
        return vocab(raw)
    return fn


def _choice(options) -> Callable[[str], str]:
    def fn(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return raw
    return fn


def _nonneg_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be a non-negative integer")
    return value


def _cpu_core(raw: str) -> int:
    value = _nonneg_int(raw)
    cores = os.cpu_count() or 1
    if value >= cores:
        raise ValueError(f"this machine has {cores} CPU core(s), numbered 0..{cores - 1}")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _nonneg_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a non-negative number of seconds")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return raw == "1"


def _torchrun_int(env: Mapping[str, str], name: str) -> int | None:
    """torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` as a non-negative int; None when unset or not one
    (they are not colocate's to reject)."""
    raw = env.get(name)
    try:
        value = int(raw) if raw not in (None, "") else None
    except ValueError:
        return None
    return value if value is None or value >= 0 else None


def parse_gpus(raw: str) -> tuple[int, ...]:
    """``0,1`` -> (0, 1): distinct non-negative GPU indices, in the order given (at least one)."""
    words = [w.strip() for w in raw.split(",")]
    try:
        gpus = tuple(int(w) for w in words)
    except ValueError:
        raise ValueError("must be comma-separated GPU indices, like 0,1") from None
    if any(g < 0 for g in gpus):
        raise ValueError("must be comma-separated non-negative GPU indices, like 0,1")
    if len(set(gpus)) != len(gpus):
        raise ValueError("lists a GPU twice")
    return gpus


def format_gpus(gpus) -> str:
    """(0, 1) -> ``0,1`` (what ``parse_gpus`` reads)."""
    return ",".join(str(int(g)) for g in gpus)


def parse_yield(raw: str) -> tuple[YieldMode, ...]:
    """``priority,gate`` -> ("priority", "gate"); ``none`` -> (); order and repeats do not matter."""
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if words == ["none"]:
        return ()
    bad = [w for w in words if w not in YIELD_MODES]
    if bad or not words:
        raise ValueError(f"must be `none` or a comma-separated list of {', '.join(YIELD_MODES)}")
    return tuple(m for m in YIELD_MODES if m in words)


def markdown_table() -> str:
    """The README table of variables."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | `{v.default}` | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)
