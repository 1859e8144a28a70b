"""colocate inside a real Slurm cluster (slurmctld + two slurmd on loopback, fake GPUs, the SPANK plugin)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(240)


def colocate_vars(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("COLOCATE_"))


def test_a_job_that_does_not_ask_for_colocate_runs_untouched(slurm_cluster):
    proc = slurm_cluster.srun("-w", "n1", "--gres=gpu:1", "env")
    assert proc.returncode == 0, proc.stderr
    assert colocate_vars(proc.stdout) == {}
    assert "colocate/_inject" not in proc.stdout
    assert "CUDA_VISIBLE_DEVICES=0" in proc.stdout  # it did get its GPU


def test_colocate_option_turns_the_runtime_on_with_the_nodes_endpoint(slurm_cluster):
    proc = slurm_cluster.srun("-w", "n2", "--colocate=opportunistic", "--colocate-sm-share=0.3", "env")
    assert proc.returncode == 0, proc.stderr
    got = colocate_vars(proc.stdout)
    assert got["COLOCATE_ENABLED"] == "1" and got["COLOCATE_ENGINE"] == "slurm", got
    assert got["COLOCATE_NODE"] == slurm_cluster.nodes["n2"].endpoint
    assert got["COLOCATE_NODE_REQUIRED"] == "1" and got["COLOCATE_SLURM"] == "opportunistic"
    assert got["COLOCATE_SM_SHARE"] == "0.3" and got["COLOCATE_SLURM_SHARDS"] == "4"


def test_shards_turn_colocate_on_without_asking(slurm_cluster):
    proc = slurm_cluster.srun("-w", "n1", "--gres=shard:1", "env")
    assert proc.returncode == 0, proc.stderr
    assert colocate_vars(proc.stdout)["COLOCATE_SLURM"] == "auto"


@pytest.mark.parametrize("option", ["--colocate=bogus", "--colocate-gpu-mem=2XB", "--colocate-sm-share=1.5"])
def test_a_bad_option_fails_in_one_line(slurm_cluster, option):
    proc = slurm_cluster.srun("-w", "n1", option, "true")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and option.split("=")[0] in lines[0], proc.stderr


def slurm_config(cluster, *args):
    from tests import support as S

    return S.colocate_cli("slurm", "config", "--gres-conf", cluster.tmp / "gres.conf", "--device", "sim",
                          "--sim-gpu-mem", cluster.loop.sim_gpu_mem, *args)


def test_slurm_config_prints_the_sites_lines_and_checks_the_node(slurm_cluster):
    node = f"ipc://{slurm_cluster.tmp}/%n/node.sock"
    proc = slurm_config(slurm_cluster, "--node", node, "--node-name", "n1", "--plugin", slurm_cluster.tmp / "spank_colocate.so")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (slurm_cluster.tmp / "plugstack.conf").read_text().strip() in proc.stdout.splitlines()
    assert "ok   " in proc.stdout and "4 shards per GPU on 1 GPU(s)" in proc.stdout
    assert "node coordinator at " + slurm_cluster.nodes["n1"].endpoint + ": answers" in proc.stdout
    wrong = slurm_config(slurm_cluster, "--node", node, "--node-name", "n1", "--shards", "8")
    assert wrong.returncode == 1 and "FAIL" in wrong.stdout and "does NOT match" in wrong.stdout
    gone = slurm_config(slurm_cluster, "--node", f"ipc://{slurm_cluster.tmp}/nowhere.sock", "--node-name", "n2")
    assert gone.returncode == 1 and "FAIL no node coordinator answers" in gone.stdout
