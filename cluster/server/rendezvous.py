"""Turning the core's StartWorkers into one ``StartPlacement`` per node, with torchrun's rendezvous.

Workers keep the core's ranks. On each node, local ranks follow the order of global ranks;
``group_rank`` is the node's index in the placement's node order (the node of rank 0 first), and
``MASTER_ADDR`` is the host that node registered with. ``MASTER_PORT`` is the placement's port from
``cluster.server.ports.PortPool``.
"""

from __future__ import annotations

from cluster.spec import JobSpec, Placement
from colocate import protocol as P


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
            placement_id=placement.placement_id, job_id=placement.job_id, priority=placement.klass,
            request=request, workers=workers, world_size=spec.workers, group_rank=group, master_addr=master,
            master_port=port)
    return out
