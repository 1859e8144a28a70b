"""colocate.ray without a Ray cluster: the field validator, the driver-side helpers, the plugin's context, the
resolver's refusals and ``colocate ray start``'s command lines."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from colocate.launcher import INJECT_DIR
from colocate.ray import OPPORTUNISTIC_RESOURCE, options, parse_fields, runtime_env
from colocate.ray.fields import PLUGIN_CLASS, Fields
from colocate.ray.launch import NodeSetup
from colocate.ray.node import node_environment, plugins_value
from colocate.ray.worker import NO_NODE, NO_PLUGIN, resolve
from colocate.vocab import OnCap, Priority
from tests.support import GiB, MiB


@pytest.mark.parametrize("value, word", [
    ({"priority": "best-effort"}, "priority"),
    ({"gpu_mem": "lots"}, "gpu_mem"),
    ({"gpu_mem": 0}, "gpu_mem"),
    ({"sm_share": 1.5}, "sm_share"),
    ({"sm_share": True}, "sm_share"),
    ({"on_cap": "crash"}, "on_cap"),
    ({"gpu_memory": "1GiB"}, "gpu_memory"),
    ("guaranteed", "dict"),
])
def test_a_bad_field_is_one_line_naming_it(value, word):
    with pytest.raises(ValueError) as info:
        parse_fields(value)
    assert word in str(info.value) and "\n" not in str(info.value)


def test_fields_take_colocate_runs_words_and_round_trip():
    fields = parse_fields({"priority": "opportunistic", "gpu_mem": "1GiB", "sm_share": "0.3", "on_cap": "error"})
    assert fields == Fields(Priority.OPPORTUNISTIC, GiB, 0.3, OnCap.ERROR)
    assert Fields.from_json(fields.to_json()) == fields
    assert parse_fields(None) == parse_fields({}) == Fields()


def test_options_ask_ray_for_what_colocate_enforces():
    half = options(0.5, gpu_mem="256MiB")
    assert half["num_gpus"] == 0.5 and half["runtime_env"]["colocate"] == {"gpu_mem": "256MiB"}
    env_vars = half["runtime_env"]["env_vars"]
    assert env_vars["COLOCATE_ENGINE"] == "ray" and env_vars["COLOCATE_NODE_REQUIRED"] == "1"
    assert env_vars["PYTHONPATH"].split(os.pathsep)[0] == INJECT_DIR  # the node without the plugin fails closed
    opp = options(priority="opportunistic", resources={"x": 1})
    assert opp["num_gpus"] == 0 and opp["resources"] == {"x": 1, OPPORTUNISTIC_RESOURCE: 1}
    assert options()["num_gpus"] == 1
    for bad in (dict(num_gpus=2), dict(num_gpus=0), dict(num_gpus=0.5, priority="opportunistic"),
                dict(gpu_mem="lots")):
        with pytest.raises(ValueError):
            options(**bad)


def test_runtime_env_keeps_the_users_own_runtime_env():
    env = runtime_env(sm_share=0.25, base={"pip": ["x"], "env_vars": {"PYTHONPATH": "/mine", "A": "1"}})
    assert env["pip"] == ["x"] and env["env_vars"]["A"] == "1" and env["colocate"] == {"sm_share": 0.25}
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[-1] == "/mine"


def test_the_plugin_turns_the_runtime_on_with_the_nodes_facts(monkeypatch):
    pytest.importorskip("ray", reason="ray is not installed (pip install '.[ray]' in the checkout)")
    from ray._private.runtime_env.context import RuntimeEnvContext

    from colocate.ray.plugin import ColocatePlugin

    plugin = ColocatePlugin()
    with pytest.raises(ValueError, match="gpu_mem"):
        plugin.validate({"colocate": {"gpu_mem": "x"}})
    context = RuntimeEnvContext(env_vars={"PYTHONPATH": "/wd"})
    monkeypatch.delenv("COLOCATE_NODE", raising=False)
    with pytest.raises(ValueError, match="colocate ray start"):
        plugin.modify_context([], {"colocate": {}}, context, __import__("logging").getLogger())
    monkeypatch.setenv("COLOCATE_NODE", "ipc:///tmp/x.sock")
    monkeypatch.setenv("COLOCATE_SIM_GPU_MEM", str(GiB))
    plugin.modify_context([], {"colocate": {"gpu_mem": "1MiB"}}, context, __import__("logging").getLogger())
    env = context.env_vars
    assert env["COLOCATE_ENABLED"] == "1" and env["COLOCATE_NODE"] == "ipc:///tmp/x.sock"
    assert env["COLOCATE_SIM_GPU_MEM"] == str(GiB) and Fields.from_json(env["COLOCATE_RAY"]).gpu_mem == MiB
    assert env["PYTHONPATH"].split(os.pathsep)[0] == INJECT_DIR and env["PYTHONPATH"].endswith("/wd")


def test_the_resolver_refuses_a_node_without_plugin_or_coordinator():
    with pytest.raises(ValueError, match="colocate ray start") as info:
        resolve({"COLOCATE_ENGINE": "ray"})
    assert str(info.value) == NO_PLUGIN
    with pytest.raises(ValueError) as info:
        resolve({"COLOCATE_ENGINE": "ray", "COLOCATE_RAY": Fields().to_json()})
    assert str(info.value) == NO_NODE


def test_ray_start_gets_the_plugin_the_resource_and_the_node():
    args = argparse.Namespace(device="sim", sim_gpus=2, sim_gpu_mem=GiB, endpoint="ipc:///tmp/st/node.sock", policy=None,
                              opportunistic_slots=None)
    setup = NodeSetup.from_args(args, ["--head", "--resources", '{"a": 1}', "--node-ip-address", "127.0.0.1"],
                                "/tmp/st")
    argv = setup.ray_command()
    assert argv[argv.index("start"):][:2] == ["start", "--block"]
    assert json.loads(argv[argv.index("--resources") + 1]) == {"a": 1, OPPORTUNISTIC_RESOURCE: 2}
    assert argv[argv.index("--num-gpus") + 1] == "2" and argv.count("--resources") == 1
    env = setup.ray_environment({"RAY_RUNTIME_ENV_PLUGINS": '[{"class": "other.Plugin"}]'})
    assert json.loads(env["RAY_RUNTIME_ENV_PLUGINS"]) == [{"class": "other.Plugin"}, {"class": PLUGIN_CLASS}]
    assert env["COLOCATE_NODE"] == "ipc:///tmp/st/node.sock" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert json.loads(plugins_value(env["RAY_RUNTIME_ENV_PLUGINS"])) == json.loads(env["RAY_RUNTIME_ENV_PLUGINS"])
    assert node_environment("ipc:///n", "cuda", base={})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with pytest.raises(ValueError, match="--resources"):
        NodeSetup.from_args(args, ["--resources", "[1]"], "/tmp/st").ray_command()


def _deferring(environ):
    from colocate.engines import Deferred

    raise Deferred("not yet")


def test_a_resolver_that_defers_is_not_a_refusal():
    """``Deferred`` passes through ``colocate.engines`` (the runtime then installs nothing yet), where a
    ValueError would stop the worker; nothing is written into the environment."""
    from colocate.engines import Deferred, prepare

    environ = {"COLOCATE_ENGINE": "x"}
    with pytest.raises(Deferred):
        prepare(environ, {"x": "tests.colocate.ray.test_fields:_deferring"})
    assert environ == {"COLOCATE_ENGINE": "x"}
