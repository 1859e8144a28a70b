"""A small request/reply client for a node's operator endpoint (``colocate ctl``, ``colocate top``).

One request, one reply: ``request(endpoint, msg, timeout_s)`` opens a DEALER, sends the message,
waits at most ``timeout_s`` for the answer and decodes it. A node that is away (no socket, dead
process, or a reply that never comes) raises ``NoAnswer``; an undecodable reply raises
``BadReply``; an ``Error`` reply is returned as is (the caller decides how to show it). A fresh
socket per request means a late answer to an earlier request can never be taken for the current one.

``resolve_ctl_endpoint`` picks the operator endpoint (``colocate.endpoints`` holds the rule).
"""

from __future__ import annotations

import zmq

from colocate import protocol as P
from colocate import endpoints

DEFAULT_TIMEOUT_S = 2.0


class CtlClientError(Exception):
    """Base of the client's failures; ``str()`` is one line for the user."""


class NoAnswer(CtlClientError):
    def __init__(self, endpoint: str):
        super().__init__(f"no answer from the node at {endpoint}")
        self.endpoint = endpoint


class BadReply(CtlClientError):
    pass


class BadEndpoint(CtlClientError):
    pass


def resolve_ctl_endpoint(node: str | None, ctl: str | None) -> str:
    """The operator endpoint: ``ctl`` if given, else derived from ``node`` (or the default node endpoint).

    Raises ``BadEndpoint`` when it cannot be derived (a non-ipc job endpoint and no ``ctl``)."""
    if ctl:
        return ctl
    try:
        return endpoints.ctl_endpoint(node or endpoints.node_endpoint())
    except ValueError as exc:
        raise BadEndpoint(str(exc)) from None


def request(endpoint: str, msg: P.Message, timeout_s: float = DEFAULT_TIMEOUT_S,
            context: zmq.Context | None = None) -> P.Message:
    """Send ``msg`` to the operator endpoint and return the decoded reply (``Error`` replies included)."""
    ctx = context or zmq.Context.instance()
    try:
        sock = ctx.socket(zmq.DEALER)
    except zmq.ZMQError as exc:
        raise CtlClientError(f"cannot open a socket: {exc}") from None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_s * 1000)))
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            raise BadEndpoint(f"bad endpoint {endpoint!r}: {exc}") from None
        try:
            sock.send(P.encode(msg))
        except zmq.Again:
            raise NoAnswer(endpoint) from None
        if not sock.poll(max(1, int(timeout_s * 1000)), zmq.POLLIN):
            raise NoAnswer(endpoint)
        try:
            data = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            raise NoAnswer(endpoint) from None
    finally:
        sock.close(linger=0)
    try:
        return P.decode(data)
    except P.ProtocolError as exc:
        raise BadReply(f"bad reply from the node at {endpoint} ({exc.code}): {exc}") from None


def list_jobs(endpoint: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> P.CtlJobs:
    """``CtlList`` -> ``CtlJobs``; an ``Error`` reply or any other type raises ``BadReply``."""
    reply = request(endpoint, P.CtlList(), timeout_s)
    if isinstance(reply, P.Error):
        raise BadReply(f"the node refused the listing ({reply.code}): {reply.message}")
    if not isinstance(reply, P.CtlJobs):
        raise BadReply(f"unexpected reply {reply.TYPE!r} to ctl_list")
    return reply


def listing_dict(jobs: P.CtlJobs) -> dict:
    """The listing as plain JSON-able data (``colocate ctl list --json``)."""
    wire = P.to_wire(jobs)
    return {"node_epoch": wire["node_epoch"], "gpus": wire["gpus"], "jobs": wire["jobs"]}
