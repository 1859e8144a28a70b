"""colocate/clients/rpc.py's Connection and SchedulerClient: one connection (one CURVE handshake, key files read once) for
many requests, and an answer that comes late never taken for a later request's."""

from __future__ import annotations

import shutil
import threading

import zmq

from colocate import protocol as P
from colocate.base import keys as K
from colocate.clients import rpc
from colocate.clients.scheduler import SchedulerClient
from tests.support import free_port


class Router:
    """A ROUTER on loopback run by a thread: ``answer(ident, msg, n)`` -> the reply to send, or None for none."""

    def __init__(self, answer, keys_dir=None):
        self.ctx = zmq.Context()
        self.auth = K.start_authenticator(self.ctx, keys_dir) if keys_dir else None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if keys_dir:
            K.serve(self.sock, keys_dir)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.sock.bind(self.endpoint)
        self.answer, self.idents, self.late = answer, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        n = 0
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, data = self.sock.recv_multipart()
            self.idents.append(ident)
            for late_ident, late_reply in self.late:  # answers held back, sent after the next request came
                self.sock.send_multipart([late_ident, P.encode(late_reply)])
            self.late = []
            reply = self.answer(ident, P.decode(data), n)
            n += 1
            if reply is not None:
                self.sock.send_multipart([ident, P.encode(reply)])

    def close(self):
        self.stop.set()
        self.thread.join(10)
        self.sock.close(0)
        if self.auth:
            self.auth.stop()
        self.ctx.term()


def test_a_client_keeps_one_curve_connection_and_reads_its_keys_once(tmp_path):
    keys = tmp_path / "keys"
    K.generate(str(keys), K.USER, "alice")
    server = Router(lambda ident, msg, n: P.Ok(message=f"answer {n}"), str(keys))
    client_keys = tmp_path / "client"
    shutil.copytree(keys, client_keys)
    try:
        client = SchedulerClient(server.endpoint, str(client_keys), timeout_s=10)
        assert client.call(P.NodesRequest(), P.Ok).message == "answer 0"
        shutil.rmtree(client_keys)  # read once: the next requests need no file
        for i in range(1, 20):
            assert client.call(P.NodesRequest(), P.Ok).message == f"answer {i}"
        client.close()
        assert len(set(server.idents)) == 1 and len(server.idents) == 20  # one connection for all
    finally:
        server.close()


def test_a_late_answer_is_never_taken_for_the_next_request():
    def answer(ident, msg, n):
        if n == 0:  # no answer in time: held back, and sent once the next request arrived
            server.late.append((ident, P.Ok(message="late answer to request 0")))
            return None
        return P.Ok(message=f"answer {n}")

    server = Router(answer)
    try:
        conn = rpc.Connection(server.endpoint)
        try:
            conn.request(P.NodesRequest(), 0.3)
            raise AssertionError("expected no answer")
        except rpc.NoAnswer:
            pass
        assert conn.request(P.NodesRequest(), 10).message == "answer 1"
        assert conn.request(P.NodesRequest(), 10).message == "answer 2"
        conn.close()
    finally:
        server.close()
