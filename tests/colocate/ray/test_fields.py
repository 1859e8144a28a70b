"""colocate.ray without a Ray cluster: the field validator, the driver-side helpers, the plugin's context, the
resolver's refusals and ``colocate ray start``'s command lines."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

from colocate.base.vocab import JobClass, OnCap
from colocate.launcher import INJECT_DIR
from colocate.ray import OPPORTUNISTIC_RESOURCE, options, parse_fields, runtime_env
from colocate.ray.fields import PLUGIN_CLASS, Fields
from colocate.ray.launch import NodeSetup
from colocate.ray.node import node_environment, plugins_value
from colocate.ray.worker import NO_NODE, NO_PLUGIN, resolve
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
    assert fields == Fields(JobClass.OPPORTUNISTIC, GiB, 0.3, OnCap.ERROR)
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


def test_remote_passes_rays_own_options_through(monkeypatch):
    """``@colocate.ray.remote(num_gpus=0.5, num_cpus=0.1)`` failed on num_cpus (and on max_retries, which
    docs/ray.md tells users to set): every keyword options() does not take is Ray's."""
    import ray

    import colocate.ray as cr

    monkeypatch.setattr(ray, "remote", lambda **kw: (lambda obj: kw))
    task = cr.remote(num_gpus=0.5, num_cpus=0.1, max_retries=0, gpu_mem="256MiB")(lambda: None)
    assert (task["num_gpus"], task["num_cpus"], task["max_retries"], task["max_calls"]) == (0.5, 0.1, 0, 1)
    assert task["runtime_env"]["colocate"] == {"gpu_mem": "256MiB"}
    assert cr.remote(max_calls=3)(lambda: None)["max_calls"] == 3
    assert "max_calls" not in cr.remote(num_cpus=2)(type("Actor", (), {}))  # actors take no max_calls
    with pytest.raises(ValueError, match="give yours as base="):
        cr.remote(runtime_env={"pip": ["x"]})(lambda: None)


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
    from colocate.base.engines import Deferred

    raise Deferred("not yet", lambda callback: None)


def test_a_resolver_that_defers_is_not_a_refusal():
    """``Deferred`` passes through ``colocate.base.engines`` (the runtime then installs nothing yet), where a
    ValueError would stop the worker; nothing is written into the environment."""
    from colocate.base.engines import Deferred, prepare

    environ = {"COLOCATE_ENGINE": "x"}
    with pytest.raises(Deferred):
        prepare(environ, {"x": "tests.colocate.ray.test_fields:_deferring"})
    assert environ == {"COLOCATE_ENGINE": "x"}


def test_a_ray_train_worker_without_its_context_is_called_back_after_ray_train_sets_it(monkeypatch):
    """The resolver defers a Ray Train worker that has no context yet: ``Deferred.when(callback)`` wraps Ray
    Train's ``set_train_context`` once, so ``callback`` runs right after the context is set, and puts the
    original back; any other worker is not deferred."""
    import types

    from colocate.ray import worker as W

    calls: list = []
    train_worker = types.SimpleNamespace(set_train_context=lambda context: calls.append(("set", context)))
    original = train_worker.set_train_context
    monkeypatch.delitem(sys.modules, W.TRAIN_WORKER, raising=False)  # a test before may have imported Ray Train
    monkeypatch.delitem(sys.modules, "ray.train.v2._internal.execution.context", raising=False)
    assert W._train_context_wait() is None  # not a Ray Train worker
    monkeypatch.setitem(sys.modules, W.TRAIN_WORKER, train_worker)
    when = W._train_context_wait()
    assert when is not None and calls == []
    when(lambda: calls.append("callback"))
    train_worker.set_train_context("ctx")
    assert calls == [("set", "ctx"), "callback"] and train_worker.set_train_context is original


class FakeRay:
    """What the resolver reads of Ray inside a worker: its GPU ids and the assigned ``GPU`` fraction."""

    def __init__(self, gpu_ids, fraction):
        self.gpu_ids, self.fraction = gpu_ids, fraction

    def is_initialized(self):
        return True

    def get_gpu_ids(self):
        return self.gpu_ids

    def get_runtime_context(self):
        fraction = self.fraction

        class Context:
            def get_actor_id(self):
                return None

            def get_task_id(self):
                return "ab" * 12

            def get_assigned_resources(self):
                return {"GPU": fraction} if fraction else {}

        return Context()


def ray_worker(monkeypatch, fields: dict, num_gpus: float, gpu_mem=GiB) -> dict:
    """``resolve`` in a Ray worker granted ``num_gpus`` of GPU 0 (a simulated GPU of ``gpu_mem``), with the
    runtime_env field ``fields``."""
    monkeypatch.setitem(__import__("sys").modules, "ray", FakeRay([0] if num_gpus else [], num_gpus))
    return resolve({"COLOCATE_RAY": parse_fields(fields).to_json(), "COLOCATE_NODE": "ipc:///x.sock",
                    "COLOCATE_DEVICE": "sim", "COLOCATE_SIM_GPU_MEM": str(gpu_mem)})


@pytest.mark.parametrize("num_gpus, fields, mem, share", [
    (0.25, {}, GiB // 4, 0.25),                                    # the grant
    (0.25, {"sm_share": 0.1, "gpu_mem": "100MiB"}, 100 * MiB, 0.1),  # lowered
    (0.25, {"sm_share": 0.25, "gpu_mem": "256MiB"}, 256 * MiB, 0.25),  # the grant, said
    (0.5, {"gpu_mem": "128MiB"}, 128 * MiB, 0.5),
    (1, {"gpu_mem": "1GiB", "sm_share": 1.0}, GiB, 1.0),          # a whole GPU: all of its memory
    (1, {}, None, None),                                           # a whole GPU: the node's policy decides
    (0, {"priority": "opportunistic", "gpu_mem": "64GiB", "sm_share": 1.0}, 64 * GiB, 1.0),  # requests, no grant
])
def test_a_ray_tasks_fields_lower_its_grant(monkeypatch, num_gpus, fields, mem, share):
    out = ray_worker(monkeypatch, fields, num_gpus)
    assert (int(out["COLOCATE_GPU_MEM"]) if "COLOCATE_GPU_MEM" in out else None) == mem
    assert (float(out["COLOCATE_SM_SHARE"]) if "COLOCATE_SM_SHARE" in out else None) == share
    assert (out.get("COLOCATE_PARTITION") == "1") == (0 < num_gpus < 1)


@pytest.mark.parametrize("num_gpus, fields, words", [
    # the case: num_gpus=0.25 with sm_share 1.0 and gpu_mem 4GiB took the whole GPU
    (0.25, {"sm_share": 1.0, "gpu_mem": "4GiB"}, "sm_share 1 is above this task's Ray grant 0.25 (num_gpus)"),
    (0.25, {"gpu_mem": "4GiB"}, "gpu_mem 4.0 GiB is above this task's Ray grant 256.0 MiB (num_gpus=0.25 of the "
                                "GPU's 1.0 GiB)"),
    (0.5, {"sm_share": 0.51}, "sm_share 0.51 is above this task's Ray grant 0.5 (num_gpus)"),
    (1, {"gpu_mem": "2GiB"}, "gpu_mem 2.0 GiB is above this task's Ray grant 1.0 GiB (num_gpus=1: the whole GPU)"),
])
def test_a_ray_field_above_the_grant_is_refused_in_one_line_naming_it(monkeypatch, num_gpus, fields, words):
    with pytest.raises(ValueError) as info:
        ray_worker(monkeypatch, fields, num_gpus)
    assert words in str(info.value) and str(info.value).endswith("a task may only lower its grant")
    assert "\n" not in str(info.value)


def test_the_driver_refuses_a_share_above_num_gpus_before_ray_sees_it():
    with pytest.raises(ValueError, match="sm_share 1 is above this task's Ray grant 0.25"):
        options(0.25, sm_share=1.0)
    assert options(0.25, sm_share=0.25)["runtime_env"]["colocate"] == {"sm_share": 0.25}
