"""The history record kept per finished job, and the key levels a prediction looks it up by.

``HistoryRecord`` holds what the cluster learns from one job: its two fingerprints (see
``cluster.predict.fingerprint``), user, GPU count and type, what the job reported (iterations,
step times, peak memory, busy fraction, its features; None where it reported nothing), the memory
cap and compute share it ran under and whether they were its recommendation, its wall time and its
exit state, and its submit and end times (seconds on the scheduler's clock). ``to_dict``/``from_dict``
round-trip it through JSON (the journal); ``from_dict`` raises ``ValueError`` with one line for a
malformed record.

``JobKey`` is what a prediction is asked for; ``levels(key)`` lists its lookup keys from the most
specific to the broadest: ``exact+gpus`` (exact fingerprint, same GPU count and type), ``exact``,
``family``, ``user+gpus``, ``user``, ``gpus`` (GPU count only), ``all``. A level whose fingerprint
or user is empty is left out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from colocate.base.vocab import JobState


class Exit(StrEnum):
    SUCCEEDED = JobState.SUCCEEDED.value
    FAILED = JobState.FAILED.value
    OOM = "oom"  # failed for want of GPU memory
    KILLED = "killed"  # cancelled or preempted


LEVELS = ("exact+gpus", "exact", "family", "user+gpus", "user", "gpus", "all")


class JobKey(NamedTuple):
    exact: str = ""
    family: str = ""
    user: str = ""
    gpus: int = 0
    gpu_type: str = ""


def levels(key: JobKey) -> list[tuple[str, tuple]]:
    """(level name, lookup key) from the most specific level to ``all`` (module docstring)."""
    out: list[tuple[str, tuple]] = []
    if key.exact:
        out.append(("exact+gpus", ("exact+gpus", key.exact, key.gpus, key.gpu_type)))
        out.append(("exact", ("exact", key.exact)))
    if key.family:
        out.append(("family", ("family", key.family)))
    if key.user:
        out.append(("user+gpus", ("user+gpus", key.user, key.gpus)))
        out.append(("user", ("user", key.user)))
    out.append(("gpus", ("gpus", key.gpus)))
    out.append(("all", ("all",)))
    return out


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    job_id: str
    exact: str
    family: str
    user: str
    gpus: int
    gpu_type: str  # the model of the GPUs it ran on ("" unknown)
    wall_s: float  # running time, start to end
    exit: Exit
    submit_s: float
    end_s: float
    iterations: int | None = None
    step_p50_s: float | None = None  # median time per iteration
    step_p90_s: float | None = None
    peak_mem: int | None = None  # bytes, the largest of its GPUs
    busy: float | None = None  # device busy fraction, 0..1
    mem_cap: int | None = None  # bytes: the memory cap it ran under (None: the whole GPU)
    sm_share: float | None = None  # the compute share it ran under (None: the whole GPU)
    recommended: bool = False  # its cap or share was its recommendation (``--gpu-mem auto``)
    features: dict | None = None  # its ``Features`` as their wire map (``colocate.protocol.record_map``)
    gpu_model: str = ""  # the GPU model(s) the job asked for (``JobSpec.gpu_model``; "" any): its key's type
    numbers: tuple[float, ...] | None = None  # the numbers of its arguments its family masks (``fingerprint.numbers``)

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("history record: empty job id")
        if not (isinstance(self.gpus, int) and self.gpus >= 0):
            raise ValueError(f"history record {self.job_id}: gpus must be an integer >= 0, got {self.gpus!r}")
        if not (isinstance(self.wall_s, (int, float)) and math.isfinite(self.wall_s) and self.wall_s >= 0):
            raise ValueError(f"history record {self.job_id}: wall_s must be seconds >= 0, got {self.wall_s!r}")
        for name in ("submit_s", "end_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise ValueError(f"history record {self.job_id}: {name} must be a finite number, got {v!r}")
        if self.end_s < self.submit_s:
            raise ValueError(f"history record {self.job_id}: ends ({self.end_s:g}) before its submit ({self.submit_s:g})")
        if self.iterations is not None and not (isinstance(self.iterations, int) and self.iterations >= 0):
            raise ValueError(f"history record {self.job_id}: iterations must be an integer >= 0, got {self.iterations!r}")
        for name in ("step_p50_s", "step_p90_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"history record {self.job_id}: {name} must be seconds > 0, got {v!r}")
        if self.peak_mem is not None and not (isinstance(self.peak_mem, int) and self.peak_mem >= 0):
            raise ValueError(f"history record {self.job_id}: peak_mem must be bytes >= 0, got {self.peak_mem!r}")
        if self.busy is not None and not (isinstance(self.busy, (int, float)) and 0.0 <= self.busy <= 1.0):
            raise ValueError(f"history record {self.job_id}: busy must be in [0, 1], got {self.busy!r}")
        if self.mem_cap is not None and not (isinstance(self.mem_cap, int) and self.mem_cap > 0):
            raise ValueError(f"history record {self.job_id}: mem_cap must be bytes > 0, got {self.mem_cap!r}")
        if self.sm_share is not None and not (isinstance(self.sm_share, (int, float)) and 0.0 < self.sm_share <= 1.0):
            raise ValueError(f"history record {self.job_id}: sm_share must be in (0, 1], got {self.sm_share!r}")
        if self.numbers is not None:
            if not (isinstance(self.numbers, (list, tuple)) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in self.numbers)):
                raise ValueError(f"history record {self.job_id}: numbers must be a list of finite numbers, "
                                 f"got {self.numbers!r:.60}")
            object.__setattr__(self, "numbers", tuple(float(x) for x in self.numbers))
        if self.features is not None and not isinstance(self.features, dict):
            raise ValueError(f"history record {self.job_id}: features must be an object, got {self.features!r:.40}")

    @property
    def key(self) -> JobKey:
        """The key the record is learned under: its GPU type is the one the job asked for (what a prediction for
        the same job is asked with), not ``gpu_type``, the one it ran on."""
        return JobKey(self.exact, self.family, self.user, self.gpus, self.gpu_model)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit"] = str(self.exit)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> HistoryRecord:
        if not isinstance(d, dict):
            raise ValueError(f"history record: expected an object, got {type(d).__name__}")
        names = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - names)
        if extra:
            raise ValueError(f"history record: unknown field(s) {', '.join(extra)}")
        try:
            exit_ = Exit(str(d.get("exit")))
        except ValueError:
            raise ValueError(f"history record: exit must be one of {', '.join(e.value for e in Exit)}, "
                             f"got {d.get('exit')!r}") from None
        try:
            return cls(**{**d, "exit": exit_})
        except TypeError as e:
            raise ValueError(f"history record: {e}") from None
