"""Ray Train with colocate: a TorchTrainer whose workers are held to their GPU fractions.

The training function is plain PyTorch (a small CNN on synthetic images); only the driver names colocate,
in one line: ``RunConfig(worker_runtime_env=colocate.ray.runtime_env())``. The run's workers are one colocate
job (``raytrain-NAME-RUN``, ranks from Ray Train), visible as such in ``colocate top`` on each node.

    colocate ray start --head --port 6379            # on each node (docs/ray.md; --address HEAD:6379 elsewhere)
    python examples/ray_train.py --address auto --mode fraction   # 2 workers of {"GPU": 0.5} on one GPU
    python examples/ray_train.py --address auto --mode whole      # 2 workers of one GPU each, on two nodes
    python examples/ray_train.py --local --mode fraction          # no cluster: one on 127.0.0.1, simulated GPUs

``fraction``: each worker's memory cap is half the GPU's memory and its compute share 0.5 (both enforced:
the busy fraction it reports stays at or under 0.5). ``whole``: each worker is a guaranteed job of its node's
adaptive policy. At the end every rank's limits and throughput are printed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def _time_up(mine: bool, device) -> bool:
    """True on every rank once any rank's time is up: the ranks stop after the same iteration (a rank that
    stopped alone would leave the others waiting in DDP's gradient all-reduce forever)."""
    import torch.distributed as dist

    flag = torch.tensor([1.0 if mine else 0.0], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def train_loop(config: dict) -> None:
    """One Ray Train worker: plain PyTorch, then a summary line per rank on the driver's collector."""
    import ray.train
    import ray.train.torch

    # a GPU when there is one (Ray Train's pick among the node's GPUs); the simulated GPU is the CPU
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    model = SmallCNN().to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(ray.train.get_context().get_world_rank())
    images = torch.randn(config["batch_size"], 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (config["batch_size"],), generator=gen)
    out = config.get("out")  # a folder for benchmarks/ray_colocation.py: the window and each rank's summary
    if out and ray.train.get_context().get_world_rank() == 0:
        open(os.path.join(out, "start"), "w").close()
    iterations, start = 0, time.monotonic()
    while not _time_up(time.monotonic() - start >= config["seconds"], device):
        time.sleep(config["host_ms"] / 1000.0)  # the data phase: the device is idle, others may use it
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        iterations += 1
    wall = time.monotonic() - start
    summary = {"rank": ray.train.get_context().get_world_rank(), "it_per_s": iterations / wall,
               "job": os.environ.get("COLOCATE_JOB_ID", "-"), "gpu": os.environ.get("COLOCATE_GPU", "-")}
    try:
        import torch_hooks

        stats = torch_hooks.stats()
        summary.update(cap=stats["mem_cap_bytes"], share=stats["sm_share"], busy=stats["busy_fraction"],
                       reserved_peak=stats["mem_reserved_peak_bytes"])
    except (ImportError, RuntimeError):  # run without colocate
        pass
    limits = ("cap {:.2f} GiB, share {:.2f}, device busy {:.2f}, reserved peak {:.2f} GiB".format(
        summary["cap"] / 2**30, summary["share"], summary["busy"], summary["reserved_peak"] / 2**30)
        if "cap" in summary else "no colocate")
    print(f"rank {summary['rank']}: job {summary['job']}, GPU {summary['gpu']}, {limits}, "
          f"{summary['it_per_s']:.1f} it/s", flush=True)
    if out:
        import json

        with open(os.path.join(out, f"rank-{summary['rank']}.json"), "w") as f:
            json.dump(summary, f)
        if summary["rank"] == 0:
            open(os.path.join(out, "stop"), "w").close()
    ray.train.report({k: v for k, v in summary.items() if isinstance(v, (int, float))})


def trainer(mode: str, seconds: float, host_ms: float, backend: str | None, storage: str,
            with_colocate: bool = True, loop=None, out: str | None = None):
    """The TorchTrainer of ``mode`` (``fraction`` or ``whole``) running ``loop`` (default ``train_loop``);
    ``with_colocate=False``: the same without colocate; ``out``: a folder (on a shared file system) where rank 0
    marks its training window (files ``start``, ``stop``) and each rank writes ``rank-N.json``."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    import colocate.ray

    gpu, strategy = (0.5, "PACK") if mode == "fraction" else (1, "STRICT_SPREAD")
    return TorchTrainer(
        loop or train_loop,
        train_loop_config={"seconds": seconds, "host_ms": host_ms, "batch_size": 32, "out": out},
        torch_config=TorchConfig(backend=backend) if backend else None,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": gpu},
                                     placement_strategy=strategy),
        run_config=RunConfig(name=f"cnn-{mode}", storage_path=storage,
                             worker_runtime_env=colocate.ray.runtime_env() if with_colocate else None),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("fraction", "whole"), default="fraction")
    p.add_argument("--address", default=None, help="the Ray cluster (ray.init's address), e.g. auto")
    p.add_argument("--local", action="store_true",
                   help="start a Ray cluster of two simulated-GPU nodes on 127.0.0.1 with a colocate node "
                        "(colocate.ray.local), run there, stop it")
    p.add_argument("--seconds", type=float, default=15.0, help="training time per worker")
    p.add_argument("--host-ms", type=float, default=10.0, help="data phase per iteration (sleep)")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default: gloo with --local, else "
                   "Ray's: nccl on GPUs)")
    p.add_argument("--storage", default=None,
                   help="Ray Train's storage_path, kept (default: a temporary folder, removed at the end)")
    args = p.parse_args(argv)
    import tempfile

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every rank's line (Ray folds lines that differ in numbers only)
    import ray

    scratch = None if args.storage else tempfile.TemporaryDirectory(prefix="ray-train-")
    storage = args.storage or scratch.name
    cluster = None
    if args.local:
        from colocate.ray.local import LocalCluster

        cluster = LocalCluster(ray_nodes=2, log_to_driver=True)
        cluster.start()
    else:
        ray.init(address=args.address, log_to_driver=True)
    try:
        backend = args.backend or ("gloo" if args.local else None)
        result = trainer(args.mode, args.seconds, args.host_ms, backend, storage).fit()
        print(f"run finished: {result.path}" + ("" if args.storage else " (a temporary folder: --storage keeps it)"))
        if cluster is not None:
            print("the colocate node saw:", {j: (i.gpu, i.priority, i.mem_cap, i.sm_share)
                                             for j, i in cluster.jobs().items()} or "(the workers have left)")
    finally:
        try:
            if cluster is not None:
                cluster.close()
            else:
                ray.shutdown()
        finally:
            if scratch is not None:
                scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
