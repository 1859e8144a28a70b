"""Linux autogroups (torch_hooks/device/autogroup.py): a low-priority job in a session of its own lowers
its session's weight, and only then.

Each case runs in a child process started in a session of its own: the autogroup's nice is per-session
state that the test runner must not change.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO
from torch_hooks.device import autogroup

pytestmark = pytest.mark.skipif(not (autogroup.enabled() and autogroup.nice() is not None and os.geteuid() == 0),
                                reason="needs Linux autogroups and the right to raise a session's weight (root)")


def run_in_new_session(code: str, timeout: float = 60) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_job_alone_in_its_session_lowers_the_session_and_restores_it():
    out = run_in_new_session("""
        import json
        from torch_hooks.device import autogroup
        before = autogroup.nice()
        ok_on = autogroup.lower(True); low = autogroup.nice()
        ok_again = autogroup.lower(True)
        ok_off = autogroup.lower(False); after = autogroup.nice()
        print(json.dumps([before, ok_on, low, ok_again, ok_off, after, autogroup.own_session()]))
    """)
    assert out == [0, True, 19, True, True, 0, True]


def test_a_session_shared_with_another_process_is_left_alone():
    # the session's leader starts an unrelated sleeper, then the job: the sleeper is neither the job's
    # ancestor nor its descendant, so lowering the session would slow it too
    out = run_in_new_session("""
        import json, subprocess, sys
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            job = subprocess.run([sys.executable, "-c", '''
        import json
        from torch_hooks.device import autogroup
        print(json.dumps([autogroup.own_session(), autogroup.lower(True), autogroup.nice()]))
        '''], capture_output=True, text=True, timeout=30)
            print(job.stdout.strip().splitlines()[-1])
        finally:
            other.kill(); other.wait()
    """)
    assert out == [False, True, 0]


def test_the_other_ranks_of_its_own_job_may_share_the_session_but_not_another_job():
    # a launcher starts two ranks of one job in its session (torchrun under a node's launcher): the other
    # rank is the same job, so the session is the job's; a rank of another job in it is not
    out = run_in_new_session("""
        import json, os, subprocess, sys
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        probe = [sys.executable, "-c", '''
        import json
        from torch_hooks.device import autogroup
        print(json.dumps([autogroup.own_session("job-a"), autogroup.lower(True, "job-a"), autogroup.nice()]))
        ''']
        res = []
        for other_job in ("job-a", "job-b"):
            other = subprocess.Popen(sleeper, env={**os.environ, "COLOCATE_JOB_ID": other_job})
            try:
                job = subprocess.run(probe, capture_output=True, text=True, timeout=30,
                                     env={**os.environ, "COLOCATE_JOB_ID": "job-a"})
                res.append(json.loads(job.stdout.strip().splitlines()[-1]))
            finally:
                other.kill(); other.wait()
        print(json.dumps(res))
    """)
    assert out == [[True, True, 19], [False, True, 0]]


def test_a_launcher_in_the_session_is_fine_and_gets_its_weight_back_at_exit():
    # a launcher (the job's parent) in the session is the job's own tree; when the job exits the
    # launcher's session is back at nice 0
    out = run_in_new_session("""
        import json, subprocess, sys
        from torch_hooks.device import autogroup
        job = subprocess.run([sys.executable, "-c", '''
        import json
        from torch_hooks.device import autogroup
        print(json.dumps([autogroup.own_session(), autogroup.lower(True), autogroup.nice()]))
        '''], capture_output=True, text=True, timeout=30)
        print(json.dumps(json.loads(job.stdout.strip().splitlines()[-1]) + [autogroup.nice()]))
    """)
    assert out == [True, True, 19, 0]


def test_the_sim_device_lowers_its_session_when_it_takes_low_priority_on_its_core():
    out = run_in_new_session("""
        import json
        from colocate.base.env import JobEnv
        from torch_hooks.device import autogroup
        from torch_hooks.device.sim import SimJobDevice
        dev = SimJobDevice(JobEnv.from_environ({"COLOCATE_DEVICE": "sim", "COLOCATE_SIM_CORE": "0"}))
        dev.set_low_priority(True); before_join = autogroup.nice()
        dev.join_core(); joined = autogroup.nice()
        dev.set_low_priority(False); left = autogroup.nice()
        print(json.dumps([before_join, joined, left]))
    """)
    assert out == [0, 19, 0]
