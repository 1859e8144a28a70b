"""torch_hooks/link.py without a node: how applied limits turn the job's yielding on and off.

The link's socket thread is never started; ``_apply`` is called as the thread
would call it on a ``Welcome`` or ``SetLimits``.
"""
import logging
import os

import pytest

from colocate import protocol as P
from colocate.env import JobEnv
from torch_hooks.gate import gate_path
from torch_hooks.link import NodeLink


class FakeDevice:
    def __init__(self, grant=True):
        self.calls, self.grant = [], grant

    def set_low_priority(self, on):
        self.calls.append(on)
        return self.grant


class FakeRuntime:
    def __init__(self, device):
        self.device = device
        self.applied = []

    def set_limits(self, mem_cap=None, sm_share=None, seq=None):
        self.applied.append((mem_cap, sm_share, seq))
        return True

    def limits(self):
        return {"mem_cap": 0, "sm_share": 1.0, "seq": 0}

    def add_listener(self, fn):
        pass

    def add_start_hook(self, fn):
        pass

    def add_end_hook(self, fn):
        pass

    def add_paused_apply_hook(self, fn):
        pass


@pytest.fixture
def make_link(tmp_path):
    links = []

    def make(priority="opportunistic", yield_via=("priority",), device="sim", grant=True):
        env = JobEnv(job_id="j", priority=priority, device=device, node=f"ipc://{tmp_path}/n.sock",
                     yield_via=yield_via)
        rt = FakeRuntime(FakeDevice(grant))
        link = NodeLink(env, rt)
        links.append(link)
        return link, rt

    yield make
    for link in links:
        link._ctx.destroy(linger=0)
    try:
        os.unlink(gate_path(f"ipc://{tmp_path}/n.sock", 0))
    except OSError:
        pass


def limits(seq, gate):
    return P.Limits(seq=seq, mem_cap=1 << 30, sm_share=0.5, gate=gate)


@pytest.mark.parametrize("priority, yield_via, gates, want_calls", [
    ("opportunistic", ("priority",), [True, True, False, False, True], [True, False, True]),  # changes only
    ("opportunistic", ("priority",), [False, False], []),  # never asked to yield
    ("opportunistic", (), [True, False], []),  # COLOCATE_YIELD_VIA=none
    ("guaranteed", ("priority",), [True, False], []),  # a guaranteed job never yields
])
def test_yield_follows_the_gate_limit(make_link, priority, yield_via, gates, want_calls):
    link, rt = make_link(priority, yield_via)
    for seq, gate in enumerate(gates, start=1):
        link._apply(limits(seq, gate))
    assert rt.device.calls == want_calls
    assert [a[2] for a in rt.applied] == list(range(1, len(gates) + 1))  # limits applied every time


def test_gate_follower_only_on_sim_with_gate_in_yield_via(make_link):
    assert make_link(yield_via=("priority",))[0].follower is None
    assert make_link(device="cuda", yield_via=("priority", "gate"))[0].follower is None
    assert make_link(priority="guaranteed")[0].publisher is not None


def test_a_device_that_refuses_low_priority_is_logged(make_link, caplog):
    link, rt = make_link(device="cuda", grant=False)
    with caplog.at_level(logging.WARNING, logger="colocate.link"):
        link._apply(limits(1, True))
    assert rt.device.calls == [True]
    assert "cuda device could not take low priority" in caplog.text
    assert link.yielding  # the node's request stands; the gate (where there is one) still applies
