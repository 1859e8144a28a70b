"""Turning the core's StartWorkers into one ``StartPlacement`` per node, with torchrun's rendezvous.

Workers keep the core's ranks. On each node, local ranks follow the order of global ranks;
``group_rank`` is the node's index in the placement's node order (the node of rank 0 first), and
``MASTER_ADDR`` is the host that node registered with. ``MASTER_PORT`` comes from ``PortPool``: a
port of ``[base, base + size)`` not held by another live placement on that host, chosen from the
placement id's hash so that a retried start (a new placement id) tries another port when the last
one was taken by something else (the node refuses a start whose port is bound). The service takes
the port before it commits the placement, and gives it back if the commit fails; ``take`` returns
None when every port of the host is held (the start waits for one; nothing is raised).
"""

from __future__ import annotations

import zlib

from cluster.spec import JobSpec, Placement
from colocate import protocol as P


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


def master_host(placement: Placement, hosts: dict[str, str]) -> str:
    """The host of rank 0's node (``MASTER_ADDR``)."""
    first = min(placement.slots, key=lambda s: s.rank).node_id
    return hosts.get(first, "127.0.0.1")


def start_messages(spec: JobSpec, placement: Placement, request: P.JobRequest, hosts: dict[str, str],
                   port: int) -> dict[str, P.StartPlacement]:
    """node id -> the StartPlacement that node gets. ``hosts`` maps node ids to their host; ``port`` is
    the placement's ``MASTER_PORT`` (from ``PortPool.take``)."""
    slots = sorted(placement.slots, key=lambda s: s.rank)
    order = list(dict.fromkeys(s.node_id for s in slots))
    master = master_host(placement, hosts)
    out = {}
    for group, node_id in enumerate(order):
        mine = [s for s in slots if s.node_id == node_id]
        workers = tuple(P.WorkerLaunch(rank=s.rank, local_rank=i, gpus=s.gpus) for i, s in enumerate(mine))
        out[node_id] = P.StartPlacement(
            placement_id=placement.placement_id, job_id=placement.job_id, priority=placement.priority,
            request=request, workers=workers, world_size=spec.workers, group_rank=group, master_addr=master,
            master_port=port)
    return out
