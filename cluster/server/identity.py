"""Who a scheduler's peer is and what it may do: the rules, apart from sockets, journal and core.

With CURVE a peer's identity is the name of its admitted key, the ZAP user id the server reads from
each message (``colocate.base.keys``): ``node-NAME`` may register as node NAME and as no other node, and
acts as no client; ``user-NAME`` submits as user NAME and cancels and reads the logs of NAME's jobs only;
``operator-NAME`` submits as NAME and cancels and reads the logs of any job. Job views (``status``) carry
no environment: a submitter's environment goes only to the nodes that run the job. Users and operators cannot register as nodes.

Without keys (``--insecure``, allowed on loopback only) nothing about a peer can be known: over TCP
the scheduler cannot learn the OS user of the connecting process. Then the user of a job is the name
the client states (``JobRequest.user``, the client's login), shown as given; every client may cancel
every job, and any process that can reach the port may register as a node.

A node id is bound to one live connection whatever the keys: a ``NodeHello`` for a node id held by
another connection heard within the liveness window is refused (the holder keeps its id) until the
holder has been silent past liveness. Every refusal is logged once per connection and reason, not per
message (the refused peer may keep trying).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from colocate.base import keys as K

log = logging.getLogger("colocate.scheduler")

MAX_REMEMBERED = 4096  # refusals remembered so each is logged once; forgotten all at once past this


@dataclass(frozen=True)
class Peer:
    """A connection's identity: ``role`` (node, user, operator) and ``name`` from its key; role None
    when the scheduler runs without keys."""

    role: str | None
    name: str

    def __str__(self) -> str:
        return f"{self.role} {self.name}" if self.role else "an unauthenticated peer"


ANONYMOUS = Peer(None, "")
NOBODY = Peer("", "")  # a CURVE peer whose key has no identity (never admitted: refused everything)


def peer_of(user_id: str | None) -> Peer:
    """The peer of a ZAP user id (None: no CURVE)."""
    if user_id is None:
        return ANONYMOUS
    parsed = K.parse_identity(user_id)
    return Peer(*parsed) if parsed else NOBODY


class Gate:
    """The checks; each returns None (allowed) or the one-line reason of a refusal."""

    def __init__(self) -> None:
        self._logged: set[tuple[bytes, str]] = set()

    def hello(self, peer: Peer, node_id: str, holder_heard_s: float | None, liveness_s: float) -> str | None:
        """May ``peer`` register as ``node_id``? ``holder_heard_s``: seconds since another connection
        holding this node id was last heard (None: no other connection holds it)."""
        if peer.role is not None and peer.role != K.NODE:
            return f"the key of {peer} cannot register as a node"
        if peer.role == K.NODE and peer.name != node_id:
            return f"the key of node {peer.name} cannot say hello as node {node_id}"
        if holder_heard_s is not None and holder_heard_s <= liveness_s:
            return (f"node id {node_id} is held by another live connection: refused until that one is silent "
                    f"for {liveness_s:g} s")
        return None

    def client(self, peer: Peer, action: str) -> str | None:
        """May ``peer`` act as a client (submit, cancel, logs)?"""
        if peer.role is not None and peer.role not in K.CLIENT_ROLES:
            return f"the key of {peer} cannot {action}: only user and operator keys can"
        return None

    def user(self, peer: Peer, claimed: str) -> str:
        """The user a job is submitted as: the key's name, or (without keys) the name the client states."""
        return peer.name if peer.role is not None else claimed

    def cancel(self, peer: Peer, job_id: str, owner: str) -> str | None:
        """May ``peer`` cancel job ``job_id`` of user ``owner``?"""
        return self._owners(peer, job_id, owner, "cancel jobs", "cancel it")

    def read_logs(self, peer: Peer, job_id: str, owner: str) -> str | None:
        """May ``peer`` read the logs of job ``job_id`` of user ``owner``? Its user and operators only (a
        job's output may hold its secrets)."""
        return self._owners(peer, job_id, owner, "read logs", "read its logs")

    def recommend_for(self, peer: Peer, job_id: str, owner: str) -> str | None:
        """May ``peer`` ask for the recommendation of job ``job_id`` of user ``owner``? Its user and operators only:
        the answer is built from that user's command line and run history."""
        return self._owners(peer, job_id, owner, "ask for recommendations", "ask for its recommendation")

    def _owners(self, peer: Peer, job_id: str, owner: str, action: str, act: str) -> str | None:
        """A client key (``action`` names what others may not do) of the job's user or an operator, or no keys."""
        why = self.client(peer, action)
        if why or peer.role in (None, K.OPERATOR) or peer.name == owner:
            return why
        return f"job {job_id} is {owner or 'nobody'}'s: only {owner or 'its user'} or an operator may {act}"

    def refused(self, ident: bytes, why: str) -> None:
        """Log a refusal once per connection and reason."""
        key = (ident, why)
        if key in self._logged:
            return
        if len(self._logged) >= MAX_REMEMBERED:
            self._logged.clear()
        self._logged.add(key)
        log.warning("refused: %s", why)
