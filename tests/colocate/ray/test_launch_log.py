"""`colocate ray start` waits for this start's "Ray runtime started", not an earlier one's: its ray.log is
appended to, so a second start in the same state folder used to return at once, before Ray was up (the README's
next line, ``ray.init(address='auto')``, then found no Ray). No Ray needed: a stand-in process plays ``ray start``."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from colocate.ray import launch


class StandIn(launch.NodeSetup):
    """A real sim `colocate node`, and in place of `ray start` a process that fails without a word of Ray's."""

    def ray_command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('ray start: bad option'); sys.exit(3)"]


def test_a_second_start_waits_for_its_own_ray_not_the_last_start_s_line(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "ray.log").write_text(f"{launch.RAY_STARTED}.\n...\nreceived SIGTERM. Draining\n")  # the last start's
    setup = StandIn(device="sim", sim_gpus=1, sim_gpu_mem=1 << 30, endpoint=f"ipc://{tmp_path}/node.sock",
                    policy=None, slots=1, state_dir=str(state), ray_args=())
    try:
        with pytest.raises(launch.StartFailed, match=r"`ray start` exited \(3\): ray start: bad option"):
            launch.start(setup, out=io.StringIO())
    finally:
        launch.stop(str(state))  # what a start that wrongly succeeded left running (nothing when it failed)
    assert not (state / launch.STATE_FILE).exists()


def test_this_start_s_line_counts(tmp_path):
    log = tmp_path / "ray.log"
    log.write_text("an earlier start's last words\n")
    since = log.stat().st_size
    # the stand-in says it started, then stays up until its stdin closes (the handshake ends it, no sleep)
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-c", f"print({launch.RAY_STARTED!r}, flush=True); import sys; "
                                 "sys.stdin.read()"], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
    try:
        launch._wait_ray(proc, log, since)  # returns once the line is there (bounded by RAY_START_S)
        assert proc.poll() is None  # it returned because of the line, not because the process ended
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_start_without_ray_installed_names_the_extra_and_starts_nothing(tmp_path, monkeypatch):
    real = launch.importlib.util.find_spec
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    setup = launch.NodeSetup(device="sim", sim_gpus=1, sim_gpu_mem=1 << 30, endpoint=f"ipc://{tmp_path}/node.sock",
                             policy=None, slots=1, state_dir=str(tmp_path / "state"), ray_args=())
    with pytest.raises(launch.StartFailed, match=r"Ray is not installed .*ray extra"):
        launch.start(setup, out=io.StringIO())
    assert not (tmp_path / "state" / "node.log").exists()  # no node was started for a Ray that cannot start


INTERRUPTED = """
import sys
from colocate.ray import launch

class StandIn(launch.NodeSetup):
    def ray_command(self):
        return [sys.executable, "-c", "print('standing in', flush=True); import time; time.sleep(300)", tmp]

tmp = sys.argv[1]
setup = StandIn(device="sim", sim_gpus=1, sim_gpu_mem=1 << 30, endpoint=f"ipc://{tmp}/node.sock", policy=None,
                slots=1, state_dir=f"{tmp}/state", ray_args=())
try:
    launch.start(setup)
except launch.Interrupted as exc:
    print("interrupted", exc.signum, flush=True)
    sys.exit(128 + exc.signum)
"""


def test_a_start_stopped_by_sigterm_stops_what_it_had_started(tmp_path):
    """``timeout`` or a service stop sends SIGTERM while Ray is still starting: the node and the Ray start it had
    launched are stopped, not left running with no record for ``colocate ray stop``."""
    import psutil

    from tests.support import child_env, wait_for

    script = tmp_path / "start.py"
    script.write_text(INTERRUPTED)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        log = tmp_path / "state" / "ray.log"
        wait_for(lambda: log.exists() and "standing in" in log.read_text() or proc.poll() is not None, 120,
                 what="the stand-in Ray start to run")
        assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(launch.signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + 15 and "interrupted 15" in out, out

        wait_for(lambda: not ours(tmp_path), 30, what="the processes of the interrupted start to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in ours(tmp_path):  # what a failed test left: stopped by its pid
            psutil.Process(pid).kill()


def ours(tmp_path) -> list[int]:
    """The processes whose command line names ``tmp_path`` (the node, the stand-in Ray start)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(tmp_path) in a for a in p.info["cmdline"] or ()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found
