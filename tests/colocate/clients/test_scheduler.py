"""colocate/clients/scheduler.py and colocate/clients/rpc.py: a submit retried with one request id; a request over the size limit
refused in one line before it is sent."""

from __future__ import annotations

import threading

import pytest
import zmq

from colocate import protocol as P
from colocate.clients import rpc
from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import free_port


def test_a_submit_without_an_answer_is_retried_with_the_same_request_id():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router.bind(endpoint)
    client = SchedulerClient(endpoint, "", timeout_s=1.5)  # three tries of 0.5 s
    request = request_from_here(["python", "x.py"], environ={"PATH": "/bin"}, cwd="/tmp")
    result = {}
    worker = threading.Thread(target=lambda: result.update(job=client.submit(request)), daemon=True)
    worker.start()
    try:
        seen = []
        for answer in (False, True):  # the first reply is lost (never sent); the retry gets one
            assert router.poll(10_000), f"no submit after {len(seen)}"
            ident, data = router.recv_multipart()
            seen.append(P.decode(data))
            if answer:
                router.send_multipart([ident, P.encode(P.Submitted(job_id="7"))])
        worker.join(10)
        assert result == {"job": "7"}
        assert all(isinstance(m, P.Submit) for m in seen) and seen[0].request_id
        assert seen[1].request_id == seen[0].request_id and seen[1].request == seen[0].request
        assert dict(seen[0].request.env) == {"PATH": "/bin"}
    finally:
        router.close(0)
        ctx.term()


def test_a_submit_no_one_answers_is_tried_three_times_with_one_id_then_gives_up():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router.bind(endpoint)
    try:
        with pytest.raises(rpc.NoAnswer):
            SchedulerClient(endpoint, "", timeout_s=0.6).submit(request_from_here(["python", "x.py"], environ={},
                                                                                  cwd="/tmp"))
        seen = []
        while router.poll(1000):
            seen.append(P.decode(router.recv_multipart()[1]))
        assert len(seen) == 3 and len({m.request_id for m in seen}) == 1
    finally:
        router.close(0)
        ctx.term()


def test_a_request_too_large_for_the_wire_is_refused_in_one_line_before_sending():
    env = {f"V{i}": "x" * 60000 for i in range(20)}  # 1.2 MB: each variable fits, the message does not
    request = P.JobRequest(command=("python", "x.py"), cwd="/tmp", env=env)
    with pytest.raises(rpc.TooLarge) as info:
        SchedulerClient(f"tcp://127.0.0.1:{free_port()}", "", timeout_s=0.2).submit(request)
    assert info.value.code == P.INVALID and "\n" not in str(info.value) and f"over {P.MAX_BYTES_OF['submit']}" in str(info.value)  # a Submit's own limit


def test_the_request_carries_the_hash_of_the_script_it_can_read(tmp_path):
    import hashlib

    (tmp_path / "train.py").write_bytes(b"print('train')\n")
    want = hashlib.sha256(b"print('train')\n").hexdigest()
    env = {"PATH": "/bin"}
    assert request_from_here(["python", "train.py", "--lr", "1"], environ=env, cwd=str(tmp_path)).script_hash == want
    assert request_from_here(["python", str(tmp_path / "train.py")], environ=env, cwd="/").script_hash == want
    for unread in (["python", "missing.py"], ["python", "-m", "pkg"], ["sleep", "1"]):
        assert request_from_here(unread, environ=env, cwd=str(tmp_path)).script_hash == ""
