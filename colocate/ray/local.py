"""A Ray cluster with colocate on this machine, on 127.0.0.1 only, with simulated GPUs: to try colocate inside
Ray without GPUs (``examples/ray_train.py --local``) and to measure it (``benchmarks/ray_colocation.py``).

One ``colocate node`` owns the machine's simulated GPUs (as on a real machine: one coordinator per machine);
``ray_nodes`` Ray nodes (``ray.cluster_utils.Cluster``, a head without GPUs plus one node per entry) each get
one of those GPUs (Ray's GPU id is the simulated GPU's index, so each Ray node's GPU is its own CPU core) and
the environment ``colocate ray start`` gives ``ray start`` (``node_environment``). Ray node ``i`` also has the
custom resource ``node<i>`` so work can be pinned to it. ``close()`` stops Ray and the node by process id.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from colocate.base.vocab import DeviceKind
from colocate.ray.fields import OPPORTUNISTIC_RESOURCE
from colocate.ray.node import node_environment

START_S = 30.0


class LocalCluster:
    def __init__(self, ray_nodes: int = 2, sim_gpu_mem: int = 4 << 30, policy: str | None = None,
                 cpus_per_node: int = 4, log_to_driver: bool = False):
        self.ray_nodes, self.sim_gpu_mem, self.policy, self.cpus = ray_nodes, sim_gpu_mem, policy, cpus_per_node
        self.log_to_driver = log_to_driver
        self.dir = tempfile.mkdtemp(prefix="colocate-ray-")  # the node's socket and log; removed by close()
        self._keep_dir = False  # a failed start keeps it: its error names the node's log there
        self.endpoint = f"ipc://{self.dir}/node.sock"
        self.node: subprocess.Popen | None = None
        self.cluster: Any = None  # ray.cluster_utils.Cluster once started

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self._keep_dir = True
            self.close()  # what did start is stopped when the set-up fails
            raise

    def _start(self) -> None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback stays loopback (read at import...)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray
        import ray._private.ray_constants as ray_constants
        from ray.cluster_utils import Cluster

        ray_constants.ENABLE_RAY_CLUSTER = False  # (...and here, should ray have been imported before)
        argv = [sys.executable, "-m", "colocate", "node", "--device", DeviceKind.SIM, "--endpoint", self.endpoint,
                "--sim-gpus", str(self.ray_nodes), "--sim-gpu-mem", str(self.sim_gpu_mem), "--log-level", "warning"]
        if self.policy:
            argv += ["--policy", self.policy]
        with open(os.path.join(self.dir, "node.log"), "ab") as log:
            self.node = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_node()
        loopback = {"node_ip_address": "127.0.0.1"}
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            loopback, num_cpus=2, num_gpus=0, include_dashboard=False, dashboard_agent_listen_port=_free_port(),
            _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False}))
        for i in range(self.ray_nodes):
            env = node_environment(self.endpoint, DeviceKind.SIM, self.sim_gpu_mem, base={})
            env["CUDA_VISIBLE_DEVICES"] = str(i)  # Ray's GPU id on this node: simulated GPU i
            self.cluster.add_node(**loopback, num_cpus=self.cpus, num_gpus=1, env_vars=env,
                                  resources={f"node{i}": 100, OPPORTUNISTIC_RESOURCE: 1})
        ray.init(address=self.cluster.address, log_to_driver=self.log_to_driver)

    def _wait_node(self) -> None:
        from colocate.clients.node import NoAnswer, list_jobs, resolve_ctl_endpoint

        ctl = resolve_ctl_endpoint(self.endpoint, None)
        deadline = time.monotonic() + START_S
        while self.node is not None and self.node.poll() is None:
            try:
                list_jobs(ctl, timeout_s=0.5)
                return
            except NoAnswer:
                if time.monotonic() > deadline:
                    break
        raise RuntimeError(f"the colocate node did not start (log: {self.dir}/node.log)")

    def jobs(self) -> dict:
        """The node coordinator's listing: job id -> ``JobInfo``."""
        from colocate.clients.node import list_jobs, resolve_ctl_endpoint

        return {j.job_id: j for j in list_jobs(resolve_ctl_endpoint(self.endpoint, None), timeout_s=2.0).jobs}

    def close(self) -> None:
        import ray

        try:
            ray.shutdown()
        finally:
            if self.cluster is not None:
                self.cluster.shutdown()
            if self.node is not None and self.node.poll() is None:
                self.node.send_signal(signal.SIGTERM)
                try:
                    self.node.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.node.kill()
                    self.node.wait()
            if not self._keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
