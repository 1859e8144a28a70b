"""The Ray runtime_env plugin ``colocate``: runs in each Ray node's runtime_env agent.

Ray loads it on a node whose ``ray start`` had ``RAY_RUNTIME_ENV_PLUGINS`` naming
``colocate.ray.plugin.ColocatePlugin`` (``colocate ray start`` sets it; ``colocate.ray.node.node_environment``).
For a ``runtime_env`` with a ``colocate`` field it

* ``validate``: checks the field (``colocate.ray.fields.parse_fields``); a bad one fails the task's environment
  set-up with one line naming it;
* ``modify_context``: turns the runtime on in the worker (``COLOCATE_ENABLED=1``, ``COLOCATE_ENGINE=ray``,
  ``COLOCATE_NODE_REQUIRED=1``, the injected ``sitecustomize`` first on ``PYTHONPATH``, as ``colocate run``
  does), passes this node's facts (``COLOCATE_NODE``, ``COLOCATE_DEVICE``, ``COLOCATE_SIM_GPU_MEM``, from the
  agent's own environment, which ``ray start`` got) and the user's fields as ``COLOCATE_RAY``.

Ray caches one result per distinct runtime_env per node, so nothing per worker is decided here: the GPU, the
fraction, the job id and the ranks are resolved inside the worker when torch is imported
(``colocate.ray.worker.resolve``). A DeveloperAPI of Ray (``ray._private``): the tested range is pinned in
``pyproject.toml``'s ``ray`` extra.
"""

from __future__ import annotations

import logging
import os

from ray._private.runtime_env.plugin import RuntimeEnvPlugin

from colocate.ray.fields import FIELD, parse_fields
from colocate.ray.node import NODE_FACTS, worker_environment


class ColocatePlugin(RuntimeEnvPlugin):
    name = FIELD
    priority = 90  # after working_dir, py_modules and pip (0..100, smaller first): our sitecustomize goes first

    @staticmethod
    def validate(runtime_env_dict: dict) -> None:
        parse_fields(runtime_env_dict.get(FIELD))

    def modify_context(self, uris, runtime_env, context, logger: logging.Logger) -> None:
        fields = parse_fields(runtime_env.get(FIELD))
        if not os.environ.get("COLOCATE_NODE"):
            raise ValueError("this Ray node loads the colocate plugin but runs no colocate node (COLOCATE_NODE is "
                             "unset in `ray start`'s environment): start the node with `colocate ray start`")
        facts = {name: os.environ[name] for name in NODE_FACTS if os.environ.get(name)}
        context.env_vars.update(worker_environment(fields, facts, context.env_vars.get("PYTHONPATH")))
        logger.info("colocate: %s on %s", fields, facts.get("COLOCATE_NODE"))
