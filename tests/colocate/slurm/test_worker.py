"""colocate.slurm.worker.resolve: Slurm's grant -> colocate limits (pure; no cluster)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from colocate.slurm import site
from colocate.slurm.worker import resolve

GiB = 1 << 30
TASK = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
        "SLURM_GTIDS": "5", "COLOCATE_SLURM_SHARDS": "4", "COLOCATE_DEVICE": "sim", "COLOCATE_SIM_GPU_MEM": "8GiB"}


def test_shards_become_a_partition_of_share_and_memory():
    out = resolve(TASK | {"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "1"})
    assert out["COLOCATE_PRIORITY"] == "guaranteed" and out["COLOCATE_PARTITION"] == "1"
    assert out["COLOCATE_GPUS"] == "1"
    assert float(out["COLOCATE_SM_SHARE"]) == 0.5 and int(out["COLOCATE_GPU_MEM"]) == 4 * GiB
    assert out["COLOCATE_JOB_ID"] == "slurm-42.3"
    assert (out["COLOCATE_RANK"], out["COLOCATE_LOCAL_RANK"], out["COLOCATE_WORLD_SIZE"]) == ("5", "1", "8")


def test_shards_split_between_the_steps_tasks_on_the_node():
    out = resolve(TASK | {"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "0", "SLURM_GTIDS": "4,5"})
    assert float(out["COLOCATE_SM_SHARE"]) == 0.25 and int(out["COLOCATE_GPU_MEM"]) == 2 * GiB


def test_shards_of_a_cuda_gpu_take_its_memory():
    env = TASK | {"SLURM_SHARDS_ON_NODE": "1", "SLURM_STEP_GPUS": "3", "COLOCATE_DEVICE": "cuda"}
    out = resolve(env, memory_total=lambda gpu: {3: 80 * GiB}[gpu])
    assert int(out["COLOCATE_GPU_MEM"]) == 20 * GiB


SHARDS_2 = {"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "0"}  # 2 of 4 shards of an 8 GiB GPU: 0.5, 4 GiB
WHOLE = {"SLURM_STEP_GPUS": "0"}  # a whole 8 GiB GPU
OPP = {"COLOCATE_SLURM": "opportunistic"}  # no Slurm GPU: no grant


@pytest.mark.parametrize("grant, mem, share, want_mem, want_share", [
    (SHARDS_2, "1GiB", "0.1", 1 * GiB, 0.1),      # lowered
    (SHARDS_2, "4GiB", "0.5", 4 * GiB, 0.5),      # the grant itself
    (SHARDS_2, None, None, 4 * GiB, 0.5),         # nothing asked: the grant
    (SHARDS_2 | {"SLURM_GTIDS": "4,5"}, "2GiB", "0.25", 2 * GiB, 0.25),  # two tasks: a quarter each
    (WHOLE, "8GiB", "1", 8 * GiB, 1.0),           # a whole GPU: all its memory, share 1
    (WHOLE, "3GiB", "0.2", 3 * GiB, 0.2),
    (OPP, "64GiB", "1", 64 * GiB, 1.0),           # requests, not a grant: the node never gives more than them
])
def test_the_users_options_lower_the_grant(grant, mem, share, want_mem, want_share):
    env = TASK | grant | {k: v for k, v in (("COLOCATE_GPU_MEM", mem), ("COLOCATE_SM_SHARE", share)) if v}
    out = resolve(env)
    assert int(out["COLOCATE_GPU_MEM"]) == want_mem and float(out["COLOCATE_SM_SHARE"]) == want_share


@pytest.mark.parametrize("grant, asked, words", [
    (SHARDS_2, {"COLOCATE_SM_SHARE": "0.9"}, "--colocate-sm-share (COLOCATE_SM_SHARE) 0.9 is above this task's Slurm grant 0.5 "
                                             "(--gres=shard:2 of 4)"),
    (SHARDS_2, {"COLOCATE_GPU_MEM": "64GiB"}, "--colocate-gpu-mem (COLOCATE_GPU_MEM) 64.0 GiB is above this task's Slurm grant "
                                              "4.0 GiB (--gres=shard:2 of 4 of the GPU's 8.0 GiB)"),
    (SHARDS_2, {"COLOCATE_GPU_MEM": str(4 * GiB + 1)}, f"--colocate-gpu-mem (COLOCATE_GPU_MEM) {4 * GiB + 1} bytes is above"),
    (SHARDS_2 | {"SLURM_GTIDS": "4,5"}, {"COLOCATE_SM_SHARE": "0.5"}, "grant 0.25 (--gres=shard:2 of 4 between 2 tasks)"),
    (WHOLE, {"COLOCATE_GPU_MEM": "9GiB"}, "--colocate-gpu-mem (COLOCATE_GPU_MEM) 9.0 GiB is above this task's Slurm grant 8.0 GiB "
                                          "(--gres=gpu:1: the whole GPU 0)"),
])
def test_an_option_above_the_grant_is_refused_in_one_line_naming_it(grant, asked, words):
    with pytest.raises(ValueError) as info:
        resolve(TASK | grant | asked)
    assert words in str(info.value) and str(info.value).endswith("a task may only lower its grant")
    assert "\n" not in str(info.value)


def test_whole_gpus_are_guaranteed_and_each_local_task_takes_one():
    out = resolve(TASK | {"SLURM_STEP_GPUS": "2,3"})
    assert out["COLOCATE_PRIORITY"] == "guaranteed" and "COLOCATE_PARTITION" not in out
    assert out["COLOCATE_GPUS"] == "2,3" and out["COLOCATE_GPU"] == "3"  # SLURM_LOCALID=1
    assert "COLOCATE_SM_SHARE" not in out and "COLOCATE_GPU_MEM" not in out


def test_no_slurm_gpu_is_opportunistic_on_a_gpu_the_node_picks():
    for mode in ("auto", "opportunistic"):
        out = resolve(TASK | {"COLOCATE_SLURM": mode})
        assert out["COLOCATE_PRIORITY"] == "opportunistic" and out["COLOCATE_GPUS"] == "node"
    assert resolve(TASK | {"COLOCATE_SLURM": "opportunistic", "COLOCATE_GPU_MEM": "2GiB"})["COLOCATE_GPU_MEM"] == str(2 * GiB)


@pytest.mark.parametrize("extra, words", [
    ({"COLOCATE_SLURM": "bogus"}, "COLOCATE_SLURM"),
    ({"COLOCATE_SLURM": "guaranteed"}, "needs a Slurm GPU"),
    ({"COLOCATE_SLURM": "opportunistic", "SLURM_STEP_GPUS": "0"}, "takes no Slurm GPU"),
    ({"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "0,1"}, "on 2 GPU(s)"),
    ({"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "0", "COLOCATE_SLURM_SHARDS": ""}, "COLOCATE_SLURM_SHARDS"),
    ({"SLURM_SHARDS_ON_NODE": "8", "SLURM_STEP_GPUS": "0"}, "more than the 4 shards"),
    ({"SLURM_SHARDS_ON_NODE": "2", "SLURM_STEP_GPUS": "0", "COLOCATE_GPU_MEM": "lots"}, "--colocate-gpu-mem"),
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID"),
])
def test_a_grant_colocate_cannot_enforce_is_refused_naming_it(extra, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolve(TASK | extra)


def run_prolog(tmp_path, env: dict, **settings) -> dict:
    script = tmp_path / "task_prolog"
    script.write_text(site.task_prolog(site.SiteSettings(**settings)))
    script.chmod(0o755)
    proc = subprocess.run([str(script)], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True,
                          timeout=10)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(line.startswith("export ") for line in lines), lines
    return dict(line[len("export "):].split("=", 1) for line in lines)


def test_the_task_prolog_turns_colocate_on_as_the_plugin_does(tmp_path):
    settings = {"node": "ipc:///run/colocate/%n.sock", "shards": 4, "device": "cuda", "inject": "/i", "root": "/r"}
    assert run_prolog(tmp_path, {"SLURMD_NODENAME": "gpu7"}, **settings) == {}  # not asked: untouched
    got = run_prolog(tmp_path, {"SLURMD_NODENAME": "gpu7", "COLOCATE_SLURM": "opportunistic",
                                "PYTHONPATH": "/mine"}, **settings)
    assert got == {"COLOCATE_ENABLED": "1", "COLOCATE_ENGINE": "slurm", "COLOCATE_NODE": "ipc:///run/colocate/gpu7.sock",
                   "COLOCATE_NODE_REQUIRED": "1", "COLOCATE_DEVICE": "cuda", "COLOCATE_SLURM_SHARDS": "4",
                   "PYTHONPATH": "/i:/r:/mine"}
    shards = run_prolog(tmp_path, {"SLURMD_NODENAME": "gpu7", "SLURM_SHARDS_ON_NODE": "2"}, **settings)
    assert shards["COLOCATE_SLURM"] == "auto" and shards["COLOCATE_ENABLED"] == "1"
    assert run_prolog(tmp_path, {"SLURM_SHARDS_ON_NODE": "2"}, **settings, enforce="none") == {}
    assert run_prolog(tmp_path, {"SLURM_STEP_GPUS": "0"}, **settings) == {}  # a whole GPU: only with enforce=all
    assert run_prolog(tmp_path, {"SLURM_STEP_GPUS": "0"}, **settings, enforce="all")["COLOCATE_SLURM"] == "auto"


def test_gres_conf_shards_per_gpu():
    text = """# site
NodeName=gpu[01-02] Name=gpu File=/dev/nvidia[0-3]
NodeName=gpu[01-02] Name=shard Count=32
NodeName=gpu03 Name=gpu File=/dev/nvidia0
NodeName=gpu03 Name=shard Count=4 File=/dev/nvidia0
"""
    assert site.gres_shards(text, "gpu02") == (32, 4)
    assert site.gres_shards(text, "gpu03") == (4, 1)
    assert site.gres_shards(text, "gpu04") is None
    assert site.expand_hosts("n[1-3,7],gpu0") == ["n1", "n2", "n3", "n7", "gpu0"]


def test_the_plugstack_line_replaces_colocates_own_and_keeps_the_rest():
    line = "required /opt/c/spank_colocate.so inject=/i node=ipc:///n"
    text = "optional /usr/lib/other.so x=1\nrequired /usr/local/lib/colocate/spank_colocate.so inject=/old\n# end\n"
    once = site.with_plugstack_line(text, line)
    assert once == f"optional /usr/lib/other.so x=1\n{line}\n# end\n"
    assert site.with_plugstack_line(once, line) == once  # idempotent
    assert site.with_plugstack_line("", line) == line + "\n"


def test_build_plugin_without_gcc_is_one_line(tmp_path):
    from tests import support as S

    proc = subprocess.run([S.PY, "-m", "colocate", "slurm", "build-plugin", str(tmp_path / "p.so")], cwd=S.REPO,
                          env=S.child_env({"PATH": str(tmp_path)}), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "colocate slurm build-plugin: error: gcc not found: install gcc (and libslurm-dev)"]
    source = subprocess.run([S.PY, "-m", "colocate", "slurm", "build-plugin", "--print-source"], cwd=S.REPO,
                            env=S.child_env(), capture_output=True, text=True, timeout=60)
    assert source.returncode == 0 and Path(source.stdout.strip()) == site.SOURCE and site.SOURCE.is_file()


def test_slurm_config_with_a_task_prolog_prints_the_taskprolog_set_up_not_the_plugins(tmp_path):
    """A site that writes the TaskProlog builds no plugin: the printed steps are the TaskProlog's."""
    from tests import support as S

    prolog = tmp_path / "prolog.sh"
    args = ("slurm", "config", "--gres-conf", tmp_path / "none.conf", "--node", "ipc:///nowhere/node.sock")
    proc = S.colocate_cli(*args, "--task-prolog", prolog)
    assert prolog.exists() and proc.returncode == 1, proc.stderr  # 1: this machine's checks fail
    assert f"# 1. slurm.conf (the same file at this path on every node): TaskProlog={prolog}" in proc.stdout
    assert "SPANK plugin (needs gcc" not in proc.stdout and "plugstack.conf" not in proc.stdout, proc.stdout
    plugin = S.colocate_cli(*args)
    assert "# 1. build the SPANK plugin" in plugin.stdout and "# 4. beside slurmd" in plugin.stdout, plugin.stdout
