"""The simulated GPU's total across jobs: allocators of separate processes on one GPU share its ledger
(colocate/gpus/ledger.py, the ledger in torch_hooks/csrc/sim_allocator.cpp) and their device bytes never sum past it.

Each job is a real process with the allocator installed, driven line by line over its stdin (a command, then one
JSON answer): the handshake is the answer, never a sleep. Each job holds one 2 MiB small-pool segment (``BASE``) from
its first small tensors on; every other figure is a large segment of exactly the bytes asked for.
"""

import json
import signal
import subprocess

import pytest

from colocate.gpus import ledger as L
from tests.support import PY, REPO, child_env

MiB = 1 << 20
BASE = 2 * MiB

JOB = r'''
import json, sys
import torch
from colocate.gpus import ledger
from torch_hooks import _ext

m = _ext.load()
m.install()
warm = torch.ones(4, dtype=torch.uint8)  # held: its 2 MiB small-pool segment is never wholly free
held, slot = {}, None
for line in sys.stdin:
    cmd, *args = line.split()
    out = {}
    try:
        if cmd == "attach":
            slot, why = ledger.attach(args[0], m.stats()["reserved"])
            out["ok"] = slot is not None and m.set_ledger(slot.address, slot.fd, slot.index)
        elif cmd == "cap":
            m.set_cap(int(args[0]))
        elif cmd == "error":
            m.set_error_on_cap(args[0] == "on")
        elif cmd == "alloc":
            held[args[0]] = torch.ones(int(args[1]), dtype=torch.uint8)
            out["last"] = int(held[args[0]][-1])  # the bytes are real and usable, on device or host
        elif cmd == "free":
            del held[args[0]]
        elif cmd == "empty":
            m.empty_cache()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["stats"] = {k: v for k, v in m.stats().items() if isinstance(v, (int, bool))}
    print(json.dumps(out), flush=True)
'''


class Job:
    def __init__(self):
        self.proc = subprocess.Popen([PY, "-c", JOB], cwd=REPO, env=child_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, *cmd) -> dict:
        self.proc.stdin.write(" ".join(map(str, cmd)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # the answer; the test's timeout bounds it
        assert line, f"the job ended (rc {self.proc.poll()})"
        return json.loads(line)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def gpu(tmp_path, sim_ext):
    path = str(tmp_path / "ledger")
    L.create(path, 64 * MiB)
    jobs = []

    def job():
        j = Job()
        jobs.append(j)
        got = j("attach", path)
        assert got["ok"] and got["stats"]["reserved"] == BASE
        return j

    yield path, job
    for j in jobs:
        j.kill()


def test_two_jobs_device_bytes_never_sum_past_the_gpu_and_the_second_is_served_from_host(gpu):
    path, job = gpu
    a, b = job(), job()
    assert a("alloc", "x", 40 * MiB)["stats"]["reserved"] == BASE + 40 * MiB
    got = b("alloc", "y", 40 * MiB)  # 20 MiB left on the GPU: host memory, as past its own cap
    assert got["last"] == 1 and "error" not in got
    s = got["stats"]
    assert s["reserved"] == BASE and s["host"] == 40 * MiB and s["num_device_full"] == 1
    assert L.read(path).used == 2 * BASE + 40 * MiB
    assert b("alloc", "z", 20 * MiB)["stats"]["reserved"] == BASE + 20 * MiB  # what fits still goes to the device
    assert L.read(path).used == 64 * MiB == L.read(path).total
    a("free", "x")
    assert L.read(path).used == 64 * MiB  # a's segment is cached, still a's
    a("empty")
    assert L.read(path).used == 2 * BASE + 20 * MiB
    assert b("alloc", "w", 40 * MiB)["stats"]["reserved"] == BASE + 60 * MiB  # the room a gave back


def test_over_the_gpus_total_with_on_cap_error_the_job_runs_out_of_memory_in_one_line(gpu):
    _path, job = gpu
    a, b = job(), job()
    a("alloc", "x", 50 * MiB)
    b("error", "on")
    got = b("alloc", "y", 20 * MiB)
    assert got["error"].startswith("OutOfMemoryError: colocate: the simulated GPU's memory (64.00 MiB) is full")
    assert "\n" not in got["error"].split(" (--on-cap error)")[0]
    assert got["stats"]["reserved"] == BASE and got["stats"]["num_device_full"] == 1


def test_a_job_killed_with_its_memory_held_gives_it_back_to_the_others(gpu):
    path, job = gpu
    a, b = job(), job()
    a("alloc", "x", 60 * MiB)
    assert b("alloc", "y", 10 * MiB)["stats"]["host"] == 10 * MiB
    a.kill()
    assert L.read(path).used == 64 * MiB  # the slot is there until someone needs its room
    assert b("alloc", "z", 10 * MiB)["stats"]["reserved"] == BASE + 10 * MiB
    assert L.read(path).reserved == {b.proc.pid: BASE + 10 * MiB}


def test_the_cap_and_the_total_both_hold(gpu):
    _path, job = gpu
    a = job()
    a("cap", 8 * MiB)
    s = a("alloc", "x", 10 * MiB)["stats"]  # over its own cap: host, though the GPU has room
    assert s["reserved"] == BASE and s["host"] == 10 * MiB and s["num_device_full"] == 0


FORKS = r'''
import json, os, sys
import torch
from colocate.gpus import ledger
from torch_hooks import _ext

m = _ext.load()
m.install()
slot, _ = ledger.attach(sys.argv[1], 0)
assert m.set_ledger(slot.address, slot.fd, slot.index)
small = torch.ones(1 << 20, dtype=torch.uint8)
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a DataLoader worker, say: its tensors are its own, not the job's slot
    big = torch.ones(30 << 20, dtype=torch.uint8)
    os.write(w, json.dumps(m.stats()["ledger"]).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"child_ledger": json.loads(os.read(r, 100)), "parent": m.stats()["reserved"],
                  "usage": ledger.read(sys.argv[1]).reserved}))
'''


def test_a_process_forked_by_a_job_does_not_write_the_jobs_slot(tmp_path, sim_ext):
    path = str(tmp_path / "ledger")
    L.create(path, 64 * MiB)
    res = subprocess.run([PY, "-c", FORKS, path], cwd=REPO, env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["child_ledger"] is False and out["parent"] == BASE
    assert list(out["usage"].values()) == [BASE]  # the parent's small segment, not the child's 30 MiB
