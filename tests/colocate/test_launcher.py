"""`colocate run` end to end: real launcher, real job subprocesses (sim device)."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from colocate import launcher as L  # colocate never imports torch: cheap in-process
from colocate.base.env import JobEnv
from colocate.base.stats import NUMERIC as SUMMARY_KEYS
from colocate.gpus import nvml as N
from tests.support import TICKER, half_share_run, wait_for

MiB = 1 << 20

TRAIN = """\
import os, sys, torch, torch_hooks
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("threads", torch.get_num_threads())
print("GPU_MEM", os.environ.get("COLOCATE_GPU_MEM"))
print("installed", torch_hooks.stats()["iterations"])
print("done")
"""

# Working set (weights, grads, Adam state, activations) well above 3 MiB; the weights
# are 2 MiB each, i.e. "large" requests that need 20 MiB segments.
BIG = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.Adam(model.parameters())
for i in range(4):
    loss = model(torch.randn(64, 512)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""

# Host-phase-free loop of ~3 s whose iterations are >= 5 ms of device work each.
BUSY = """\
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(256, 512)
end = time.monotonic() + 3.0
n = 0
while time.monotonic() < end:
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    n += 1
print("iterations", n)
"""


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def run_job(colocate, tmp_path, options, command, env=None):
    stats = tmp_path / "stats.json"
    proc = colocate(["run", "--device", "sim", "--stats-file", stats, *options, "--", *command], cwd=tmp_path, env=env)
    data = json.loads(stats.read_text()) if stats.exists() else None
    return proc, data


def nonempty_lines(text):
    return [l for l in text.splitlines() if l.strip()]


@pytest.mark.slow
def test_stats_file_and_environment(colocate, tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    proc, s = run_job(colocate, tmp_path, ["--gpu-mem", "256MiB", "--job-id", "t-1", "--priority", "opportunistic"],
                      [sys.executable, script, "6"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert "done" in out
    assert "threads 1" in out  # a sim job runs with one intra-op thread
    assert f"GPU_MEM {256 * MiB}" in out
    assert "installed 6" in out  # the runtime was injected without touching the script
    assert s is not None
    for key in SUMMARY_KEYS:
        assert isinstance(s[key], (int, float)), key
    assert s["iterations"] == 6
    assert s["exit_code"] == 0
    assert s["job_id"] == "t-1" and s["priority"] == "opportunistic" and s["device"] == "sim"
    assert s["mem_cap_bytes"] == 256 * MiB
    assert 0 < s["mem_allocated_peak_bytes"] <= s["mem_reserved_peak_bytes"] <= s["mem_cap_bytes"]
    assert s["host_bytes_peak"] == 0
    assert s["wall_s"] > 0 and s["device_busy_s"] > 0
    assert s["busy_fraction"] == pytest.approx(s["device_busy_s"] / s["wall_s"])
    assert len(s["processes"]) == 1


def test_a_job_killed_by_a_signal_leaves_its_last_snapshot_and_its_exit_code(colocate, tmp_path):
    """A process killed outright (SIGKILL: no exit handler runs) leaves the statistics of its last snapshot, and
    the file's exit code is the command's 128+N (it had iterations 0, a note that torch was never imported, -9)."""
    script = write(tmp_path / "killed.py", """\
        import os, signal, sys, time
        import torch_hooks
        torch_hooks.SNAPSHOT_S = 0.1  # read by the snapshot thread at each wait (5 s by default)
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(12):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        stats = os.path.join(os.environ["COLOCATE_STATS_DIR"], f"stats-{os.getpid()}.json")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a bound, not a speed: the snapshot of all 12 iterations is there
            try:
                if '"iterations": 12' in open(stats).read():
                    break
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc, s = run_job(colocate, tmp_path, [], [sys.executable, str(script)])
    assert proc.returncode == 137, proc.stderr
    assert s is not None and s["iterations"] == 12 and s["exit_code"] == 137, s
    assert "note" not in s or "never imported torch" not in s["note"], s


def test_job_without_torch_gets_zero_stats(colocate, tmp_path):
    proc, s = run_job(colocate, tmp_path, [], [sys.executable, "-c", "print('hi')"])
    assert proc.returncode == 0 and proc.stdout.strip() == "hi"
    for key in SUMMARY_KEYS:
        assert s[key] == 0
    assert s["exit_code"] == 0


def test_child_exit_code_is_propagated(colocate, tmp_path):
    proc, s = run_job(colocate, tmp_path, [], [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert proc.returncode == 3
    assert s["exit_code"] == 3


def test_child_killed_by_signal_gives_128_plus_n(colocate, tmp_path):
    proc, _ = run_job(colocate, tmp_path, [],
                      [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.returncode == 128 + signal.SIGKILL == 137


def sigterm_launcher(child, ready, cwd, env) -> tuple[subprocess.Popen, str]:
    """``colocate run --device sim -- python CHILD``: once the child has made ``ready``, SIGTERM to the launcher alone
    (the child hears it only as forwarded); the launcher, ended, and its stderr."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "colocate", "run", "--device", "sim", "--", sys.executable, str(child)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: ready.exists() or launcher.poll() is not None, 60, what="the child to be ready")
        assert launcher.poll() is None, launcher.communicate()
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=90)  # a bound, not a speed: a lost SIGTERM still ends at 60 s with 5
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher, err


def test_sigterm_is_forwarded_to_the_child(tmp_path, job_env):
    ready, got = tmp_path / "ready", tmp_path / "got"
    child = write(tmp_path / "child.py", f"""\
        import os, signal, sys, time
        def on_term(signum, frame):
            open({str(got)!r}, "w").write("TERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        # the handshake appears whole (a rename): a SIGTERM during the implicit close of a file object that is
        # dropped unnamed raises inside its finaliser, where the SystemExit is ignored and the child sleeps on
        with open({str(ready)!r} + ".tmp", "w") as f:
            f.write("ready")
        os.replace({str(ready)!r} + ".tmp", {str(ready)!r})
        time.sleep(60)
        sys.exit(5)
        """)
    launcher, err = sigterm_launcher(child, ready, tmp_path, job_env)
    assert got.read_text() == "TERM"
    assert launcher.returncode == 0, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def module_job(colocate, tmp_path_factory):
    """`colocate run -- python -m jobpkg.train` with a user sitecustomize on PYTHONPATH."""
    root = tmp_path_factory.mktemp("modjob")
    site = root / "site"
    (site / "jobpkg").mkdir(parents=True)
    marks = root / "marks.txt"
    write(site / "sitecustomize.py", f"""\
        import os
        with open({str(marks)!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{os.environ.get('COLOCATE_ENABLED', '-')}}\\n")
        os.environ["USER_SITECUSTOMIZE_RAN"] = "1"
        """)
    (site / "jobpkg" / "__init__.py").write_text("")
    out = root / "out.json"
    write(site / "jobpkg" / "train.py", f"""\
        import json, os, sys, torch, torch_hooks
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step(); opt.zero_grad()
        with open({str(out)!r}, "w") as f:
            json.dump({{"name": __name__, "pid": os.getpid(),
                       "user_site": os.environ.get("USER_SITECUSTOMIZE_RAN"),
                       "iterations": torch_hooks.stats()["iterations"]}}, f)
        """)
    stats = root / "stats.json"
    proc = colocate(["run", "--device", "sim", "--stats-file", stats, "--", sys.executable, "-m", "jobpkg.train"],
                    cwd=root, env={"PYTHONPATH": str(site)})
    return {
        "proc": proc,
        "out": json.loads(out.read_text()) if out.exists() else None,
        "stats": json.loads(stats.read_text()) if stats.exists() else None,
        "marks": marks.read_text().split("\n") if marks.exists() else [],
    }


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a host core beside the simulated GPU's")
def test_a_stopped_job_leaves_the_gpus_core_and_its_idle_class_before_the_signal_reaches_it(tmp_path, job_env):
    """An opportunistic job yields its simulated GPU's core by the idle scheduling class: stopped so, it would get
    almost no CPU time to save its checkpoint on a busy core. The launcher moves it first."""
    ready, got = tmp_path / "ready", tmp_path / "got"
    core = max(os.sched_getaffinity(0))
    child = write(tmp_path / "child.py", f"""\
        import json, os, signal, sys, time
        def on_term(signum, frame):
            seen = {{"cores": sorted(os.sched_getaffinity(0)), "idle": os.sched_getscheduler(0) == os.SCHED_IDLE}}
            with open({str(got)!r} + ".tmp", "w") as f:
                json.dump(seen, f)
            os.replace({str(got)!r} + ".tmp", {str(got)!r})
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        os.sched_setaffinity(0, {{{core}}})  # as the runtime pins a job to its GPU's core
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # and a yielding job takes the idle class
        with open({str(ready)!r} + ".tmp", "w") as f:
            f.write("ready")
        os.replace({str(ready)!r} + ".tmp", {str(ready)!r})
        time.sleep(60)
        sys.exit(5)
        """)
    env = {**job_env, "COLOCATE_SIM_CORE": str(core)}
    launcher, err = sigterm_launcher(child, ready, tmp_path, env)
    seen = json.loads(got.read_text())
    assert core not in seen["cores"] and seen["cores"], seen
    if os.geteuid() == 0:  # an unprivileged process may not leave the idle class; its cores are enough
        assert seen["idle"] is False
    assert launcher.returncode == 0, err


def test_python_dash_m_module_runs_under_the_runtime(module_job):
    proc = module_job["proc"]
    assert proc.returncode == 0, proc.stderr
    assert module_job["out"]["name"] == "__main__"
    assert module_job["out"]["iterations"] == 3
    assert module_job["stats"]["iterations"] == 3


def test_existing_sitecustomize_is_chained(module_job):
    proc, out = module_job["proc"], module_job["out"]
    assert proc.returncode == 0, proc.stderr
    assert out["user_site"] == "1"  # the user's sitecustomize ran inside the job process ...
    job_marks = [l for l in module_job["marks"] if l.startswith(f"{out['pid']} ")]
    assert job_marks == [f"{out['pid']} 1"]  # ... exactly once, with the runtime enabled
    assert out["iterations"] == 3  # ... and the runtime was installed as well


@pytest.fixture(scope="module")
def big_job_script(tmp_path_factory):
    return write(tmp_path_factory.mktemp("big") / "big.py", BIG)


@pytest.mark.slow
def test_memory_cap_below_working_set_spills_to_host(colocate, tmp_path, big_job_script):
    proc, s = run_job(colocate, tmp_path, ["--gpu-mem", "3MiB"], [sys.executable, big_job_script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("done")
    assert s["mem_cap_bytes"] == 3 * MiB
    assert s["host_bytes_peak"] > 0
    assert s["boundary_reserved_over_cap_max_bytes"] == 0
    assert s["mem_reserved_peak_bytes"] <= 3 * MiB
    assert s["iterations"] == 4
    assert s["host_penalty_s"] > 0  # sim charges device time for host-served bytes


def test_on_cap_error_stops_with_one_line(colocate, tmp_path, big_job_script):
    proc, s = run_job(colocate, tmp_path, ["--gpu-mem", "3MiB", "--on-cap", "error"], [sys.executable, big_job_script])
    assert proc.returncode != 0
    assert "done" not in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = nonempty_lines(proc.stderr)
    assert lines, "expected an error line"
    assert lines[-1].startswith("colocate: device memory cap"), proc.stderr
    assert sum(l.startswith("colocate: device memory cap") for l in lines) == 1
    assert "3.00 MiB" in lines[-1] and "tried to allocate" in lines[-1]
    assert s["exit_code"] == proc.returncode


@pytest.mark.slow
def test_sm_share_half_holds_busy_fraction(colocate, tmp_path):
    script = write(tmp_path / "busy.py", BUSY)

    def once():
        proc, s = run_job(colocate, tmp_path, ["--sm-share", "0.5"], [sys.executable, script])
        assert proc.returncode == 0, proc.stderr
        return proc, s

    # never above its share, and held there when the job can use more (on a core of its own: half_share_run)
    proc, s, info = half_share_run(once)
    n = int(proc.stdout.split()[-1])
    assert s["iterations"] == n >= 10
    assert s["throttle_idle_s"] > 0, info
    assert abs(s["busy_fraction"] - 0.5) <= 0.05, info


# ---------------------------------------------------------------- in-process pieces of the launcher ---


def test_check_command(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("")
    L.check_command((sys.executable, str(script)), None)
    L.check_command((sys.executable, "-m", "does.not.matter"), None)
    with pytest.raises(L.LaunchError, match="no command"):
        L.check_command((), None)
    with pytest.raises(L.LaunchError, match="script not found"):
        L.check_command((sys.executable, str(tmp_path / "missing.py")), None)
    with pytest.raises(L.LaunchError, match="command not found"):
        L.check_command(("no-such-prog-xyz",), None)


class FakeNvml:
    """pynvml as far as ``visible_device`` uses it: device handles and their UUIDs (bytes, as older bindings)."""

    def __init__(self, uuids):
        self.uuids = uuids

    def nvmlDeviceGetHandleByIndex(self, index):
        if index not in self.uuids:
            raise RuntimeError(f"NVML: no device {index}")
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle].encode()


def no_nvml():
    raise ImportError("No module named 'pynvml'")


def test_job_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(N, "_nvml", no_nvml)  # the same on every machine, with or without NVML
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/user/site", "COLOCATE_SIM_CORE": "0", "OMP_NUM_THREADS": "4"}
    spec = L.RunSpec(command=("python", "x.py"), device="sim", gpu=1, gpu_mem=3 << 20, sm_share=0.5,
                     klass="opportunistic", on_cap="error", job_id="j")
    env = L.job_environment(spec, base, str(tmp_path))
    job = JobEnv.from_environ(env)
    assert job.enabled and job.job_id == "j" and job.gpu == 1 and job.gpu_mem == 3 << 20
    assert job.sm_share == 0.5 and job.klass == "opportunistic" and job.on_cap == "error"
    assert job.stats_dir == str(tmp_path) and job.sim_core == 0
    pp = env["PYTHONPATH"].split(os.pathsep)
    assert pp[0] == L.INJECT_DIR and pp[-1] == "/user/site"
    assert "/user/site" in env["COLOCATE_CHAIN_SITECUSTOMIZE"].split(os.pathsep)
    assert env["OMP_NUM_THREADS"] == "4"  # the user's own setting wins
    assert "CUDA_VISIBLE_DEVICES" not in env
    cuda = L.job_environment(L.RunSpec(command=("x",), device="cuda", gpu=2), {"PATH": "/usr/bin"}, str(tmp_path))
    assert cuda["CUDA_VISIBLE_DEVICES"] == "2"  # NVML cannot tell: the index
    assert cuda["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert L.job_environment(L.RunSpec(command=("x",)), {}, str(tmp_path))["COLOCATE_JOB_ID"].startswith("job-")


def test_a_job_decides_its_own_engine_variables(tmp_path):
    """An engine worker's per-process variables are not inherited by a job it launches; fail-closed is, and is
    checked against the job's own --node; --partition is written."""
    base = {"PATH": "/usr/bin", "COLOCATE_ENGINE": "ray", "COLOCATE_RANK": "3", "COLOCATE_GPUS": "node",
            "COLOCATE_PARTITION": "1", "COLOCATE_NODE_REQUIRED": "1"}
    spec = L.RunSpec(command=("x",), gpu_mem=1 << 30, sm_share=0.5, node="ipc:///tmp/n.sock", partition=True)
    job = JobEnv.from_environ(L.job_environment(spec, base, str(tmp_path)))
    assert (job.engine, job.rank, job.gpus, job.partition, job.node_required) == ("", None, (0,), True, True)
    plain = L.job_environment(L.RunSpec(command=("x",)), {"COLOCATE_PARTITION": "1"}, str(tmp_path))
    assert "COLOCATE_PARTITION" not in plain


@pytest.mark.parametrize("uuids, gpu, want", [
    ({0: "GPU-aaaa", 2: "GPU-cccc"}, 2, "GPU-cccc"),  # NVML's device 2, named so CUDA's order cannot differ
    ({0: "GPU-aaaa"}, 2, "2"),  # NVML has no such device: the index
    ({2: ""}, 2, "2"),  # no UUID: the index
])
def test_cuda_job_is_pinned_to_its_gpu_by_nvml_uuid(tmp_path, monkeypatch, uuids, gpu, want):
    monkeypatch.setattr(N, "_nvml", lambda: FakeNvml(uuids))
    env = L.job_environment(L.RunSpec(command=("x",), device="cuda", gpu=gpu), {"PATH": "/usr/bin"}, str(tmp_path))
    assert env["CUDA_VISIBLE_DEVICES"] == want
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    sim = L.job_environment(L.RunSpec(command=("x",), device="sim", gpu=gpu), {"PATH": "/usr/bin"}, str(tmp_path))
    assert "CUDA_VISIBLE_DEVICES" not in sim  # the simulated GPU never touches CUDA's view


def test_merge_stats_of_several_processes(tmp_path):
    def proc(pid, iters, busy, wall, res, alloc, host):
        return {"pid": pid, "iterations": iters, "device_busy_s": busy, "wall_s": wall, "busy_fraction": busy / wall,
                "mem_cap_bytes": 100, "mem_reserved_peak_bytes": res, "mem_allocated_peak_bytes": alloc,
                "host_bytes_peak": host}

    (tmp_path / "stats-1.json").write_text(json.dumps(proc(1, 10, 1.0, 4.0, 50, 40, 0)))
    (tmp_path / "stats-2.json").write_text(json.dumps(proc(2, 3, 0.5, 5.0, 80, 30, 7)))
    (tmp_path / "stats-3.json").write_text("{ not json")  # a torn file is skipped
    m = L.merge_stats(str(tmp_path))
    assert m["iterations"] == 10 and m["pid"] == 1
    assert m["device_busy_s"] == pytest.approx(1.5) and m["wall_s"] == 5.0
    assert m["busy_fraction"] == pytest.approx(0.3)
    assert (m["mem_reserved_peak_bytes"], m["mem_allocated_peak_bytes"], m["host_bytes_peak"]) == (80, 40, 7)
    assert len(m["processes"]) == 2


def test_merge_stats_without_processes(tmp_path):
    m = L.merge_stats(str(tmp_path))
    assert all(m[k] == 0 for k in SUMMARY_KEYS)
    assert m["processes"] == []


# ---------------------------------------------------------------- fencing: --lease-file

def _fenced_launcher(tmp_path, mode: str, grace_s: float):
    """A launcher with a lease of 300 s (the test shortens it once the command runs), its command ticking."""
    from colocate.base.lease import lease_clock, write_lease
    from tests.support import child_env

    lease, ticks = tmp_path / "lease", tmp_path / "ticks"
    write_lease(str(lease), lease_clock() + 300.0, grace_s)
    (tmp_path / "ticker.py").write_text(TICKER)
    proc = subprocess.Popen([sys.executable, "-m", "colocate", "run", "--device", "sim", "--lease-file", str(lease),
                             "--", sys.executable, str(tmp_path / "ticker.py"), mode, str(ticks)],
                            env=child_env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for(lambda: ticks.exists() and (tmp_path / "ticks.pid").exists() and (tmp_path / "ticks.pid").read_text(),
             60, what="the command to tick")
    return proc, lease, ticks, int((tmp_path / "ticks.pid").read_text())


def _gone(pid: int) -> bool:
    from tests.support import alive

    return not alive(pid)


def test_a_lapsed_lease_stops_the_command_and_a_renewed_one_does_not(tmp_path):
    from colocate.base.lease import lease_clock, write_lease

    proc, lease, ticks, child = _fenced_launcher(tmp_path, "term", grace_s=5.0)
    try:
        write_lease(str(lease), lease_clock() + 1.0, 5.0)  # renewed, then let lapse
        t_lapse = __import__("time").time() + 1.0
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out  # SIGTERM, through the launcher
        assert b"lease" in out and b"lapsed" in out
        last = float(ticks.read_text().split()[-1])
        assert last < t_lapse + 0.25 + 0.5  # within a lease check (and a tick) of the lapse
        assert _gone(child)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_with_its_launcher(tmp_path):
    from colocate.base.lease import lease_clock, write_lease

    proc, lease, ticks, child = _fenced_launcher(tmp_path, "ignore", grace_s=0.5)
    try:
        write_lease(str(lease), lease_clock() - 1.0, 0.5)  # lapsed
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL  # the whole group, the launcher too
        wait_for(lambda: _gone(child), 10, what="the command to be gone")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_command_dies_with_a_killed_launcher(tmp_path):
    proc, lease, ticks, child = _fenced_launcher(tmp_path, "ignore", grace_s=5.0)
    try:
        proc.kill()  # the launcher only (not its group): PR_SET_PDEATHSIG takes the command with it
        proc.communicate(timeout=30)
        wait_for(lambda: _gone(child), 10, what="the command to die with its launcher")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("job_id", ["a\x01b", "a\nb", "tab\there", "esc\x1b[2J", "c1\x85"])
def test_a_job_id_the_wire_refuses_is_refused_before_the_command_starts(tmp_path, job_id):
    """QA: ``--job-id $'a\\x01b'`` started the job, whose link failed with a traceback: it ran without limits."""
    marker = tmp_path / "ran"
    spec = L.RunSpec(command=(sys.executable, "-c", f"open({str(marker)!r}, 'w')"), device="sim", job_id=job_id)
    with pytest.raises(L.LaunchError) as info:
        L.launch(spec)
    assert str(info.value).startswith("--job-id: expected text without control characters") and "\n" not in str(
        info.value)
    assert not marker.exists()
    L.check_job_id("ジョブ-1.x")  # any printable text is an id


FORKED = """
import multiprocessing as mp, os, sys
import torch

def work(steps):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad(); model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step()

def load(steps):  # a DataLoader's worker processes (forked on Linux) do no device work: no statistics of their own
    data = torch.utils.data.TensorDataset(torch.randn(4 * steps, 8))
    for (x,) in torch.utils.data.DataLoader(data, batch_size=4, num_workers=2):
        pass

if __name__ == "__main__":
    load(3)
    work(2)  # the parent trains before it forks: its children count from the fork
    ctx = mp.get_context(sys.argv[1])
    procs = [ctx.Process(target=work, args=(5,)) for _ in range(2)]
    for p in procs: p.start()
    for p in procs: p.join()
    print("codes", [p.exitcode for p in procs])
"""


def test_every_process_of_a_job_is_in_its_stats_whatever_started_it(colocate, tmp_path):
    """Workers a job starts with multiprocessing are in its --stats-file: a forked one ends with os._exit (no
    exit handlers), so it writes its own statistics among multiprocessing's exit finalizers, counted from the
    fork. A forked process that ran no mini-batch (a DataLoader's worker) writes none: its CPU time is no device
    time. (Spawned workers run the runtime anew and exit as any process: they were counted already.)"""
    script = write(tmp_path / "forked.py", FORKED)
    proc, s = run_job(colocate, tmp_path, [], [sys.executable, script, "fork"])
    assert proc.returncode == 0 and "codes [0, 0]" in proc.stdout, proc.stderr
    its = sorted(p["iterations"] for p in s["processes"])
    assert its == [2, 5, 5], s["processes"]
    assert len({p["pid"] for p in s["processes"]}) == 3
