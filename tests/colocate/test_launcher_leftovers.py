"""What a launcher leaves behind when something dies (issue 22, items 2, 8, 10 and 12): a lease of another node
incarnation stops its command, a killed launcher takes its command with it and its stats folder is removed by the
next launcher, a killed opportunistic job's session gets its autogroup nice back, and bad options are one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support import PY, TICKER, alive, child_env, colocate_run, wait_for


def _launcher(tmp_path, args, env=None, mode="term"):
    """A ``colocate run ARGS -- ticker`` in a session of its own; (process, ticks file, the command's pid)."""
    ticks = tmp_path / "ticks"
    (tmp_path / "ticker.py").write_text(TICKER)
    proc = subprocess.Popen([sys.executable, "-m", "colocate", "run", "--device", "sim", *args, "--", sys.executable,
                             str(tmp_path / "ticker.py"), mode, str(ticks)], env=child_env(env),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid_file = tmp_path / "ticks.pid"
    wait_for(lambda: ticks.exists() and pid_file.exists() and pid_file.read_text(), 60, what="the command to tick")
    return proc, ticks, int(pid_file.read_text())


def _ticks(path) -> int:
    return len(path.read_text().split())


def _stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


# ---------------------------------------------------------------- item 2: the lease names the node incarnation


def test_a_lease_of_a_node_incarnation_that_does_not_hold_the_worker_stops_it(tmp_path):
    """The node restarted without this worker (its table lost): its lease names only the new incarnation, and the
    launcher of the old one stops its command although the lease's time has not run out."""
    from colocate.base.lease import lease_clock, write_lease

    lease = tmp_path / "lease"
    write_lease(str(lease), lease_clock() + 300.0, 0.5, epoch=5)
    proc, ticks, child = _launcher(tmp_path, ["--lease-file", str(lease)], {"COLOCATE_PLACEMENT": "c/1.1@5"})
    try:
        write_lease(str(lease), lease_clock() + 300.0, 0.5, epoch=6)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert b"incarnation 6" in out and b"does not hold" in out
        wait_for(lambda: not alive(child), 10, what="the command to be gone")
    finally:
        _stop(proc)


def test_a_lease_file_deleted_with_its_folder_keeps_what_it_promised(tmp_path):
    """Item 9: a deleted state folder takes the lease file with it; the launcher runs on to the lease it read (the
    node makes the file again within a heartbeat) instead of failing its job at once."""
    from colocate.base.lease import lease_clock, write_lease

    lease = tmp_path / "state" / "lease"
    lease.parent.mkdir()
    write_lease(str(lease), lease_clock() + 300.0, 0.5, epoch=5)
    proc, ticks, child = _launcher(tmp_path, ["--lease-file", str(lease)], {"COLOCATE_PLACEMENT": "c/1.1@5"})
    try:
        lease.unlink()
        lease.parent.rmdir()
        seen = _ticks(ticks)
        wait_for(lambda: _ticks(ticks) > seen + 20 or proc.poll() is not None, 60, what="ticks after the deletion")
        assert proc.poll() is None and alive(child)
        lease.parent.mkdir()
        write_lease(str(lease), lease_clock() - 1.0, 0.5, epoch=5)  # written again, then lapsed: it stops
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143 and b"lapsed" in out, out
    finally:
        _stop(proc)


# ---------------------------------------------------------------- item 10: a killed launcher


def test_a_killed_standalone_launcher_takes_its_command_and_its_stats_folder_goes(tmp_path):
    """kill -9 of a launcher without a node or a lease: its command dies with it (PR_SET_PDEATHSIG in every mode);
    the stats folder it could not remove is removed by the next launcher of the same user."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc, ticks, child = _launcher(tmp_path, [], {"TMPDIR": str(tmp)}, mode="ignore")
    try:
        (stats,) = list(tmp.glob("colocate-stats-*"))
        proc.kill()  # the launcher only, not its group
        proc.communicate(timeout=30)
        wait_for(lambda: not alive(child), 10, what="the command to die with its launcher")
        assert stats.exists()  # left behind by the killed launcher
        done = colocate_run(["run", "--device", "sim", "--", PY, "-c", "pass"], env={"TMPDIR": str(tmp)}, timeout=120)
        assert done.returncode == 0, done.stderr
        assert not stats.exists() and list(tmp.glob("colocate-stats-*")) == []
    finally:
        _stop(proc)
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_only_the_stats_folders_of_launchers_that_are_gone_are_removed(tmp_path):
    from colocate.launcher import STATS_PREFIX, remove_stale_stats_dirs

    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait(timeout=60)
    huge = "9" * 20  # beyond any pid the kernel gives (and beyond a C long): no launcher's
    folders = {name: tmp_path / f"{STATS_PREFIX}{name}" for name in
               (f"{gone.pid}-a", f"{os.getpid()}-b", "1-c", "x-d", f"{huge}-e")}  # gone, this process, init, not a pid
    for folder in folders.values():
        folder.mkdir()
    assert sorted(remove_stale_stats_dirs(str(tmp_path))) == sorted([str(folders[f"{gone.pid}-a"]),
                                                                     str(folders[f"{huge}-e"])])
    assert [name for name, folder in folders.items() if folder.exists()] == [f"{os.getpid()}-b", "1-c", "x-d"]


# ---------------------------------------------------------------- item 8: the autogroup of a killed job

KILLED_LOW = """\
import os, signal
from torch_hooks.device import autogroup
assert autogroup.lower(True), "could not lower"
print("job:", open("/proc/self/autogroup").read().strip(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_session_of_a_killed_opportunistic_job_gets_its_autogroup_nice_back(tmp_path):
    """The job's runtime lowers its session to nice 19 and restores it only at its own exit; killed, it never does.
    The launcher, in the same session, outlives it and restores it: a shell of that session is not left slow."""
    from colocate.base.autogroup import nice as autogroup_nice

    if autogroup_nice() is None or open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() != "1":
        pytest.skip("no autogroup scheduling on this kernel")
    if os.geteuid() != 0:
        pytest.skip("raising an autogroup's weight again needs CAP_SYS_NICE (root)")
    (tmp_path / "job.py").write_text(KILLED_LOW)
    shell = (f'"{PY}" -m colocate run --device sim --priority opportunistic -- "{PY}" {tmp_path / "job.py"}; '
             'echo "launcher: $?"; echo "shell: $(cat /proc/self/autogroup)"')
    done = subprocess.run(["sh", "-c", shell], env=child_env(), start_new_session=True, capture_output=True,
                          text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert any(line.startswith("job:") and line.endswith("nice 19") for line in lines), done.stdout + done.stderr
    assert "launcher: 137" in lines, done.stdout + done.stderr
    assert lines[-1].startswith("shell:") and lines[-1].endswith("nice 0"), done.stdout + done.stderr


# ---------------------------------------------------------------- item 12: silent acceptance


def _one_line_refusal(done, words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and words in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_simulated_gpu_of_no_memory_is_refused():
    _one_line_refusal(colocate_run(["run", "--device", "sim", "--sim-gpu-mem", "0", "--", PY, "-c", "pass"]),
                      "--sim-gpu-mem: must be more than 0 bytes")


def test_a_sim_core_this_machine_does_not_have_is_refused():
    cores = os.cpu_count() or 1
    done = colocate_run(["run", "--device", "sim", "--", PY, "-c", "pass"], env={"COLOCATE_SIM_CORE": str(cores + 97)})
    _one_line_refusal(done, f"COLOCATE_SIM_CORE='{cores + 97}': this machine has {cores} CPU core(s)")


def test_an_exit_file_that_is_not_a_regular_file_is_refused_before_the_job_runs(tmp_path):
    """``--exit-file /dev/full`` (the issue's case) is a device: refused in one line before the command runs. A FIFO
    stands in for it here: the code before the fix replaced the path with a regular file (as root, /dev/full
    itself), which a test must never risk on a shared machine."""
    fifo = tmp_path / "full"
    os.mkfifo(fifo)
    marker = tmp_path / "ran"
    done = colocate_run(["run", "--device", "sim", "--exit-file", str(fifo), "--", PY, "-c",
                         f"open({str(marker)!r}, 'w')"])
    _one_line_refusal(done, f"--exit-file {fifo}: not a regular file")
    assert not marker.exists()
    import stat

    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # never replaced by a file


def test_an_exit_file_in_a_folder_that_is_gone_is_written_there_again(tmp_path):
    """A node's log folder deleted under a running worker is made again for its exit code."""
    code = tmp_path / "gone" / "worker-0.exit"
    done = colocate_run(["run", "--device", "sim", "--exit-file", str(code), "--", PY, "-c", "raise SystemExit(3)"])
    assert done.returncode == 3, done.stderr
    assert code.read_text().strip() == "3"


def test_a_submit_with_an_empty_command_is_refused_by_the_decoder():
    import msgpack

    from colocate import protocol as P

    good = msgpack.unpackb(P.encode(P.Submit(request=P.JobRequest(command=("true",), cwd="/", env={}))))
    assert P.decode(msgpack.packb(good)).request.command == ("true",)
    good["request"]["command"] = []
    with pytest.raises(P.ProtocolError) as err:
        P.decode(msgpack.packb(good))
    assert err.value.code == P.INVALID and "command" in str(err.value)
    with pytest.raises(P.ProtocolError):
        P.JobRequest(command=(), cwd="/", env={})
