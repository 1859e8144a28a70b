"""Peers refused at the CURVE handshake, seen through the ROUTER's monitor and logged without flooding.

A peer whose key is not admitted (ZAP said no) or that speaks without CURVE (or with another
scheduler's key) never delivers a message, so the service never hears of it. ``HandshakeWatch``
reads the socket's handshake-failure events: the first refusal of each kind is logged at once, later
ones are counted and summed up in one line at most every ``REPEAT_S`` (a refused peer retries every
0.1 s). ``refused`` counts them by kind.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("colocate.scheduler")

REPEAT_S = 60.0
KINDS: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "a peer whose key is not admitted",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "a peer without CURVE or with another scheduler's key",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "a peer without CURVE or with another scheduler's key",
}


class HandshakeWatch:
    def __init__(self, sock: zmq.Socket, clock: Callable[[], float]):
        """``sock``: the CURVE ROUTER (before bind); ``clock()``: monotonic seconds."""
        events = 0
        for e in KINDS:
            events |= e
        self.monitor = sock.get_monitor_socket(events)
        self.clock = clock
        self.refused: Counter = Counter()  # kind -> handshakes refused
        self._unlogged: Counter = Counter()  # kind -> refused since its last log line
        self._logged_at: dict[str, float] = {}

    def drain(self) -> None:
        """Read the waiting events (call when ``monitor`` is readable)."""
        for _ in range(1000):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = KINDS.get(event["event"])
            if kind is not None:
                self._note(kind, event.get("endpoint", b""))

    def _note(self, kind: str, endpoint: bytes | str) -> None:
        self.refused[kind] += 1
        self._unlogged[kind] += 1
        now = self.clock()
        last = self._logged_at.get(kind)
        if last is not None and now - last < REPEAT_S:
            return
        n, self._logged_at[kind] = self._unlogged.pop(kind), now
        where = endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else str(endpoint)
        if last is None:
            log.warning("refused at the CURVE handshake on %s: %s (further refusals are counted)", where, kind)
        else:
            log.warning("refused at the CURVE handshake: %d more from %s in the last %.0f s", n, kind, now - last)

    def close(self) -> None:
        self.monitor.close(linger=0)
