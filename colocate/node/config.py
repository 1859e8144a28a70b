"""The one configuration schema of the node coordinator.

``NodeConfig`` holds every tunable of the node and its policy, with units in
the names. It loads from a JSON file (``colocate node --config FILE``) whose keys
are the field names; unknown keys and ill-typed values are errors that name the
key. ``heartbeat_s`` and ``liveness`` are told to every job in its ``Welcome``, so they
take the wire's bounds (``colocate.protocol.HEARTBEAT_S``, ``LIVENESS``): a node refuses
at its start what it could not send. ``POLICY_NAMES`` is the one list of node policies
(``colocate.node.policies`` maps each name to its class; a test holds the two together);
``FIELDS`` documents every field.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import StrEnum

from colocate import protocol as P
from colocate.base.vocab import NodePolicy

POLICY_NAMES = tuple(NodePolicy)


def _c(default, doc: str):
    """A config field with its meaning (the README's table is generated from these)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class NodeConfig:
    policy: NodePolicy = _c(NodePolicy.ADAPTIVE, "co-location policy: " + ", ".join(POLICY_NAMES))
    # --- adaptive (pause-or-full or AIMD on the opportunistic share, guarded by the guaranteed job's SLO)
    slo_slowdown: float = _c(0.05, "adaptive: the guaranteed job's mini-batch time may exceed its solo baseline by this fraction")
    baseline_batches: int = _c(16, "adaptive: guaranteed batches profiled alone (opportunistic jobs paused) for the baseline")
    baseline_warmup_batches: int = _c(10, "adaptive: a new guaranteed job's first batches (warm-up) are never profiled")
    baseline_quiet_timeout_s: float = _c(5.0, "adaptive: start profiling anyway if a paused job has not confirmed by then")
    rebaseline_s: float = _c(120.0, "adaptive: re-profile the baseline this often (0: never)")
    window_batches: int = _c(16, "adaptive: guaranteed batches per decision window (AIMD steps once per window; pause-or-full checks the last window after every batch)")
    slo_grow_fraction: float = _c(0.5, "adaptive: grow only while the slowdown is within this part of the SLO margin; hold above")
    slo_patience_windows: int = _c(2, "adaptive: windows over the SLO in a row before backing off (beyond twice the margin: at once)")
    opp_start_share: float = _c(0.25, "adaptive: an opportunistic job's first compute share")
    opp_share_step: float = _c(0.25, "adaptive: additive increase per good window")
    opp_backoff: float = _c(0.7, "adaptive: multiplicative decrease on an SLO break")
    opp_min_share: float = _c(0.05, "adaptive: no running opportunistic job gets less (no starvation)")
    opp_start_mem_fraction: float = _c(0.25, "adaptive: an opportunistic job's first memory cap, as a part of what is free")
    mem_headroom_bytes: int = _c(256 << 20, "adaptive: bytes kept free between the guaranteed job's use and opportunistic caps")
    pause_batches: int = _c(16, "adaptive, pause-or-full (jobs yielding by priority): guaranteed batches profiled alone after an SLO break; their median is the new baseline")
    pause_growth: float = _c(2.0, "adaptive, pause-or-full: a break within pause_recur_windows windows of the last resume multiplies the pause by this")
    pause_recur_windows: int = _c(4, "adaptive, pause-or-full: a break this many windows after a resume or later starts again from pause_batches")
    pause_max_batches: int = _c(64, "adaptive, pause-or-full: the longest pause, in guaranteed batches")
    gate: bool = _c(True, "adaptive: opportunistic jobs yield the device to the guaranteed job (how: COLOCATE_YIELD_VIA)")
    guaranteed_idle_s: float = _c(1.0, "adaptive: no guaranteed batch for this long: its GPU counts as free")
    reclaim_after_s: float = _c(5.0, "adaptive: an opportunistic placement paused for memory this long while the GPU is too full for the guaranteed job is stopped and goes back to the scheduler's queue (0: at once)")
    reclaim_grace_s: float = _c(10.0, "adaptive: seconds a reclaimed worker has between SIGTERM (to save a checkpoint) and SIGKILL")
    # --- static
    static_share: float = _c(0.5, "static: the guaranteed job's compute share (opportunistic jobs split the rest)")
    static_mem_fraction: float = _c(0.5, "static: the guaranteed job's part of the GPU's memory")
    # --- liveness (zguide Paranoid Pirate); told to every job in its Welcome
    heartbeat_s: float = _c(1.0, "seconds between a job's heartbeats")
    liveness: int = _c(3, "silent heartbeat intervals before a job (or the node, for the job) counts as gone")

    def __post_init__(self):
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"policy: unknown {self.policy!r}, use one of {', '.join(POLICY_NAMES)}")
        object.__setattr__(self, "policy", NodePolicy(self.policy))  # a name given as a string becomes the member
        for name in ("slo_slowdown", "slo_grow_fraction", "opp_start_share", "opp_share_step", "opp_min_share",
                     "opp_start_mem_fraction", "static_share", "static_mem_fraction"):
            v = getattr(self, name)
            if not (0.0 <= v <= 1.0):
                raise ValueError(f"{name}: must be between 0 and 1, got {v!r}")
        if not (0.0 < self.opp_backoff < 1.0):
            raise ValueError(f"opp_backoff: must be in (0, 1), got {self.opp_backoff!r}")
        for name in ("baseline_batches", "window_batches", "liveness", "slo_patience_windows", "pause_batches",
                     "pause_recur_windows", "pause_max_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        if not (1.0 <= self.pause_growth <= 16.0):
            raise ValueError(f"pause_growth: must be between 1 and 16, got {self.pause_growth!r}")
        for name in ("baseline_batches", "window_batches", "pause_batches", "pause_max_batches"):
            if getattr(self, name) > 64:
                raise ValueError(f"{name}: at most 64 (the reports a node keeps per job)")
        for name in ("rebaseline_s", "guaranteed_idle_s", "baseline_quiet_timeout_s", "heartbeat_s", "mem_headroom_bytes",
                     "reclaim_after_s", "reclaim_grace_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        # told to every job in its Welcome: the wire's own bounds, so a node refuses at its start what it could not send
        P.HEARTBEAT_S.check(self.heartbeat_s, "heartbeat_s")
        P.LIVENESS.check(self.liveness, "liveness")

    @classmethod
    def from_dict(cls, data: dict) -> NodeConfig:
        if not isinstance(data, dict):
            raise ValueError("config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown config key {key!r}")
            want = type(getattr(cls(), key))
            if issubclass(want, StrEnum):  # a vocabulary member is written as its string
                want = str
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not want:
                raise ValueError(f"{key}: expected {want.__name__}, got {type(value).__name__}")
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> NodeConfig:
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read config {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"config {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def with_overrides(self, **kw) -> NodeConfig:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


def markdown_table() -> str:
    """The README's table of node config fields (``colocate node --config FILE``, JSON)."""
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    for f in fields(NodeConfig):
        default = f.default if f.default is not MISSING else ""
        rows.append(f"| `{f.name}` | `{json.dumps(default)}` | {f.metadata['doc']} |")
    return "\n".join(rows)
