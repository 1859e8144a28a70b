"""The policy config: which plugins run, their parameters, and the scheduler's own settings.

A mapping as TOML gives it (one file for ``colocate scheduler --config FILE``, read by
``cluster.config_file``), or a preset name from ``PRESETS`` (the
one source of policy names, for ``colocate simulate --policy NAME``)::

    plugins = ["multi_queue", "gang", "binpack", "backfill", "predictor"]

    [scheduler]             # optional; defaults shown in SCHEDULER_PARAMS
    feasible_nodes = 4

    [plugin.multi_queue]    # parameters of one listed plugin ("plugin", singular: TOML does
    queues = ["research"]   # not allow a key to be both the list and a table)

    [plugin.backfill]
    depth = 100

The always-on ``fit`` plugin is added first when not listed. Unknown keys, unknown plugin names,
parameters for an unlisted plugin and bad values raise ``ValueError`` with one line that names
the key. This module is the config's schema and parses a mapping; it does no I/O (an import-linter
contract): reading a TOML file is ``cluster.config_file``'s, at the edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import cluster.plugins  # noqa: F401  (registers every plugin)
from cluster.params import Param, parse_params
from cluster.points import REGISTRY, Plugin, check_plugins

SCHEDULER_PARAMS = {
    "feasible_nodes": Param(4, "int", lambda v: v >= 1, "an integer >= 1"),
    "max_nodes_examined": Param(0, "int", lambda v: v >= 0, "an integer >= 0 (0: no limit)"),
    "max_start_failures": Param(3, "int", lambda v: v >= 1, "an integer >= 1"),
    "start_timeout_s": Param(300.0, "float", lambda v: v >= 0, "seconds >= 0 (0: no deadline)"),
    "restore_grace_s": Param(120.0, "float", lambda v: v >= 0, "seconds >= 0"),
    "refuse_unplaceable": Param(True, "bool", doc="refuse at submit a request no known node could ever hold "
                                "(false: accept it and set it aside until such a node joins)"),
    # what a job leaves to its recommendation when its submit states neither (the site's default for
    # ``colocate submit --gpu-mem auto --sm-share auto``)
    "auto": Param((), "list[str]", lambda v: set(v) <= {"gpu_mem", "sm_share"},
                  "resources a job that does not state them gets as recommended: gpu_mem, sm_share"),
    "recommend_margin": Param(1.2, "float", lambda v: 1 <= v <= 10,
                              "a recommended memory cap is the p95 of past peaks times this (1..10)"),
    "recommend_slowdown": Param(1.1, "float", lambda v: 1 <= v <= 10,
                                "a recommended compute share keeps max(1, busy / share) under this (1..10)"),
}
TOP_KEYS = ("plugins", "plugin", "scheduler")
ALWAYS = ("fit",)

PRESETS: dict[str, dict[str, Any]] = {
    # FIFO order, gang, and the Kubernetes-default style of placement (emptiest node first)
    "fifo": {"plugins": ["fifo", "gang", "spread"]},
    # seed 000's lab scheduler without the multi-queue: FIFO + gang + bin-packing
    "gang-binpack": {"plugins": ["fifo", "gang", "binpack"]},
    # seed 000: small requests (<= 2 GPUs) apart from large ones, with aging (a large gang blocked for
    # starvation_s holds the small queue until it starts: never starved)
    "multi-queue": {"plugins": ["multi_queue", "gang", "binpack"]},
    # seed 000's multi-queue as the talk describes it, without aging: small jobs always pass
    "multi-queue-plain": {"plugins": ["multi_queue", "gang", "binpack"],
                          "plugin": {"multi_queue": {"starvation_s": math.inf}}},
    # seed 000: EASY backfill with history-based run-time prediction
    "backfill": {"plugins": ["fifo", "gang", "binpack", "backfill", "predictor"]},
    # AntMan: guaranteed (gang + bin-packing) and opportunistic (least-utilized GPUs) jobs,
    # preemption of opportunistic work for guaranteed jobs, promotion
    "antman": {"plugins": ["multi_queue", "gang", "binpack", "opportunistic", "preemption", "promotion"]},
    # per-tenant quotas (tenant = user, 8 GPUs each) with borrowing and reclaim
    "quota": {"plugins": ["fifo", "gang", "binpack", "quota"],
              "plugin": {"quota": {"tenant": "user", "default_quota": 8}}},
    # placement baselines and policies of seeds 004 (GA) and the FGD paper (ATC'23), FIFO + gang
    "first-fit": {"plugins": ["fifo", "gang", "first_fit"]},
    "round-robin": {"plugins": ["fifo", "gang", "round_robin"]},
    "best-fit": {"plugins": ["fifo", "gang", "best_fit"]},
    "tetris": {"plugins": ["fifo", "gang", "tetris"]},
    "fgd": {"plugins": ["fifo", "gang", "fgd"]},
    "genetic": {"plugins": ["fifo", "gang", "genetic"]},
    # network-aware gangs: the fewest nodes, then switches, then racks (node labels switch/rack)
    "topology": {"plugins": ["fifo", "gang", "topology"]},
    # the same GA with fitness = the machine's utilization with the task (prefers fuller machines)
    "genetic-after": {"plugins": ["fifo", "gang", "genetic"], "plugin": {"genetic": {"fitness": "after"}}},
}


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    plugins: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)

    def instantiate(self) -> list[Plugin]:
        """Fresh plugin objects, in config order (each core needs its own)."""
        return [REGISTRY[n](dict(self.params[n])) for n in self.plugins]


def _plugin_params(name: str) -> dict[str, Param]:
    return REGISTRY[name].PARAMS


def parse_config(raw: Any, name: str = "<config>") -> PolicyConfig:
    """Validate a config mapping (as TOML gives it); raise ValueError naming the bad key."""
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: expected a table at top level")
    for key in raw:
        if key not in TOP_KEYS:
            raise ValueError(f"{key}: unknown key (known: {', '.join(TOP_KEYS)})")
    names = raw.get("plugins")
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"plugins: expected a non-empty list of plugin names, got {names!r}")
    for n in names:
        if n not in REGISTRY:
            raise ValueError(f"plugins: unknown plugin {n!r} (known: {', '.join(sorted(REGISTRY))})")
    if len(set(names)) != len(names):
        raise ValueError(f"plugins: a plugin is listed twice in {list(names)!r}")
    names = [a for a in ALWAYS if a not in names] + list(names)
    tables = raw.get("plugin", {})
    if not isinstance(tables, dict):
        raise ValueError(f"plugin: expected tables [plugin.NAME], got {tables!r}")
    for n in tables:
        if n not in names:
            raise ValueError(f"plugin.{n}: parameters for a plugin not in plugins")
    params = {n: parse_params(f"plugin.{n}", _plugin_params(n), tables.get(n)) for n in names}
    sched = parse_params("scheduler", SCHEDULER_PARAMS, raw.get("scheduler"))
    cfg = PolicyConfig(name, tuple(names), params, sched)
    cfg.instantiate()  # plugins check parameter combinations in __init__
    check_plugins([REGISTRY[n] for n in names])
    return cfg


def preset(name: str) -> PolicyConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown policy {name!r} (presets: {', '.join(PRESETS)})")
    return parse_config(PRESETS[name], name)


__all__ = ["PRESETS", "SCHEDULER_PARAMS", "PolicyConfig", "parse_config", "preset"]


def reference_markdown() -> str:
    """The policy reference of ``docs/scheduler.md``: presets, plugins (their docstring's first
    paragraph) and every parameter with its default, from the registry (the one source)."""
    import importlib
    import json

    def cell(v: Any) -> str:
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf"
        return json.dumps(v, default=str).replace("|", "\\|")

    out = ["### Presets", "", "| preset | plugins (`fit` is always on) | parameters |", "| --- | --- | --- |"]
    for name, raw in PRESETS.items():
        params = "; ".join(f"{p}: " + ", ".join(f"{k} = {cell(v)}" for k, v in t.items())
                           for p, t in raw.get("plugin", {}).items()) or "-"
        out.append(f"| `{name}` | {', '.join(raw['plugins'])} | {params} |")
    shipped = {n: c for n, c in REGISTRY.items() if c.__module__.startswith("cluster.plugins.")}
    out += ["", "### Plugins", "", "| plugin | places | what it does |", "| --- | --- | --- |"]
    for name, cls in shipped.items():
        doc = (importlib.import_module(cls.__module__).__doc__ or "").strip().split("\n\n")[0]
        what = " ".join(doc.split()).replace("|", "\\|")
        out.append(f"| `{name}` | {', '.join(sorted(cls.serves))} | {what} |")
    out += ["", "### Parameters", "", "| parameter | default | valid |", "| --- | --- | --- |"]
    for key, p in SCHEDULER_PARAMS.items():
        out.append(f"| `scheduler.{key}` | `{cell(p.default)}` | {p.doc or p.kind} |")
    for name, cls in shipped.items():
        for key, p in cls.PARAMS.items():
            valid = (p.doc or p.kind) + (f" ({', '.join(map(str, p.choices))})" if p.choices else "")
            out.append(f"| `plugin.{name}.{key}` | `{cell(p.default)}` | {valid.replace('|', chr(92) + '|')} |")
    return "\n".join(out)
