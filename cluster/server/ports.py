"""``PortPool``: the ``MASTER_PORT`` of each placement (torchrun's rendezvous port; the start messages that
carry it are ``cluster.server.rendezvous``).

A placement's port is one of ``[base, base + size)`` not held by another live placement on the same host,
chosen from the placement id's hash so that a retried start (a new placement id) tries another port when the
last one was taken by something else (the node refuses a start whose port is bound). The service takes the
port before it commits the placement, and gives it back if the commit fails; ``take`` returns None when every
port of the host is held (the start waits for one; nothing is raised).
"""

from __future__ import annotations

import zlib


class PortPool:
    def __init__(self, base: int = 29500, size: int = 500):
        self.base, self.size = base, size
        self.held: dict[str, tuple[str, int]] = {}  # placement id -> (host, port)

    def take(self, placement_id: str, host: str) -> int | None:
        """The placement's port on ``host`` (the same one again for a held id), or None if none is free."""
        if placement_id in self.held:
            return self.held[placement_id][1]
        used = {p for h, p in self.held.values() if h == host}
        start = zlib.crc32(placement_id.encode()) % self.size
        for i in range(self.size):
            port = self.base + (start + i) % self.size
            if port not in used:
                self.held[placement_id] = (host, port)
                return port
        return None

    def release(self, placement_id: str) -> None:
        self.held.pop(placement_id, None)
