"""A small request/reply client for a node's operator endpoint (``colocate ctl``, ``colocate top``).

``request(endpoint, msg, timeout_s)`` is ``colocate.clients.rpc.request`` (one request, one reply; ``NoAnswer``
when the node is away, ``BadReply`` for an undecodable answer, ``Error`` replies returned as is).

``resolve_ctl_endpoint`` picks the operator endpoint (``colocate.base.endpoints`` holds the rule).
"""

from __future__ import annotations

from colocate import protocol as P
from colocate.base import endpoints
from colocate.clients import rpc
from colocate.clients.rpc import BadEndpoint, BadReply, NoAnswer  # noqa: F401 (re-exported: what callers catch)
from colocate.clients.rpc import RpcError as CtlClientError  # noqa: F401 (re-exported)

DEFAULT_TIMEOUT_S = 2.0


def resolve_ctl_endpoint(node: str | None, ctl: str | None) -> str:
    """The operator endpoint: ``ctl`` if given, else derived from ``node`` (or the default node endpoint).

    Raises ``BadEndpoint`` when it cannot be derived (a non-ipc job endpoint and no ``ctl``)."""
    if ctl:
        return ctl
    try:
        return endpoints.ctl_endpoint(node or endpoints.node_endpoint())
    except ValueError as exc:
        raise BadEndpoint(str(exc)) from None


def request(endpoint: str, msg: P.Message, timeout_s: float = DEFAULT_TIMEOUT_S, context=None) -> P.Message:
    """Send ``msg`` to the operator endpoint and return the decoded reply (``Error`` replies included)."""
    return rpc.request(endpoint, msg, timeout_s, peer="node", context=context)


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
