"""The closed vocabularies every colocate part shares, one ``StrEnum`` each.

Each member's value is its wire string (the protocol, the journal, ``COLOCATE_*`` variables, command-line
choices and config files all carry the value), so a member compares and hashes equal to its string and
``str(member)`` is that string. Code names a member (``Priority.GUARANTEED``), never the literal; the protocol's
field rules take their choices from these enums. This module imports nothing of colocate: every layer may use it.
"""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    """A job's class: a guaranteed job owns its GPUs; an opportunistic one uses what they leave idle."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


PRIORITIES = tuple(Priority)  # the choices (command-line options, COLOCATE_PRIORITY, job specs), in order


class JobState(StrEnum):
    """A cluster job's life: pending -> placing -> running -> one of the ``TERMINAL`` states."""

    PENDING = "pending"
    PLACING = "placing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})  # a job never leaves these


class DeviceKind(StrEnum):
    """The device a job runs on: the CPU-simulated GPU or a real CUDA one."""

    SIM = "sim"
    CUDA = "cuda"


AUTO_DEVICE = "auto"  # what a user may ask for besides a kind: cuda when NVML sees a GPU, else sim


class OnCap(StrEnum):
    """What happens to an allocation over a job's memory cap: served from host memory, or the job stops."""

    HOST = "host"
    ERROR = "error"


class YieldMode(StrEnum):
    """How an opportunistic job gives way: low device priority, or a gate held while the guaranteed job runs."""

    PRIORITY = "priority"
    GATE = "gate"


class Phase(StrEnum):
    """Where an opportunistic job's time beside a guaranteed job goes: starting (host work, before its first
    device work), held while the guaranteed job's solo baseline is profiled, paused (an SLO break, memory),
    or running (``colocate.node.policies`` labels; the demo's and benchmark's phase columns)."""

    STARTUP = "start-up"
    BASELINE = "baseline"
    PAUSED = "paused"
    RUNNING = "running"


class Engine(StrEnum):
    """An existing engine colocate runs inside (``COLOCATE_ENGINE``; ``colocate.base.engines``)."""

    RAY = "ray"
    SLURM = "slurm"


class NodePolicy(StrEnum):
    """A node's co-location policy (``colocate.node.policies``)."""

    EXCLUSIVE = "exclusive"
    PACK = "pack"
    STATIC = "static"
    ADAPTIVE = "adaptive"


class KeyRole(StrEnum):
    """The role a CURVE key's name gives its holder (``colocate.base.keys``: ``node-gpu7`` is node gpu7)."""

    NODE = "node"
    USER = "user"
    OPERATOR = "operator"
