"""torch_hooks.link.register_first: the registration a worker finishes before its device opens.

The node is played by the test (a ROUTER on an ipc path) while ``register_first`` runs in a thread: what the
worker says (a partition, a pick), and what it does with each answer (a Welcome binds it to the node's GPU, a
refusal is one line, silence is one line where the worker may not run without its node). Then the CUDA
selection of a picked GPU, with a stand-in for torch.
"""
from __future__ import annotations

import os
import sys
import threading
import types

import pytest
import zmq

from colocate import protocol as P
from colocate.base.env import JobEnv
from torch_hooks.link import NodeRefused, register_first

GiB = 1 << 30


@pytest.fixture
def node(tmp_path):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/n.sock"
    sock.bind(endpoint)
    yield endpoint, sock
    sock.close(0)
    ctx.term()


def run_in_thread(env):
    out: dict = {}

    def go():
        try:
            out["env"] = register_first(env)
        except NodeRefused as exc:
            out["error"] = str(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


PICK = dict(klass="opportunistic", pick_gpu=True, gpu_mem=GiB)
PART = dict(partition=True, sm_share=0.5, gpu_mem=4 * GiB)
LIMITS = P.Limits(seq=1, mem_cap=GiB, sm_share=1.0, gate=False)


@pytest.mark.parametrize("case, fields, answer, want", [
    ("a pick is bound to the node's GPU", PICK,
     P.Welcome(job_id="j", node_epoch=1, limits=LIMITS, gpu=1, mem_total=2 * GiB, sim_core=0),
     {"gpu": 1, "gpus": (1,), "pick_gpu": False, "sim_core": 0, "sim_gpu_mem": 2 * GiB}),
    ("a partition keeps its GPU", PART,
     P.Welcome(job_id="j", node_epoch=1, limits=LIMITS, gpu=0, mem_total=16 * GiB, sim_core=1),
     {"gpu": 0, "gpus": (), "partition": True, "sim_core": None}),
    ("a refusal is one line", PART,
     P.Error(code=P.REJECTED, message="GPU 0: a partition of share 0.5 does not fit\nsecond line", job_id="j"),
     "the node coordinator at {ep} refused worker j: GPU 0: a partition of share 0.5 does not fit"),
    ("an invalid registration too", PICK, P.Error(code=P.INVALID, message="no GPU 9", job_id="j"),
     "the node coordinator at {ep} refused worker j: no GPU 9"),
])
def test_the_node_answer(node, case, fields, answer, want):
    endpoint, sock = node
    env = JobEnv(job_id="j", token="t" * 32, node=endpoint, node_wait_s=30.0, **fields)
    t, out = run_in_thread(env)
    assert sock.poll(10_000), "no registration"
    ident, data = sock.recv_multipart()
    reg = P.decode(data)
    assert (reg.job_id, reg.token, reg.partition, reg.pick_gpu, reg.mem_request, reg.sm_request) == (
        "j", "t" * 32, env.partition, env.pick_gpu, env.gpu_mem, env.sm_share)
    sock.send_multipart([ident, P.encode(answer)])
    t.join(10)
    if isinstance(want, str):
        assert out == {"error": want.format(ep=endpoint)}
    else:
        assert {k: getattr(out["env"], k) for k in want} == want


@pytest.mark.parametrize("fields, want", [
    (dict(node_required=True), "COLOCATE_NODE_REQUIRED=1: this worker does not run without it"),
    (PICK, "COLOCATE_GPUS=node: this worker does not run without it"),
    (PART, None),  # a partition that is not required runs on at its own limits
])
def test_no_answer(tmp_path, fields, want):
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    env = JobEnv(job_id="j", node=endpoint, node_wait_s=0.2, **fields)
    if want is None:
        assert register_first(env) == env
        return
    with pytest.raises(NodeRefused) as info:
        register_first(env)
    assert str(info.value) == (f"no node coordinator answered at {endpoint} within 0.2 s: start `colocate node` "
                               f"on this machine ({want})")


@pytest.mark.parametrize("started", [False, True])
def test_a_picked_cuda_gpu_is_selected_before_cuda_starts(monkeypatch, started):
    import torch_hooks

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: started))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr("colocate.gpus.nvml.visible_device", lambda i: f"GPU-uuid-{i}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what Ray gives a task that asked for no GPU
    if started:
        with pytest.raises(ValueError, match="CUDA started before the node's GPU 3 could be selected"):
            torch_hooks._select_cuda_device(3)
    else:
        torch_hooks._select_cuda_device(3)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-uuid-3"
