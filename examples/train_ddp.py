"""Train a small MLP classifier with DistributedDataParallel on synthetic data (one process per GPU).

A plain PyTorch script: no colocate imports, no downloads. Started by torchrun (or anything that sets
torchrun's variables RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each worker trains a
replica on its own shard of synthetic data; DDP all-reduces the gradients in every backward(), and the
workers agree every step on whether to stop (one all-reduce of a flag), so all of them stop at the same
iteration. Backend: nccl on CUDA (device cuda:LOCAL_RANK), gloo otherwise. Without RANK it runs as a
single process (world size 1).

A gang whose workers do not all start hangs in init_process_group, and a worker that stops taking part
hangs the others in their next all-reduce, until --dist-timeout seconds (default 300; torch's own
default for gloo is 30 minutes); then the script fails with torch's timeout error.

Checkpoint/resume: with --checkpoint PATH, SIGTERM makes every worker stop after its current iteration;
rank 0 saves the model, the optimizer and the iteration count to PATH (atomically) and all exit with code
143 (128+SIGTERM). Started again with the same PATH, the script prints "resumed from iteration N" and
continues from there; a run that completes saves its final state too.

    torchrun --nproc-per-node 2 examples/train_ddp.py --iters 200
    colocate run --gpus 0,1 -- torchrun --nproc-per-node 2 examples/train_ddp.py --duration 60 --checkpoint ddp.pt
"""
import argparse
import datetime
import itertools
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

TERMINATED = 128 + signal.SIGTERM


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None,
                   help="iterations to run (default 200; unlimited if only --duration is given)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds of training (whichever of --iters/--duration comes first); "
                        "rank 0's clock decides, so all workers stop at the same iteration")
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--host-ms", type=float, default=5.0, help="host-side data phase per iteration (sleep), 0 disables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="progress line (rank 0) every N iterations, 0 silences")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="checkpoint file, relative to the working directory: resume from it if it exists; "
                        "on SIGTERM save to it and exit 143")
    p.add_argument("--dist-timeout", type=float, default=300.0, metavar="S",
                   help="seconds a worker waits for the others (rendezvous and every collective) before failing "
                        "(default 300)")
    args = p.parse_args(argv)
    if args.iters is None and args.duration is None:
        args.iters = 200
    return args


def make_pool(batch_size, rank, features=64, classes=10, pool_size=8):
    """A few host batches per worker (its shard); labels depend on the input so the loss can fall."""
    g = torch.Generator().manual_seed(1000 + rank)
    proto = torch.randn(classes, features, generator=torch.Generator().manual_seed(7))
    pool = []
    for _ in range(pool_size):
        y = torch.randint(0, classes, (batch_size,), generator=g)
        pool.append((proto[y] + torch.randn(batch_size, features, generator=g), y))
    return pool


def init_distributed(timeout_s: float):
    """(rank, world size, local rank, device, backend); joins the gang of torchrun's variables."""
    timeout = datetime.timedelta(seconds=timeout_s)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)  # env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
    else:  # a single process
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), local_rank, device, backend


def load_checkpoint(path, model, optimizer) -> int:
    if not path or not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["iteration"])


def save_checkpoint(path, model, optimizer, iteration) -> None:
    tmp = f"{path}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}, tmp)
    os.replace(tmp, path)  # readers never see a torn file


def main(argv=None):
    args = parse_args(argv)
    stop = {"term": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(term=True))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rank, world, local_rank, device, backend = init_distributed(args.dist_timeout)
    torch.manual_seed(args.seed)  # the same initial weights on every worker (DDP also broadcasts rank 0's)

    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_iter = load_checkpoint(args.checkpoint, model, optimizer)
    if start_iter and rank == 0:
        print(f"resumed from iteration {start_iter}", flush=True)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss()
    pool = make_pool(args.batch_size, rank)
    if rank == 0:
        print(f"training: world size {world}, backend {backend}, device {device}", flush=True)

    ddp.train()
    start = time.perf_counter()
    last_t, last_i, done = start, start_iter, start_iter
    total = "inf" if args.iters is None else args.iters
    flag = torch.zeros(2, device=device)  # [SIGTERM seen, rank 0's --duration is up]
    code = 0
    for i in itertools.count(start_iter) if args.iters is None else range(start_iter, args.iters):
        flag[0] = 1.0 if stop["term"] else 0.0
        flag[1] = 1.0 if rank == 0 and args.duration is not None and time.perf_counter() - start >= args.duration else 0.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every worker stops at the same iteration
        if flag[0] > 0:
            code = TERMINATED
            break
        if flag[1] > 0:
            break
        if args.host_ms > 0:
            time.sleep(args.host_ms / 1000.0)  # waiting on data loader / IO: device idle
        x, y = (t.to(device, non_blocking=True) for t in pool[i % len(pool)])
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        done = i + 1
        if rank == 0 and args.log_every and done % args.log_every == 0:
            now = time.perf_counter()
            rate = (done - last_i) / max(now - last_t, 1e-9)
            print(f"iter {done}/{total} loss {loss.item():.4f} it/s {rate:.2f}", flush=True)
            last_t, last_i = now, done

    if args.checkpoint and rank == 0:
        save_checkpoint(args.checkpoint, model, optimizer, done)
        if code == TERMINATED:
            print(f"SIGTERM: checkpoint saved at iteration {done}", flush=True)
    dist.barrier()  # the checkpoint is on disk before any worker exits
    dist.destroy_process_group()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(f"done: {done} iterations in {elapsed:.2f} s ({(done - start_iter) / max(elapsed, 1e-9):.2f} it/s)",
              flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
