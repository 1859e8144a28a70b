"""A real Slurm cluster for the Slurm tests (``colocate.slurm.loopback``: one slurmctld and two slurmd on
127.0.0.1, fake GPUs, colocate's SPANK plugin), plus one ``colocate node`` (one simulated GPU) beside n1 and
n2; a third slurmd, n3, has none (a node whose coordinator is down). One cluster per module; skipped with one line only where Slurm's packages or root are missing
(``.ci/run`` installs the packages when it runs as root).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import support as S


class Cluster:
    """The loopback cluster, its colocate nodes (Slurm node name -> ``NodeProc``) and ``srun`` helpers."""

    def __init__(self, loop, procs: S.Procs):
        self.loop, self.procs, self.tmp = loop, procs, loop.folder
        self.nodes: dict = {}

    def env(self, extra: dict | None = None) -> dict:
        return S.child_env({"SLURM_CONF": str(self.loop.conf), **(extra or {})})

    def srun(self, *args, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
        """``srun ARGS...`` to completion, output captured."""
        return subprocess.run(["srun", *map(str, args)], cwd=self.tmp, env=self.env(env), capture_output=True,
                              text=True, timeout=timeout)

    def srun_bg(self, log_name: str, *args, env: dict | None = None):
        """``srun ARGS...`` in the background; its output goes to ``log_name``."""
        return self.procs.start(["srun", *args], log_name, env_extra={"SLURM_CONF": str(self.loop.conf), **(env or {})})


@pytest.fixture(scope="module")
def slurm_cluster():
    from colocate.slurm import loopback

    reason = loopback.missing()
    if reason:
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="sl-"))  # short: ipc socket paths are limited to ~100 bytes
    procs = S.Procs(tmp)
    loop = loopback.LoopbackCluster(tmp, nodes=("n1", "n2", "n3"))
    cluster = Cluster(loop, procs)
    try:
        loop.start()
        for name in ("n1", "n2"):
            cluster.nodes[name] = S.NodeProc(procs, tmp / name, "--sim-gpus", 1, "--sim-gpu-mem", loop.sim_gpu_mem,
                                             record=False).start()
        yield cluster
    finally:
        for node in cluster.nodes.values():  # each by its pid
            node.stop()
        procs.cleanup()
        loop.stop()
        shutil.rmtree(tmp, ignore_errors=True)
