"""The ``colocate`` field of a Ray ``runtime_env``: what a Ray task, actor or Ray Train worker asks of colocate.

``runtime_env={"colocate": {"priority": "guaranteed", "gpu_mem": "4GiB"}}``: every field optional, the same
words as ``colocate run``:

* ``priority``: ``guaranteed`` (default) or ``opportunistic``;
* ``gpu_mem``: the memory cap, bytes (int) or a size (``"4GiB"``); default: Ray's GPU fraction of the device;
* ``sm_share``: the compute share 0..1; default: Ray's GPU fraction (1 for a whole GPU);
  both may lower what Ray granted (``num_gpus``), never raise it: the worker refuses a value above the grant
  (``colocate.ray.worker.granted``), as Ray's fraction is known only there;
* ``on_cap``: ``host`` or ``error``, what an allocation over the cap does (default ``host``).

``parse_fields`` is the one validator: the runtime_env plugin (on the node), the driver-side helpers
(``colocate.ray.runtime_env``) and the worker's resolver all call it; a bad field raises ``ValueError`` with
one line naming it. Pure: no Ray import, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from colocate.base.units import parse_fraction, parse_size
from colocate.base.vocab import JobClass, OnCap

FIELD = "colocate"  # the runtime_env key, and the plugin's name
KEYS = ("priority", "gpu_mem", "sm_share", "on_cap")
# the per-node custom resource `colocate ray start` advertises: an opportunistic task asks for one unit of it
# (and for no Ray GPU); the node coordinator picks its GPU
OPPORTUNISTIC_RESOURCE = "colocate_opportunistic"
PLUGIN_CLASS = "colocate.ray.plugin.ColocatePlugin"


@dataclass(frozen=True)
class Fields:
    priority: JobClass = JobClass.GUARANTEED
    gpu_mem: int | None = None  # bytes; None: Ray's fraction of the device
    sm_share: float | None = None  # None: Ray's fraction
    on_cap: OnCap = OnCap.HOST

    def to_json(self) -> str:
        """The value of ``COLOCATE_RAY`` (what ``from_json`` reads back)."""
        return json.dumps({"priority": str(self.priority), "gpu_mem": self.gpu_mem, "sm_share": self.sm_share,
                           "on_cap": str(self.on_cap)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fields:
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"COLOCATE_RAY is not JSON: {text[:80]!r}") from None
        return parse_fields({k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value)


def parse_fields(value) -> Fields:
    """The ``colocate`` field's value (a dict, or None for all defaults) as ``Fields``; ValueError with one line
    naming the bad field otherwise."""
    if value is None:
        return Fields()
    if not isinstance(value, dict):
        raise ValueError(f"runtime_env `colocate` must be a dict of {', '.join(KEYS)}, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ValueError(f"runtime_env `colocate`: unknown field {unknown[0]!r} (fields: {', '.join(KEYS)})")
    priority = value.get("priority", JobClass.GUARANTEED)
    if priority not in tuple(JobClass):
        raise ValueError(f"runtime_env `colocate`: priority must be one of {', '.join(JobClass)}, got {priority!r}")
    on_cap = value.get("on_cap", OnCap.HOST)
    if on_cap not in tuple(OnCap):
        raise ValueError(f"runtime_env `colocate`: on_cap must be one of {', '.join(OnCap)}, got {on_cap!r}")
    gpu_mem = None
    if value.get("gpu_mem") is not None:
        try:
            gpu_mem = parse_size(value["gpu_mem"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"runtime_env `colocate`: gpu_mem: {exc}") from None
        if gpu_mem == 0:
            raise ValueError("runtime_env `colocate`: gpu_mem must be more than 0 bytes")
    sm_share = None
    if value.get("sm_share") is not None:
        if isinstance(value["sm_share"], bool):
            raise ValueError("runtime_env `colocate`: sm_share must be a number between 0 and 1, got a bool")
        try:
            sm_share = parse_fraction(value["sm_share"], "sm_share")
        except ValueError as exc:
            raise ValueError(f"runtime_env `colocate`: {exc}") from None
    return Fields(priority=JobClass(priority), gpu_mem=gpu_mem, sm_share=sm_share, on_cap=OnCap(on_cap))
