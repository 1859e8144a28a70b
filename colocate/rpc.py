"""One request, one reply, over a fresh DEALER: the client side of every colocate daemon.

``request(endpoint, msg, timeout_s, keys_dir=None, peer="")`` opens a DEALER (a CURVE client with the
certificates of ``keys_dir`` when given: ``cert``, else the folder's user key, see ``colocate.keys``), sends the message, waits at most
``timeout_s`` for the answer and decodes it. A daemon that is away (no socket, dead process, a reply
that never comes, or a CURVE handshake it refused) raises ``NoAnswer``; an undecodable reply
raises ``BadReply``; an ``Error`` reply is returned as is (the caller decides how to show it). A fresh
socket per request means a late answer to an earlier request can never be taken for the current one.
A message too big for the wire raises ``TooLarge`` (``code`` ``invalid``) before anything is sent; a
reply frame over ``P.MAX_MESSAGE_BYTES`` is refused by the socket (``ZMQ_MAXMSGSIZE``), so it is
never read whole: it surfaces as ``NoAnswer``.
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


def request(endpoint: str, msg: P.Message, timeout_s: float, keys_dir: str | None = None, peer: str = "daemon",
            context: zmq.Context | None = None, cert: str | None = None) -> P.Message:
    """Send ``msg`` to ``endpoint`` and return the decoded reply (``Error`` replies included)."""
    from colocate import keys as K

    try:
        data = P.encode(msg)
    except P.ProtocolError as exc:
        raise TooLarge(f"the request is too large to send: {exc}") from None
    ctx = context or zmq.Context.instance()
    try:
        sock = ctx.socket(zmq.DEALER)
    except zmq.ZMQError as exc:
        raise RpcError(f"cannot open a socket: {exc}") from None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_s * 1000)))
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_BYTES)
        if keys_dir:
            try:
                K.connect(sock, keys_dir, cert or K.client_cert(keys_dir))
            except ValueError as exc:
                raise BadEndpoint(str(exc)) from None
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            raise BadEndpoint(f"bad endpoint {endpoint!r}: {exc}") from None
        try:
            sock.send(data)
        except zmq.Again:
            raise NoAnswer(endpoint, peer) from None
        if not sock.poll(max(1, int(timeout_s * 1000)), zmq.POLLIN):
            raise NoAnswer(endpoint, peer)
        try:
            data = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            raise NoAnswer(endpoint, peer) from None
    finally:
        sock.close(linger=0)
    try:
        return P.decode(data)
    except P.ProtocolError as exc:
        raise BadReply(f"bad reply from the {peer} at {endpoint} ({exc.code}): {exc}") from None
