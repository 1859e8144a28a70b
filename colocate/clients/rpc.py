"""Requests and replies over a DEALER: the client side of every colocate daemon.

``Connection(endpoint, keys_dir=None, peer="")`` keeps one DEALER (one CURVE handshake; the key files
are read once, when it is made) for request after request: ``conn.request(msg, timeout_s)``. Strictly
one request at a time (one thread): a daemon answers each request once, so the next frame is the
answer. After anything but an answer (a timeout, a bad reply) its socket is closed and the next
request opens a new one: an answer that comes late dies with the old socket and is never taken for
a later request's. ``close()`` (idempotent; also ``with``).

``request(endpoint, msg, timeout_s, keys_dir=None, peer="")`` opens a DEALER (a CURVE client with the
certificates of ``keys_dir`` when given: ``cert``, else the folder's user key, see ``colocate.base.keys``), sends the message, waits at most
``timeout_s`` for the answer and decodes it. A daemon that is away (no socket, dead process, a reply
that never comes, or a CURVE handshake it refused) raises ``NoAnswer``; an undecodable reply
raises ``BadReply``; an ``Error`` reply is returned as is (the caller decides how to show it). A fresh
socket per request means a late answer to an earlier request can never be taken for the current one.
A message too big for the wire raises ``TooLarge`` (``code`` ``invalid``) before anything is sent; a
reply frame over ``P.MAX_FRAME_BYTES`` (a message's limit plus CURVE's few bytes) is refused by the socket
(``ZMQ_MAXMSGSIZE``), so it is never read whole: it surfaces as ``NoAnswer``.
"""

from __future__ import annotations

import zmq

from colocate import protocol as P


class RpcError(Exception):
    """Base of the client's failures; ``str()`` is one line for the user."""


class NoAnswer(RpcError):
    def __init__(self, endpoint: str, peer: str = "daemon"):
        super().__init__(f"no answer from the {peer} at {endpoint}")
        self.endpoint = endpoint


class BadReply(RpcError):
    pass


class BadEndpoint(RpcError):
    pass


class TooLarge(RpcError):
    """The request breaks a size limit of the protocol: nothing was sent."""

    code = P.INVALID


class Connection:
    """One DEALER to ``endpoint`` kept for many requests (see the module's docstring)."""

    def __init__(self, endpoint: str, keys_dir: str | None = None, peer: str = "daemon",
                 context: zmq.Context | None = None, cert: str | None = None):
        self.endpoint, self.peer = endpoint, peer
        self.ctx = context or zmq.Context.instance()
        self.sock: zmq.Socket | None = None
        self._curve: dict[str, bytes] | None = None  # the socket's CURVE options, read once
        if keys_dir:
            from types import SimpleNamespace

            from colocate.base import keys as K

            held = SimpleNamespace()  # takes what K.connect would set on a socket
            try:
                K.connect(held, keys_dir, cert or K.client_cert(keys_dir))
            except ValueError as exc:
                raise BadEndpoint(str(exc)) from None
            self._curve = dict(vars(held))

    def _socket(self) -> zmq.Socket:
        try:
            sock = self.ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:
            raise RpcError(f"cannot open a socket: {exc}") from None
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME_BYTES)
        return sock

    def _open(self) -> zmq.Socket:
        sock = self._socket()
        try:
            for name, value in (self._curve or {}).items():
                setattr(sock, name, value)
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise BadEndpoint(f"bad endpoint {self.endpoint!r}: {exc}") from None
        return sock

    def request(self, msg: P.Message, timeout_s: float) -> P.Message:
        """Send ``msg`` and return the decoded reply (``Error`` replies included); ``NoAnswer`` after ``timeout_s``."""
        try:
            data = P.encode(msg)
        except P.ProtocolError as exc:
            raise TooLarge(f"the request is too large to send: {exc}") from None
        if self.sock is None:
            self.sock = self._open()
        ms = max(1, int(timeout_s * 1000))
        answered = False
        try:
            self.sock.setsockopt(zmq.SNDTIMEO, ms)
            try:
                self.sock.send(data)
            except zmq.Again:
                raise NoAnswer(self.endpoint, self.peer) from None
            if not self.sock.poll(ms, zmq.POLLIN):
                raise NoAnswer(self.endpoint, self.peer)
            try:
                data = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                raise NoAnswer(self.endpoint, self.peer) from None
            try:
                reply = P.decode(data)
            except P.ProtocolError as exc:
                raise BadReply(f"bad reply from the {self.peer} at {self.endpoint} ({exc.code}): {exc}") from None
            answered = True
            return reply
        finally:
            if not answered:
                self._drop()

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def request(endpoint: str, msg: P.Message, timeout_s: float, keys_dir: str | None = None, peer: str = "daemon",
            context: zmq.Context | None = None, cert: str | None = None) -> P.Message:
    """Send ``msg`` to ``endpoint`` over a fresh DEALER and return the decoded reply (``Error`` replies
    included); a ``TooLarge`` request is refused before any socket is opened."""
    try:
        P.encode(msg)
    except P.ProtocolError as exc:
        raise TooLarge(f"the request is too large to send: {exc}") from None
    with Connection(endpoint, keys_dir, peer, context, cert) as conn:
        return conn.request(msg, timeout_s)
