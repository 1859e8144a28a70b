"""Simulated GPUs: cores (colocate/gpus/sim.py) and the device priority of a job (torch_hooks/device/sim.py).

Each case runs in a child process: scheduling classes and CPU affinity are
per-thread process state that the test runner must not keep.
"""
import json
import os
import subprocess
import sys

import pytest

from colocate.gpus import sim
from tests.support import REPO

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"),
                                reason="needs Linux scheduling classes")


def run_child(code: str, timeout: float = 60) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index, ncores, core", [(0, 2, 1), (1, 2, 0), (2, 2, 1), (0, 1, 0), (3, 8, 4)])
def test_default_core_counts_down_from_the_last(index, ncores, core):
    assert sim.default_core(index, ncores) == core


def test_node_gpus_have_a_core_each_and_reject_zero():
    gpus = sim.node_gpus(2, 1 << 30)
    assert [(g.index, g.kind, g.mem_total) for g in gpus] == [(0, "sim", 1 << 30), (1, "sim", 1 << 30)]
    assert all(g.core is not None for g in gpus)
    with pytest.raises(ValueError):
        sim.node_gpus(0, 1 << 30)


@linux_only
def test_low_priority_moves_every_thread_to_the_idle_class_and_back():
    out = run_child(r'''
import json, os, threading
from torch_hooks.device.sim import SimJobDevice
from colocate.base.env import JobEnv

dev = SimJobDevice(JobEnv())
dev.join_core()
tids, stop = [], threading.Event()
def worker():
    tids.append(threading.get_native_id())
    stop.wait()
t = threading.Thread(target=worker); t.start()
while not tids: pass
main = threading.get_native_id()
res = {"before": [os.sched_getscheduler(x) for x in (main, tids[0])]}
res["ok_low"] = dev.set_low_priority(True)
res["low"] = [os.sched_getscheduler(x) for x in (main, tids[0])]
late = []
t2 = threading.Thread(target=lambda: late.append(os.sched_getscheduler(0))); t2.start(); t2.join()
res["late"] = late[0]
res["ok_normal"] = dev.set_low_priority(False)
res["normal"] = [os.sched_getscheduler(x) for x in (main, tids[0])]
stop.set(); t.join()
print(json.dumps(res))
''')
    assert out["before"] == [os.SCHED_OTHER] * 2
    assert out["ok_low"] and out["low"] == [os.SCHED_IDLE] * 2
    assert out["late"] == os.SCHED_IDLE  # threads started later inherit the class
    assert out["ok_normal"] and out["normal"] == [os.SCHED_OTHER] * 2


@linux_only
def test_a_job_joins_the_core_at_its_first_device_work_and_takes_its_priority_there():
    """Start-up is host work: until the first device work (``phase_start``) the process keeps its own CPUs and
    its normal class, even when low priority was asked for; then every thread moves onto the GPU's core
    (threads started later too) and into the idle class."""
    out = run_child(r'''
import json, os, threading
from torch_hooks.device.sim import SimJobDevice
from colocate.base.env import JobEnv

dev = SimJobDevice(JobEnv())
ready, stop = threading.Event(), threading.Event()
tid = []
def worker():
    tid.append(threading.get_native_id()); ready.set(); stop.wait()
t = threading.Thread(target=worker); t.start(); ready.wait(10)
main = threading.get_native_id()
res = {"core": dev.core, "before": sorted(os.sched_getaffinity(0))}
res["ok_low"] = dev.set_low_priority(True)
res["asked"] = [os.sched_getscheduler(x) for x in (main, tid[0])]
dev.phase_start()
dev.phase_start()  # idempotent
res["after"] = [sorted(os.sched_getaffinity(x)) for x in (main, tid[0])]
res["low"] = [os.sched_getscheduler(x) for x in (main, tid[0])]
late = []
t2 = threading.Thread(target=lambda: late.append(sorted(os.sched_getaffinity(0)))); t2.start(); t2.join()
res["late"] = late[0]
stop.set(); t.join()
print(json.dumps(res))
''')
    assert out["ok_low"] and out["asked"] == [os.SCHED_OTHER] * 2  # kept for the join
    assert out["after"] == [[out["core"]]] * 2 and out["late"] == [out["core"]]
    assert out["low"] == [os.SCHED_IDLE] * 2


@linux_only
def test_a_control_thread_stays_off_the_core_and_out_of_the_idle_class():
    """The node link's thread is host work: an opportunistic job starved of device time (idle class on a
    busy core) must still answer its node, so neither the join nor low priority moves that thread, whether
    it was marked before the join or after it (a thread started later inherits the core and the class)."""
    out = run_child(r'''
import json, os, threading
from torch_hooks.device.sim import SimJobDevice
from colocate.base.env import JobEnv

if len(os.sched_getaffinity(0)) < 2:
    print(json.dumps({"skip": True})); raise SystemExit
dev = SimJobDevice(JobEnv())
dev.set_low_priority(True)
ready, stop, seen = threading.Event(), threading.Event(), {}
def control():
    dev.control_thread(); seen["early"] = threading.get_native_id(); ready.set(); stop.wait()
t = threading.Thread(target=control); t.start(); ready.wait(10)
dev.phase_start()
late_ready = threading.Event()
def late_control():
    dev.control_thread(); seen["late"] = threading.get_native_id(); late_ready.set(); stop.wait()
t2 = threading.Thread(target=late_control); t2.start(); late_ready.wait(10)
main = threading.get_native_id()
res = {"core": dev.core,
       "main": [sorted(os.sched_getaffinity(main)), os.sched_getscheduler(main)],
       "control": [[sorted(os.sched_getaffinity(seen[k])), os.sched_getscheduler(seen[k])] for k in ("early", "late")]}
dev.set_low_priority(False); dev.set_low_priority(True)
res["control_again"] = [os.sched_getscheduler(seen[k]) for k in ("early", "late")]
stop.set(); t.join(); t2.join()
print(json.dumps(res))
''')
    if out.get("skip"):
        pytest.skip("needs two CPUs: one for the simulated GPU, one for host work")
    assert out["main"] == [[out["core"]], os.SCHED_IDLE]
    for cpus, policy in out["control"]:
        assert out["core"] not in cpus and policy == os.SCHED_OTHER
    assert out["control_again"] == [os.SCHED_OTHER] * 2


@linux_only
def test_a_control_threads_cpu_time_is_not_device_busy_time():
    """The node link's CPU time is host work: busy_time (the device time the throttle and the reports count)
    leaves it out, while it runs and after the thread has ended."""
    out = run_child(r'''
import json, threading, time
from torch_hooks.device.sim import SimJobDevice
from colocate.base.env import JobEnv

dev = SimJobDevice(JobEnv())
busy0, cpu0 = dev.busy_time(), time.process_time()
spun, done = threading.Event(), threading.Event()
def control():
    dev.control_thread()
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
    spun.set(); done.wait(10)
t = threading.Thread(target=control); t.start(); spun.wait(10)
busy1, cpu1 = dev.busy_time(), time.process_time()
done.set(); t.join()
busy_ended = dev.busy_time()  # the ended thread's time, as last read, stays out
dev.charge(0.2)  # device work on this thread counts
busy2 = dev.busy_time()
print(json.dumps({"cpu": cpu1 - cpu0, "busy": busy1 - busy0, "ended": busy_ended - busy0,
                  "charged": busy2 - busy_ended}))
''')
    assert out["cpu"] >= 0.3 and out["busy"] < 0.1 and out["ended"] < 0.1, out
    assert 0.2 <= out["charged"] < 0.3, out


@linux_only
def test_low_priority_job_gets_the_core_only_while_the_other_waits():
    """Two spinning processes on one core: the idle-class one gets (almost) nothing
    while the normal one is runnable; as two normal ones they split the core."""
    out = run_child(r'''
import json, os, time
from multiprocessing import Pipe, Process
import psutil
from torch_hooks.device.sim import SimJobDevice
from colocate.gpus.sim import default_core
from colocate.base.env import JobEnv

core = default_core(0)

def cpu_of(pid):
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system

def spin(low, seconds, conn, watch=None):
    os.sched_setaffinity(0, {core})
    if low:
        dev = SimJobDevice(JobEnv())
        dev.join_core()
        dev.set_low_priority(True)
    conn.send("ready")
    conn.recv()  # start together
    other0 = None if watch is None else cpu_of(watch)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    # the other process's CPU time over exactly this one's spin (read while this one runs)
    conn.send((time.process_time(), None if watch is None else cpu_of(watch) - other0))

res = {}
for name, low in (("mixed", True), ("equal", False)):
    pipes = [Pipe() for _ in range(2)]
    second = Process(target=spin, args=(low, 1.5, pipes[1][1]))
    second.start()
    first = Process(target=spin, args=(False, 1.0, pipes[0][1], second.pid))
    first.start()
    for parent, _ in pipes:  # both pinned (and one in the idle class) before either spins
        assert parent.poll(60) and parent.recv() == "ready"
    pipes[1][0].send("go")  # the second spins first, so the first's whole spin is contended
    pipes[0][0].send("go")
    res[name] = [parent.recv() for parent, _ in pipes]
    for p in (first, second): p.join()
print(json.dumps(res))
''')
    (normal, low_during), _ = out["mixed"]
    (a, b_during), _ = out["equal"]
    # CPU seconds of the second process while the first spun, against the first's own: shares are
    # compared, not seconds, and only over the contended window, so a slow machine changes nothing
    assert low_during < 0.15 * normal, out
    assert 0.5 < a / b_during < 2.0, out
