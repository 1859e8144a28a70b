"""colocate inside a real multi-node Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``), one per module.

The cluster: a head with one simulated GPU and NO colocate plugin (resource ``noplugin``), node A with two
simulated GPUs and node B with one, each with the plugin and its own ``colocate node`` (the environment
``colocate ray start`` gives ``ray start``: ``colocate.ray.node.node_environment``). Every Ray listener is on
127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` from conftest.py, ``node_ip_address``). The tests drive it from this process;
what a worker saw comes back from the worker, what the node coordinators admitted from their listings.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install '.[ray]' in the checkout)")

from colocate.ray import OPPORTUNISTIC_RESOURCE, options, remote  # noqa: E402
from colocate.ray.node import node_environment  # noqa: E402
from colocate.ray.worker import NO_PLUGIN  # noqa: E402
from tests.support import GiB, MiB, NodeProc, Procs, free_port, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SIM_MEM = 1 * GiB
CALL_S = 120  # bound on one remote call (a worker starts and imports torch on a loaded 2-core machine)


class Cluster:
    def __init__(self, tmp: Path):
        import ray._private.ray_constants as ray_constants

        assert not ray_constants.ENABLE_RAY_CLUSTER, "conftest.py: ray was imported before it set loopback"

        self.tmp = tmp
        self.procs = [Procs(_mkdir(tmp / "a")), Procs(_mkdir(tmp / "b"))]  # a node's log is in its folder
        self.ray = None
        try:
            self._start()
        except BaseException:
            self.close()  # what did start (a node, Ray's processes) is stopped even when the set-up fails
            raise

    def _start(self) -> None:
        from ray.cluster_utils import Cluster as RayCluster

        tmp = self.tmp
        self.node_a = NodeProc(self.procs[0], tmp / "a", "--sim-gpus", 2, "--sim-gpu-mem", SIM_MEM,
                               metrics=False, record=False).start()
        self.node_b = NodeProc(self.procs[1], tmp / "b", "--sim-gpus", 1, "--sim-gpu-mem", SIM_MEM,
                               metrics=False, record=False).start()
        loopback = {"node_ip_address": "127.0.0.1"}
        self.ray = RayCluster(initialize_head=True, head_node_args=dict(
            loopback, num_cpus=2, num_gpus=1, resources={"noplugin": 8}, include_dashboard=False,
            dashboard_agent_listen_port=free_port(),  # not Ray's fixed default: another Ray may run here
            _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False}))
        for name, node, gpus in (("node_a", self.node_a, 2), ("node_b", self.node_b, 1)):
            env = node_environment(node.endpoint, "sim", SIM_MEM, base={})
            self.ray.add_node(**loopback, num_cpus=4, num_gpus=gpus, env_vars=env,
                              resources={name: 8, "colocate_test_node": 8, OPPORTUNISTIC_RESOURCE: gpus})
        ray.init(address=self.ray.address, log_to_driver=False)

    def close(self) -> None:
        try:
            ray.shutdown()
        finally:
            if self.ray is not None:
                self.ray.shutdown()
            for procs in self.procs:
                procs.cleanup()

    def logs_with(self, text: str) -> list[str]:
        """Lines of this session's worker logs that hold ``text``."""
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
        return [line for path in logs.glob("worker-*") for line in path.read_text(errors="replace").splitlines()
                if text in line]


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def cluster():
    tmp = Path(tempfile.mkdtemp(prefix="cr-"))
    c = Cluster(tmp)
    try:
        yield c
    finally:
        c.close()
        shutil.rmtree(tmp, ignore_errors=True)


class Worker:
    """A colocate worker: trains a small MLP for ``seconds``, optionally holding ``hold_mib`` more of device
    memory, and says what it ran with."""

    def run(self, seconds: float = 0.0, hold_mib: int = 0) -> dict:
        import torch

        import torch_hooks

        model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        held = torch.ones(hold_mib * MiB // 4) if hold_mib else None
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            loss = model(torch.randn(32, 128)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        stats = torch_hooks.stats()
        del held
        return {"env": {k: v for k, v in os.environ.items() if k.startswith("COLOCATE_") and k != "COLOCATE_TOKEN"},
                "limits": torch_hooks.limits(), "stats": stats, "gpu_ids": ray.get_gpu_ids(), "pid": os.getpid()}


def test_fractional_guaranteed_actors_are_partitions_held_to_their_fraction(cluster):
    """Two actors of num_gpus=0.5 share GPU 0 of node A as partitions (cap 0.5 of its memory, share 0.5);
    a third of 0.25 with gpu_mem 256MiB (a plain runtime_env: the plugin alone turns colocate on) is held to
    256 MiB though it holds more; an opportunistic task on the same node gets a GPU the node picked."""
    Actor = ray.remote(Worker)
    halves = [Actor.options(**options(0.5, resources={"node_a": 1})).remote() for _ in range(2)]
    # Ray gives a fraction the GPU it fits best: the halves must hold their GPUs before the quarter asks, or the
    # quarter may take GPU 0 first and push one half to GPU 1.
    ray.get([half.__ray_ready__.remote() for half in halves], timeout=CALL_S)
    quarter = Actor.options(num_gpus=0.25, resources={"node_a": 1},
                            runtime_env={"colocate": {"gpu_mem": "256MiB"}}).remote()
    runs = [a.run.remote(1.5) for a in halves] + [quarter.run.remote(0.5, hold_mib=300)]

    @remote(priority="opportunistic", resources={"node_a": 1})
    def opportunistic():
        return Worker().run(0.2)

    opp = opportunistic.remote()
    first, second, third = ray.get(runs, timeout=CALL_S)
    assert first["gpu_ids"] == second["gpu_ids"]  # Ray packed both halves on one GPU (best fit)
    for half in (first, second):
        assert half["env"]["COLOCATE_PARTITION"] == "1", half["env"]
        assert half["limits"]["mem_cap"] == SIM_MEM // 2 and half["limits"]["sm_share"] == 0.5
        assert half["stats"]["mem_reserved_peak_bytes"] <= SIM_MEM // 2
        assert half["env"]["COLOCATE_JOB_ID"].startswith("ray-actor-")
    assert first["env"]["COLOCATE_JOB_ID"] != second["env"]["COLOCATE_JOB_ID"]
    assert third["gpu_ids"] != first["gpu_ids"]
    assert (third["limits"]["mem_cap"], third["limits"]["sm_share"]) == (256 * MiB, 0.25)
    assert third["stats"]["mem_reserved_peak_bytes"] <= 256 * MiB
    assert third["stats"]["host_bytes_peak"] > 0  # what it held over its cap went to host memory

    jobs = cluster.node_a.jobs()  # the node coordinator admitted them with those limits
    for run in (first, second, third):
        assert run["env"]["COLOCATE_JOB_ID"] in jobs, (jobs, cluster.node_a.log()[-3000:])
        info = jobs[run["env"]["COLOCATE_JOB_ID"]]
        assert (info.gpu, info.mem_cap, info.sm_share) == (run["gpu_ids"][0], run["limits"]["mem_cap"],
                                                            run["limits"]["sm_share"])
    picked = ray.get(opp, timeout=CALL_S)
    assert picked["gpu_ids"] == [] and picked["env"]["COLOCATE_GPUS"] == "node"
    assert picked["env"]["COLOCATE_PRIORITY"] == "opportunistic"
    for actor in [*halves, quarter]:
        ray.kill(actor)


def test_ray_train_on_two_nodes_is_one_job_and_its_placement_group_all_or_nothing(cluster):
    """A TorchTrainer run of two whole-GPU workers in a STRICT_SPREAD placement group (one 1-GPU bundle on
    each plugin node): both workers start and are one colocate job, each node coordinator registering its
    rank, with the rendezvous on 127.0.0.1. Three such bundles cannot be placed on two nodes: the
    reservation is all or nothing, so no worker of it starts anywhere."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from colocate.ray import runtime_env

    out = cluster.tmp / "train"

    def train_fn():
        import json

        import torch
        import torch.distributed as dist

        import torch_hooks

        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        env = {k: v for k, v in os.environ.items() if k.startswith("COLOCATE_") and k != "COLOCATE_TOKEN"}
        seen = {"master": os.environ.get("MASTER_ADDR"), "iterations": torch_hooks.stats()["iterations"], **env}
        (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(seen))

    bundle = {"GPU": 1, "CPU": 1, "colocate_test_node": 1}
    trainer = TorchTrainer(
        train_fn, torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True, placement_strategy="STRICT_SPREAD",
                                     resources_per_worker={"GPU": 1, "colocate_test_node": 1}),
        run_config=RunConfig(name="rt-two-nodes", storage_path=str(out), worker_runtime_env=runtime_env()),
    )
    trainer.fit()
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    job = ranks[0]["COLOCATE_JOB_ID"]
    assert job.startswith("raytrain-rt-two-nodes-") and ranks[1]["COLOCATE_JOB_ID"] == job, ranks
    for rank, seen in enumerate(ranks):
        assert (seen["COLOCATE_RANK"], seen["COLOCATE_WORLD_SIZE"]) == (str(rank), "2")
        assert seen["master"] == "127.0.0.1" and seen["iterations"] == 5
        assert "COLOCATE_PARTITION" not in seen  # whole GPUs: guaranteed jobs of the node's policy
    ranks_at = [{ln.split(f"job {job}/")[1].split()[0] for ln in node.log().splitlines()
                 if f"job {job}/" in ln and "registered" in ln} for node in (cluster.node_a, cluster.node_b)]
    assert sorted(ranks_at) == [{"0"}, {"1"}], ranks_at  # one rank at each node, both of one job

    too_big = placement_group([bundle] * 3, strategy="STRICT_SPREAD")
    waiting = [ray.remote(Worker).options(**options(1.0), scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=too_big, placement_group_bundle_index=i)).remote() for i in range(3)]
    ready, _ = ray.wait([too_big.ready()] + [a.run.remote() for a in waiting], timeout=3.0)
    assert not ready
    ids = {f"ray-actor-{a._actor_id.hex()[:24]}" for a in waiting}
    assert not ids & (set(cluster.node_a.jobs()) | set(cluster.node_b.jobs()))
    for actor in waiting:
        ray.kill(actor)
    remove_placement_group(too_big)


def test_fail_closed_without_the_plugin_and_with_a_bad_field(cluster):
    """On the head (no plugin) a task that asked with colocate.ray.options fails and its worker says, in one
    line, what to start; a bad field fails the task's environment set-up with one line naming it."""
    @ray.remote(max_calls=1, max_retries=0)
    def task():
        import torch  # noqa: F401  (the runtime decides here)

        return "ran"

    with pytest.raises(ray.exceptions.RayError):
        ray.get(task.options(**options(0.5, resources={"noplugin": 1})).remote(), timeout=CALL_S)
    lines = wait_for(lambda: cluster.logs_with(NO_PLUGIN), 15, what="the worker's one line")
    assert lines[0].strip() == f"colocate: {NO_PLUGIN}"
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="gpu_mem"):
        ray.get(task.options(num_gpus=0.5, resources={"node_a": 1},
                             runtime_env={"colocate": {"gpu_mem": "lots"}}).remote(), timeout=CALL_S)


def test_a_task_cannot_raise_its_ray_grant(cluster):
    """The issue's case, with a plain runtime_env as a user would write it: num_gpus=0.25 asking colocate for
    share 1.0 used to run with the whole GPU's share (and crowd out what Ray placed beside it). Its worker now
    exits with one line naming the grant, before it registers with the node."""
    @ray.remote(max_calls=1, max_retries=0)
    def task():
        import torch  # noqa: F401  (the runtime decides here)

        return "ran"

    raised = task.options(num_gpus=0.25, resources={"node_a": 1},
                          runtime_env={"colocate": {"sm_share": 1.0, "gpu_mem": "512MiB"}})
    with pytest.raises(ray.exceptions.RayError):
        ray.get(raised.remote(), timeout=CALL_S)
    want = "colocate: sm_share 1 is above this task's Ray grant 0.25 (num_gpus); a task may only lower its grant"
    lines = wait_for(lambda: cluster.logs_with("is above this task's Ray grant"), 15, what="the worker's one line")
    assert [line.strip() for line in lines] == [want]


def test_fail_closed_without_a_node_coordinator(cluster):
    """Node B's coordinator stopped: a colocate task there exits with one line naming `colocate node`, instead
    of running without its limits."""
    @ray.remote(max_calls=1, max_retries=0)
    def task():
        import torch  # noqa: F401

        return "ran"

    cluster.node_b.stop()
    try:
        with pytest.raises(ray.exceptions.RayError):
            ray.get(task.options(**options(1.0, resources={"node_b": 1})).remote(), timeout=CALL_S)
        lines = wait_for(lambda: [ln for ln in cluster.logs_with("colocate: ") if "colocate node" in ln], 15,
                         what="the worker's one line")
        assert len(lines[0].splitlines()) == 1
    finally:
        cluster.node_b.start()
