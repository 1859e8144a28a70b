"""``colocate nodes``: the cluster's nodes, sinfo-like."""

from __future__ import annotations

from colocate.cli._common import add_scheduler_options, client_failure, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("nodes", help="the nodes that joined the scheduler (like sinfo)",
                       description="Each node: up or down, GPUs, how many hold a guaranteed worker (ALLOC) and an "
                       "opportunistic one (SHARED), mean GPU utilization over the last 10 s, workers; SWITCH and RACK "
                       "(network labels, colocate node --topology) when some node has them. "
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
    labelled = any(n.switch or n.rack for n in reply.nodes)
    rows = [(n.node_id, n.host, "up" if n.up else "down", n.gpu_model or "-",
             *((n.switch or "-", n.rack or "-") if labelled else ()), str(n.gpus), str(n.gpus_allocated),
             str(n.gpus_shared), f"{n.utilization * 100:.0f}%", str(n.workers)) for n in reply.nodes]
    print_table(("NODE", "HOST", "STATE", "MODEL", *(("SWITCH", "RACK") if labelled else ()), "GPUS", "ALLOC",
                 "SHARED", "UTIL", "WORKERS"), rows, right=("GPUS", "ALLOC", "SHARED", "UTIL", "WORKERS"))
    return 0
