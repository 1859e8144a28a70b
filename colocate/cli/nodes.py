"""``colocate nodes``: the cluster's nodes, sinfo-like."""

from __future__ import annotations

from colocate.cli._common import add_scheduler_options, client_failure, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("nodes", help="the nodes that joined the scheduler (like sinfo)",
                       description="Each node: up or down, GPUs, how many hold a guaranteed worker (ALLOC) and an "
                       "opportunistic one (SHARED), mean GPU utilization over the last 10 s, workers. "
                       "Exit code: 0; 1 no answer.")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from colocate.cli._tables import print_table
    from colocate.clients import rpc

    try:
        reply = scheduler_client(args).nodes()
    except rpc.RpcError as exc:
        return client_failure("nodes", exc)
    rows = [(n.node_id, n.host, "up" if n.up else "down", n.gpu_model or "-", str(n.gpus), str(n.gpus_allocated),
             str(n.gpus_shared), f"{n.utilization * 100:.0f}%", str(n.workers)) for n in reply.nodes]
    print_table(("NODE", "HOST", "STATE", "MODEL", "GPUS", "ALLOC", "SHARED", "UTIL", "WORKERS"), rows,
                right=("GPUS", "ALLOC", "SHARED", "UTIL", "WORKERS"))
    return 0
