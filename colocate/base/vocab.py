"""The closed vocabularies every colocate part shares, one ``StrEnum`` each.

Each member's value is its wire string (the protocol, the journal, ``COLOCATE_*`` variables, command-line
choices and config files all carry the value), so a member compares and hashes equal to its string and
``str(member)`` is that string. Code names a member (``JobClass.GUARANTEED``), never the literal; the protocol's
field rules take their choices from these enums. This module imports nothing of colocate: every layer may use it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

_E = TypeVar("_E", bound=StrEnum)


class Vocab(StrEnum):
    """A closed vocabulary: a ``StrEnum`` whose members read, in ``repr`` too, as their wire strings, so that a
    message listing them (argparse's "choose from ...", an error naming a value) shows what a user types."""

    def __repr__(self) -> str:
        return repr(self.value)


def member(vocab: type[_E], value: str, what: str) -> _E:
    """``value`` (a member of ``vocab`` or its wire string) as the member; ``ValueError`` in one line naming
    ``what`` and the choices for anything else. For records that accept the string where the member is meant."""
    try:
        return vocab(value)
    except ValueError:
        raise ValueError(f"{what}: must be one of {', '.join(vocab)}, got {value!r:.60}") from None


class JobClass(Vocab):
    """A job's class: a guaranteed job owns its GPUs; an opportunistic one uses what they leave idle. The wire,
    the journal, ``--priority``, ``COLOCATE_PRIORITY`` and ``runtime_env`` call it the job's *priority* (kept for
    compatibility); in code it is ``klass`` or ``JobClass``, and "priority" means the device priority only
    (``YieldMode.PRIORITY``, ``Register.priority_yield``)."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


JOB_CLASSES = tuple(JobClass)  # the choices (command-line options, COLOCATE_PRIORITY, job specs), in order


class JobState(Vocab):
    """A cluster job's life: pending -> placing -> running -> one of the ``TERMINAL`` states."""

    PENDING = "pending"
    PLACING = "placing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})  # a job never leaves these


class DeviceKind(Vocab):
    """The device a job runs on: the CPU-simulated GPU or a real CUDA one."""

    SIM = "sim"
    CUDA = "cuda"


AUTO_DEVICE = "auto"  # what a user may ask for besides a kind: cuda when NVML sees a GPU, else sim


class OnCap(Vocab):
    """What happens to an allocation over a job's memory cap: served from host memory, or the job stops."""

    HOST = "host"
    ERROR = "error"


class YieldMode(Vocab):
    """How an opportunistic job gives way: low device priority, or a gate held while the guaranteed job runs."""

    PRIORITY = "priority"
    GATE = "gate"


class Phase(Vocab):
    """Where an opportunistic job's time beside a guaranteed job goes: starting (host work, before its first
    device work), held while the guaranteed job's solo baseline is profiled, paused (an SLO break, memory),
    or running (``colocate.node.policies`` labels; the demo's and benchmark's phase columns)."""

    STARTUP = "start-up"
    BASELINE = "baseline"
    PAUSED = "paused"
    RUNNING = "running"


class SloState(Vocab):
    """A worker's label from its node (``Want.slo_state``, ``JobInfo.slo_state``, ``colocate top``): who set its
    limits and why. A guaranteed job under ``adaptive``: ``baseline``/``ok``/``violated``/``idle``; an
    opportunistic one: a held ``Phase`` (``baseline``, ``paused``), ``running`` (pause-or-full), AIMD's
    ``growing``/``holding``/``backoff``, ``full`` (no guaranteed job, or it idles), ``paused-mem``; the other
    policies' labels; ``new`` before any plan, ``override`` under ``colocate ctl set``, ``partition``."""

    NEW = "new"
    OVERRIDE = "override"
    PARTITION = "partition"
    EXCLUSIVE = "exclusive"
    STATIC = "static"
    PACKED = "packed"
    WAITING = "waiting"
    BASELINE = "baseline"
    OK = "ok"
    VIOLATED = "violated"
    IDLE = "idle"
    PAUSED = "paused"
    RUNNING = "running"
    FULL = "full"
    GROWING = "growing"
    HOLDING = "holding"
    BACKOFF = "backoff"
    PAUSED_MEM = "paused-mem"


class Engine(Vocab):
    """An existing engine colocate runs inside (``COLOCATE_ENGINE``; ``colocate.base.engines``)."""

    RAY = "ray"
    SLURM = "slurm"


class NodePolicy(Vocab):
    """A node's co-location policy (``colocate.node.policies``)."""

    EXCLUSIVE = "exclusive"
    PACK = "pack"
    STATIC = "static"
    ADAPTIVE = "adaptive"


class KeyRole(Vocab):
    """The role a CURVE key's name gives its holder (``colocate.base.keys``: ``node-gpu7`` is node gpu7)."""

    NODE = "node"
    USER = "user"
    OPERATOR = "operator"
