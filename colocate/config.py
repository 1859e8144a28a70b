"""The one configuration schema of the node coordinator.

``NodeConfig`` holds every tunable of the node and its policy, with units in
the names. It loads from a JSON file (``colocate node --config FILE``) whose keys
are the field names; unknown keys and ill-typed values are errors that name the
key. ``POLICY_NAMES`` is the one list of node policies (``colocate.node.policies`` maps each
name to its class; a test holds the two together); ``FIELDS`` documents every field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace


POLICY_NAMES = ("exclusive", "pack", "static", "adaptive")


@dataclass(frozen=True)
class NodeConfig:
    policy: str = "adaptive"  # exclusive | pack | static | adaptive
    # --- adaptive (AIMD on the opportunistic share, guarded by the guaranteed job's SLO)
    slo_slowdown: float = 0.05  # guaranteed mini-batch time may exceed its solo baseline by this fraction
    baseline_batches: int = 30  # guaranteed batches profiled alone (opportunistic jobs paused)
    baseline_warmup_batches: int = 10  # a new guaranteed job's first batches (warm-up) are never profiled
    baseline_quiet_timeout_s: float = 5.0  # start profiling anyway if a paused job has not confirmed by then
    rebaseline_s: float = 120.0  # re-profile the baseline this often (0: never)
    window_batches: int = 16  # guaranteed batches per AIMD decision
    slo_grow_fraction: float = 0.5  # grow only while the slowdown is within this part of the SLO margin; hold above
    slo_patience_windows: int = 2  # windows over the SLO in a row before backing off (beyond 2x the margin: at once)
    opp_start_share: float = 0.25  # an opportunistic job starts here
    opp_share_step: float = 0.25  # additive increase per good window
    opp_backoff: float = 0.7  # multiplicative decrease on an SLO break
    opp_min_share: float = 0.05  # no running opportunistic job gets less (no starvation)
    opp_start_mem_fraction: float = 0.25  # first opportunistic cap: this part of what is free
    mem_headroom_bytes: int = 256 << 20  # kept free between the guaranteed job's use and opportunistic caps
    gate: bool = True  # opportunistic device work yields to the guaranteed job's device phases
    guaranteed_idle_s: float = 1.0  # no guaranteed batch for this long: treat its GPU as free
    # --- static
    static_share: float = 0.5
    static_mem_fraction: float = 0.5
    # --- liveness (zguide Paranoid Pirate)
    heartbeat_s: float = 1.0
    liveness: int = 3

    def __post_init__(self):
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"policy: unknown {self.policy!r}, use one of {', '.join(POLICY_NAMES)}")
        for name in ("slo_slowdown", "slo_grow_fraction", "opp_start_share", "opp_share_step", "opp_min_share",
                     "opp_start_mem_fraction", "static_share", "static_mem_fraction"):
            v = getattr(self, name)
            if not (0.0 <= v <= 1.0):
                raise ValueError(f"{name}: must be between 0 and 1, got {v!r}")
        if not (0.0 < self.opp_backoff < 1.0):
            raise ValueError(f"opp_backoff: must be in (0, 1), got {self.opp_backoff!r}")
        for name in ("baseline_batches", "window_batches", "liveness", "slo_patience_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        for name in ("baseline_batches", "window_batches"):
            if getattr(self, name) > 64:
                raise ValueError(f"{name}: at most 64 (the reports a node keeps per job)")
        for name in ("rebaseline_s", "guaranteed_idle_s", "baseline_quiet_timeout_s", "heartbeat_s", "mem_headroom_bytes"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")

    @classmethod
    def from_dict(cls, data: dict) -> "NodeConfig":
        if not isinstance(data, dict):
            raise ValueError("config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown config key {key!r}")
            want = type(getattr(cls(), key))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not want:
                raise ValueError(f"{key}: expected {want.__name__}, got {type(value).__name__}")
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> "NodeConfig":
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read config {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"config {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def with_overrides(self, **kw) -> "NodeConfig":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})
