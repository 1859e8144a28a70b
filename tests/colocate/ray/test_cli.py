"""``colocate ray start`` / ``colocate ray stop`` as a user runs them: a Ray head with simulated GPUs on
127.0.0.1, then both processes stopped by process id."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from colocate.ray.fields import OPPORTUNISTIC_RESOURCE, PLUGIN_CLASS
from tests.support import PY, REPO, child_env, free_port, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install '.[ray]' in the checkout)")
psutil = pytest.importorskip("psutil")


def colocate_ray(*args, timeout: float = 180) -> subprocess.CompletedProcess:
    env = child_env({"RAY_USAGE_STATS_ENABLED": "0"})
    return subprocess.run([PY, "-m", "colocate", "ray", *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(300)
def test_start_runs_a_node_and_ray_with_the_plugin_and_stop_stops_both():
    state = Path(tempfile.mkdtemp(prefix="crs-"))  # short: the node's ipc socket lives here
    started: list[int] = []
    try:
        res = colocate_ray("start", "--device", "sim", "--sim-gpus", 1, "--sim-gpu-mem", "1GiB",
                           "--state-dir", state, "--endpoint", f"ipc://{state}/node.sock", "--head",
                           "--node-ip-address", "127.0.0.1", "--port", free_port(),
                           "--dashboard-agent-listen-port", free_port(),
                           "--include-dashboard=false", "--disable-usage-stats", "--num-cpus", 1)
        assert res.returncode == 0, res.stderr[-3000:] + (state / "ray.log").read_text(errors="replace")[-3000:]
        recorded = json.loads((state / "ray.json").read_text())
        ray_start = psutil.Process(recorded["ray_pid"])
        raylet = [p for p in ray_start.children(recursive=True) if p.name() == "raylet"]
        started = [recorded["node_pid"], recorded["ray_pid"], *(p.pid for p in ray_start.children(recursive=True))]
        assert len(raylet) == 1
        environ = raylet[0].environ()  # what the raylet, its runtime_env agent and its workers inherit
        assert {"class": PLUGIN_CLASS} in json.loads(environ["RAY_RUNTIME_ENV_PLUGINS"])
        assert environ["COLOCATE_NODE"] == recorded["endpoint"] and environ["COLOCATE_DEVICE"] == "sim"
        assert f'"{OPPORTUNISTIC_RESOURCE}": 1' in " ".join(ray_start.cmdline())
        for conn in psutil.net_connections(kind="inet"):  # every listener of this Ray is on loopback
            if conn.pid in started and conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), conn

        again = colocate_ray("start", "--device", "sim", "--state-dir", state, "--head")
        assert again.returncode == 1 and "already running" in again.stderr and len(again.stderr.splitlines()) == 1

        res = colocate_ray("stop", "--state-dir", state)
        assert res.returncode == 0 and "stopped Ray" in res.stdout and "node coordinator" in res.stdout
        wait_for(lambda: all(gone(pid) for pid in started), 30, what="every process it started to end")
        res = colocate_ray("stop", "--state-dir", state)
        assert res.returncode == 0 and "nothing to stop" in res.stdout
    finally:
        for pid in started:
            if not gone(pid):
                psutil.Process(pid).kill()
        shutil.rmtree(state, ignore_errors=True)


def test_bad_options_are_one_line_and_start_nothing(tmp_path):
    res = colocate_ray("start", "--device", "sim", "--state-dir", tmp_path, "--resources", "[1]", timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--resources" in res.stderr
    assert not (tmp_path / "ray.json").exists() and not (tmp_path / "node.log").exists()
