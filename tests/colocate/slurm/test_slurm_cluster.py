"""colocate inside a real Slurm cluster (slurmctld + two slurmd on loopback, fake GPUs, the SPANK plugin)."""
from __future__ import annotations

import subprocess

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


@pytest.mark.parametrize("option", ["--colocate=bogus", "--colocate-gpu-mem=2XB", "--colocate-gpu-mem=0",
                                    "--colocate-sm-share=1.5"])
def test_a_bad_option_fails_in_one_line(slurm_cluster, option):
    proc = slurm_cluster.srun("-w", "n1", option, "true")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and option.split("=")[0] in lines[0], proc.stderr


def slurm_config(cluster, *args):
    from tests import support as S

    return S.colocate_cli("slurm", "config", "--gres-conf", cluster.tmp / "gres.conf", "--device", "sim",
                          "--sim-gpu-mem", cluster.loop.sim_gpu_mem, "--opp-gres", "colocate_opp", *args)


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


def test_slurm_config_fails_when_the_plugins_gpu_memory_is_not_the_nodes(slurm_cluster):
    """The plugin's sim_gpu_mem= sizes a shard task's cap, the node's --sim-gpu-mem its admission: the check
    names both when they differ (as it does a device kind the node does not have)."""
    from tests import support as S

    node = ["--node", f"ipc://{slurm_cluster.tmp}/%n/node.sock", "--node-name", "n1"]
    base = ["slurm", "config", "--gres-conf", slurm_cluster.tmp / "gres.conf", *node]
    wrong = S.colocate_cli(*base, "--device", "sim", "--sim-gpu-mem", "2GiB")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert ("FAIL the plugin's sim_gpu_mem=2GiB but the node coordinator's simulated GPUs have 1.0 GiB: give "
            "--sim-gpu-mem the same size to both") in wrong.stdout.splitlines()
    cuda = S.colocate_cli(*base, "--device", "cuda")
    assert cuda.returncode == 1 and "FAIL the plugin's device=cuda but the node coordinator's GPUs are sim" in cuda.stdout


def shard_steps(cluster, count: int) -> list[tuple[dict, object]]:
    """``count`` steps of ``srun --gres=shard:2`` (of 4) on n1 at once, each a CNN that tries to hold 600 MiB
    of the 1 GiB GPU and runs device-bound; returns each step's (stats, the node's view of it)."""
    import json

    from tests import support as S

    node = cluster.nodes["n1"]
    steps = []
    for i in range(count):
        stats = cluster.tmp / f"stats-{count}-{i}"
        stats.mkdir()
        proc = cluster.srun_bg(f"shard-{count}-{i}.log", "-w", "n1", "--gres=shard:2", S.PY,
                               *S.cnn("--duration", 4, "--host-ms", 0, "--mem-burst-at", 3, "--mem-burst-mib", 600),
                               env={"COLOCATE_STATS_DIR": str(stats)})
        steps.append((proc, stats))
    def running():
        for proc, _ in steps:
            assert proc.poll() is None, f"a step ended before all ran under the node:\n{S.read_log(proc)[-3000:]}"
        jobs = node.jobs()
        return jobs if len(jobs) == count and all(j.iterations for j in jobs.values()) else None

    seen = S.wait_for(running, S.JOB_START_S, what=f"{count} shard steps to run under the node")
    out = []
    for proc, stats in steps:
        assert S.finish(proc) == 0, S.read_log(proc)[-3000:]
        [path] = list(stats.glob("stats-*.json"))
        out.append(json.loads(path.read_text()))
    return [(s, seen[s["job_id"] + "/0"]) for s in out]


def assert_held(stats: dict, info) -> None:
    half = (1 << 30) // 2
    assert info.priority == "guaranteed" and info.sm_share == 0.5 and info.mem_cap == half, info
    assert stats["busy_fraction"] <= 0.53, stats
    assert stats["mem_reserved_peak_bytes"] <= half and stats["host_bytes_peak"] > 0, stats


def test_two_shards_of_four_hold_the_step_to_half_the_gpu(slurm_cluster, sim_ext):
    [(stats, info)] = shard_steps(slurm_cluster, 1)
    assert stats["job_id"].startswith("slurm-")
    assert_held(stats, info)


def test_two_shard_steps_at_once_are_both_held(slurm_cluster, sim_ext):
    steps = shard_steps(slurm_cluster, 2)
    assert len({s["job_id"] for s, _ in steps}) == 2
    for stats, info in steps:
        assert_held(stats, info)


def test_a_task_whose_node_coordinator_is_down_fails_closed_in_one_line(slurm_cluster):
    from tests import support as S

    proc = slurm_cluster.srun("-w", "n3", "--colocate=opportunistic", S.PY, "-c", "import torch; print('ran')",
                              env={"COLOCATE_NODE_WAIT_S": "1"})  # the wait a user may shorten; 5 s by default
    assert proc.returncode != 0 and "ran" not in proc.stdout
    ours = [line for line in proc.stderr.strip().splitlines() if not line.startswith("srun: ")]
    assert len(ours) == 1 and ours[0].startswith("colocate: ") and "colocate node" in ours[0], proc.stderr


def test_the_opportunistic_gres_makes_a_job_opportunistic(slurm_cluster):
    proc = slurm_cluster.srun("-w", "n2", "--gres=colocate_opp:1", "env")
    assert proc.returncode == 0, proc.stderr
    got = colocate_vars(proc.stdout)
    assert got["COLOCATE_ENABLED"] == "1" and got["COLOCATE_SLURM"] == "opportunistic", got


def test_the_tasks_of_a_multi_node_step_are_one_colocate_job_ranked_by_slurm(slurm_cluster):
    from tests import support as S

    code = ("import os, torch; e = os.environ; print('@', e['COLOCATE_JOB_ID'], e['COLOCATE_RANK'], "
            "e['COLOCATE_WORLD_SIZE'], e['COLOCATE_NODE'], e['COLOCATE_PRIORITY'], flush=True)")
    proc = slurm_cluster.srun("-N", 2, "-n", 2, "-w", "n1,n2", "--colocate", S.PY, "-c", code)
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("@ "))
    assert len(rows) == 2 and rows[0][0] == rows[1][0] and rows[0][0].startswith("slurm-"), rows
    assert [r[1:3] for r in rows] == [["0", "2"], ["1", "2"]]
    assert {r[3] for r in rows} == {slurm_cluster.nodes["n1"].endpoint, slurm_cluster.nodes["n2"].endpoint}
    assert {r[4] for r in rows} == {"opportunistic"}


def test_enforce_all_puts_every_gpu_task_under_colocate(slurm_cluster):
    plugstack = slurm_cluster.tmp / "plugstack.conf"
    site_line = plugstack.read_text()
    plugstack.write_text(site_line.strip() + " enforce=all\n")  # srun and slurmstepd read it for every step
    try:
        proc = slurm_cluster.srun("-w", "n2", "--gres=gpu:1", "env")
    finally:
        plugstack.write_text(site_line)
    assert proc.returncode == 0, proc.stderr
    got = colocate_vars(proc.stdout)
    assert got["COLOCATE_ENABLED"] == "1" and got["COLOCATE_SLURM"] == "auto", got


def test_a_share_above_the_shards_is_refused_in_one_line(slurm_cluster):
    """A task's own option may lower what Slurm granted, never raise it: 2 of 4 shards asking for share 0.9
    stops before its code runs, with one line naming the grant."""
    from tests import support as S

    proc = slurm_cluster.srun("-w", "n1", "--gres=shard:2", "--colocate-sm-share=0.9", S.PY, "-c",
                              "import torch; print('ran')")
    assert proc.returncode != 0 and "ran" not in proc.stdout, proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.strip().splitlines() if not line.startswith("srun: ")]
    assert ours == ["colocate: --colocate-sm-share (COLOCATE_SM_SHARE) 0.9 is above this task's Slurm grant 0.5 (--gres=shard:2 of 4); "
                    "a task may only lower its grant"], proc.stderr


@pytest.mark.parametrize("option, mode", [("--colocate", "auto"), ("--colocate=opportunistic", "opportunistic")])
def test_an_allocations_colocate_option_reaches_its_steps(slurm_cluster, option, mode):
    """``salloc --colocate`` (or sbatch) exports the option for the job's steps; bare, its argument arrives as the
    text "(null)", which every srun inside refused."""
    proc = subprocess.run(["salloc", "-w", "n2", option, "srun", "env"], cwd=slurm_cluster.tmp,
                          env=slurm_cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert colocate_vars(proc.stdout)["COLOCATE_SLURM"] == mode, proc.stdout
