"""What a Ray node needs for colocate, and what a colocate worker's environment holds (no Ray import here).

* ``node_environment``: the variables ``ray start`` must run with on a colocate node (the plugin registered in
  ``RAY_RUNTIME_ENV_PLUGINS``, the node coordinator's endpoint, the device kind, the simulated GPUs' memory,
  NVML's GPU order): ``colocate ray start`` uses it, and so may a systemd unit or a KubeRay pod (docs/ray.md);
* ``worker_environment``: the variables that turn the runtime on in a Ray worker (the plugin's
  ``modify_context``; the driver-side helpers set the same switches so that a node without the plugin fails
  closed, ``colocate.ray.worker``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from colocate.ray.fields import PLUGIN_CLASS, Fields

# the node's facts the plugin passes from `ray start`'s environment to the workers
NODE_FACTS = ("COLOCATE_NODE", "COLOCATE_DEVICE", "COLOCATE_SIM_GPU_MEM", "COLOCATE_SIM_CORE")
PLUGINS_VAR = "RAY_RUNTIME_ENV_PLUGINS"


def plugins_value(existing: str | None) -> str:
    """``RAY_RUNTIME_ENV_PLUGINS`` with colocate's plugin added to ``existing`` (a JSON list, or empty)."""
    plugins = json.loads(existing) if existing else []
    if not isinstance(plugins, list):
        raise ValueError(f"{PLUGINS_VAR} must be a JSON list of {{\"class\": ...}}, got {str(existing)[:80]!r}")
    if not any(isinstance(p, dict) and p.get("class") == PLUGIN_CLASS for p in plugins):
        plugins.append({"class": PLUGIN_CLASS})
    return json.dumps(plugins)


def node_environment(endpoint: str, device: str, sim_gpu_mem: int | None = None,
                     base: Mapping[str, str] | None = None) -> dict:
    """The variables to add to ``ray start``'s environment on a node whose ``colocate node`` listens on
    ``endpoint`` (``base``: the environment they join, for an existing plugin list)."""
    existing = (os.environ if base is None else base).get(PLUGINS_VAR)
    env = {
        PLUGINS_VAR: plugins_value(existing),
        "COLOCATE_NODE": endpoint,
        "COLOCATE_DEVICE": device,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # Ray's GPU ids are then NVML's indices, the node coordinator's
    }
    if sim_gpu_mem is not None:
        env["COLOCATE_SIM_GPU_MEM"] = str(int(sim_gpu_mem))
    return env


def switches(pythonpath: str | None) -> dict:
    """The variables that make a Ray worker install colocate's runtime when it imports torch and refuse to run
    without its node: the injected ``sitecustomize`` first on ``PYTHONPATH`` (before ``pythonpath``, else before
    the worker's inherited one)."""
    from colocate.launcher import INJECT_DIR, PROJECT_ROOT

    rest = [p for p in (pythonpath or "${PYTHONPATH}").split(os.pathsep) if p and p not in (INJECT_DIR, PROJECT_ROOT)]
    return {
        "COLOCATE_ENABLED": "1",
        "COLOCATE_ENGINE": "ray",
        "COLOCATE_NODE_REQUIRED": "1",
        "PYTHONPATH": os.pathsep.join([INJECT_DIR, PROJECT_ROOT, *rest]),
    }


def worker_environment(fields: Fields, facts: dict, pythonpath: str | None) -> dict:
    """Everything the plugin adds to a colocate worker's environment: the switches, this node's ``facts``
    (``NODE_FACTS``) and the user's fields as ``COLOCATE_RAY`` (which only the plugin writes: its absence tells
    the worker that its node has no plugin)."""
    env = switches(pythonpath)
    env.update({k: v for k, v in facts.items() if k in NODE_FACTS})
    env["COLOCATE_RAY"] = fields.to_json()
    return env
