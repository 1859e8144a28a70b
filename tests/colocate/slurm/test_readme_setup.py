"""The README's Slurm site set-up, run line by line as printed, on a loopback Slurm cluster whose
plugstack.conf starts empty; then a user's ``srun --gres=shard:2`` step runs held to half the GPU.

Only what a test machine must change is substituted, each checked to be in the README first: the install
folder and plugstack.conf (under this test's folder, not the machine's), the node's endpoint (this test's
folder), and ``--device cuda`` (no GPU here: one simulated GPU of 1 GiB, for the node and the plugin alike).
A line ending in ``&`` is started in the background (the node coordinator) and waited for until it answers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import support as S

pytestmark = pytest.mark.timeout(300)
MARKER = "<!-- slurm set-up: tests/colocate/slurm/test_readme_setup.py"


def setup_lines() -> list[str]:
    """The commands of the README's Slurm set-up block (the first ```bash block after ``MARKER``)."""
    text = (S.REPO / "README.md").read_text()
    assert MARKER in text, "README.md lost the Slurm set-up block's marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block, "no ```bash block after the marker"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture
def empty_cluster():
    """A loopback cluster of one node named as this host (as ``colocate slurm config`` finds it in gres.conf),
    4 shards on its GPU, no colocate in plugstack.conf yet."""
    from colocate.slurm import loopback

    reason = loopback.missing()
    if reason:
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="sr-"))  # short: ipc socket paths are limited to ~100 bytes
    procs = S.Procs(tmp)
    loop = loopback.LoopbackCluster(tmp, nodes=(socket.gethostname().split(".")[0],), plugin=False)
    try:
        loop.start()
        yield loop, procs
    finally:
        procs.cleanup()  # the node coordinator the README started, by its session
        loop.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_readmes_slurm_set_up_works_as_printed(empty_cluster):
    from colocate.clients import node as client

    loop, procs = empty_cluster
    tmp = loop.folder
    assert (tmp / "plugstack.conf").read_text() == ""
    endpoint = f"ipc://{tmp}/node/node.sock"
    substitutions = {
        "/usr/local/lib/colocate": str(tmp / "lib"),
        "/etc/slurm/plugstack.conf": str(tmp / "plugstack.conf"),
        "ipc:///run/colocate/node.sock": endpoint,
        "--device cuda": f"--device sim --sim-gpu-mem {loop.sim_gpu_mem}",
    }
    lines = setup_lines()
    text = "\n".join(lines)
    for printed in substitutions:
        assert printed in text, f"the README's set-up no longer says {printed!r}: update this test's substitutions"
    env = S.child_env({"SLURM_CONF": str(loop.conf),
                       "PATH": os.path.dirname(S.PY) + os.pathsep + os.environ.get("PATH", ""),
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(S.REPO), os.environ.get("PYTHONPATH")]))})
    for line in lines:
        for printed, here in substitutions.items():
            line = line.replace(printed, here)
        command = line.split(" #", 1)[0].rstrip()
        if command.endswith("&"):  # the node coordinator, beside slurmd: started, then waited for
            node = procs.start(["bash", "-c", "exec " + command[:-1]], "node.log", env_extra=env)

            def answers(node=node):
                assert node.poll() is None, S.read_log(node)[-3000:]
                try:
                    return client.list_jobs(f"{endpoint}.ctl", 0.5)
                except client.CtlClientError:
                    return None

            S.wait_for(answers, 60, what="the README's node coordinator to answer")
            continue
        proc = subprocess.run(["bash", "-c", command], cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"{command}\n-> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    plugstack = (tmp / "plugstack.conf").read_text()
    assert "shards=4" in plugstack and "enforce=all" in plugstack and f"sim_gpu_mem={loop.sim_gpu_mem}" in plugstack

    stats = tmp / "stats"
    code = "import json, torch, torch_hooks; print('@', json.dumps(torch_hooks.limits()), flush=True)"
    step = subprocess.run(["srun", "--gres=shard:2", S.PY, "-c", code], cwd=tmp, capture_output=True, text=True,
                          env={**env, "COLOCATE_STATS_DIR": str(stats)}, timeout=180)
    assert step.returncode == 0, step.stdout + step.stderr
    [limits] = [json.loads(line[2:]) for line in step.stdout.splitlines() if line.startswith("@ ")]
    assert limits["sm_share"] == 0.5 and limits["mem_cap"] == (1 << 30) // 2, limits
    [path] = list(stats.glob("stats-*.json"))  # one file per task: this step has one
    written = json.loads(path.read_text())
    assert written["sm_share"] == 0.5 and written["job_id"].startswith("slurm-"), written
