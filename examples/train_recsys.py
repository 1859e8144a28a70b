"""Train a DLRM-like recommendation model (dense features + sparse ids, BCE click loss).

A plain PyTorch training script: no colocate imports, no downloads. Sparse categorical
features go through nn.EmbeddingBag tables (several ids per bag, mean pooling), dense
features through a bottom MLP; pairwise dot-product interactions feed a top MLP that
predicts a click logit. Each iteration sleeps --host-ms milliseconds to mimic waiting on a
data loader, then moves a batch to the device and runs zero_grad / forward / backward /
optimizer.step().

With --checkpoint PATH, SIGTERM makes it stop after the current iteration, save the model, the
optimizer and the iteration count to PATH and exit with 143 (128+SIGTERM); started again with the
same PATH it prints "resumed from iteration N" and goes on from there (a completed run saves too).

    python examples/train_recsys.py --iters 200 --batch-size 256
    colocate run -- python examples/train_recsys.py --duration 60
"""
import argparse
import itertools
import os
import signal
import time

import torch
import torch.nn as nn


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None,
                   help="iterations to run (default 200; unlimited if only --duration is given)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds of training (whichever of --iters/--duration comes first)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--host-ms", type=float, default=10.0, help="host-side data phase per iteration (sleep), 0 disables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="progress line every N iterations, 0 silences")
    p.add_argument("--mem-burst-at", type=int, default=None, help="from this iteration on, hold an extra device buffer")
    p.add_argument("--mem-burst-mib", type=float, default=0.0, help="size of the extra buffer in MiB")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=EMB_DIM, help="embedding dimension")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="checkpoint file, relative to the working directory: resume from it if it exists; "
                        "on SIGTERM save to it and exit 143")
    args = p.parse_args(argv)
    if args.iters is None and args.duration is None:
        args.iters = 200
    return args


NUM_DENSE = 13
TABLE_SIZES = [20000, 10000, 5000, 5000, 1000, 1000, 500, 100]
BAG_SIZE = 4  # ids per sparse feature per sample
EMB_DIM = 32


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no ReLU after the last layer


class DLRM(nn.Module):
    def __init__(self, dim=EMB_DIM):
        super().__init__()
        self.bottom = nn.Sequential(mlp([NUM_DENSE, 256, 128, dim]), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="mean") for n in TABLE_SIZES)
        f = len(TABLE_SIZES) + 1
        self.register_buffer("tri", torch.triu_indices(f, f, offset=1), persistent=False)
        self.top = mlp([dim + f * (f - 1) // 2, 512, 256, 1])

    def forward(self, dense, sparse):
        # dense: (B, NUM_DENSE) float; sparse: (B, num_tables, BAG_SIZE) long
        feats = [self.bottom(dense)] + [t(sparse[:, k]) for k, t in enumerate(self.tables)]
        z = torch.stack(feats, dim=1)  # (B, F, D)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.tri[0], self.tri[1]]  # pairwise dots
        return self.top(torch.cat([feats[0], inter], dim=1)).squeeze(1)


def make_pool(batch_size, pool_size=8):
    """Pre-generate host batches; clicks come from a hidden linear rule so the loss can fall."""
    w_dense = torch.randn(NUM_DENSE)
    w_ids = [torch.randn(n) for n in TABLE_SIZES]
    pool = []
    for _ in range(pool_size):
        dense = torch.randn(batch_size, NUM_DENSE)
        # skewed (power-law-ish) id popularity, as in real click logs
        sparse = torch.stack([(torch.rand(batch_size, BAG_SIZE) ** 3 * n).long() for n in TABLE_SIZES], dim=1)
        score = dense @ w_dense + sum(w[sparse[:, k]].mean(1) for k, w in enumerate(w_ids))
        label = (torch.rand(batch_size) < torch.sigmoid(score)).float()
        pool.append((dense, sparse, label))
    return pool


def load_checkpoint(path, model, optimizer) -> int:
    """The iteration to resume from (0 without a checkpoint file)."""
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
    if args.checkpoint:  # SIGTERM: finish the current iteration, save, exit 143
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(term=True))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = DLRM(args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_iter = load_checkpoint(args.checkpoint, model, optimizer)
    if start_iter:
        print(f"resumed from iteration {start_iter}", flush=True)
    loss_fn = nn.BCEWithLogitsLoss()
    pool = make_pool(args.batch_size)
    burst = []  # extra activation memory kept alive once --mem-burst-at is reached

    model.train()
    start = time.perf_counter()
    last_t, last_i, done = start, start_iter, start_iter
    code = 0
    total = "inf" if args.iters is None else args.iters
    for i in itertools.count(start_iter) if args.iters is None else range(start_iter, args.iters):
        if stop["term"]:
            code = 128 + signal.SIGTERM
            break
        if args.duration is not None and time.perf_counter() - start >= args.duration:
            break
        if args.host_ms > 0:
            time.sleep(args.host_ms / 1000.0)  # waiting on data loader / IO: device idle
        dense, sparse, label = (t.to(device, non_blocking=True) for t in pool[i % len(pool)])

        if args.mem_burst_at is not None and i >= args.mem_burst_at and args.mem_burst_mib > 0:
            if not burst:
                burst.append(torch.empty(int(args.mem_burst_mib * 2**20) // 4, dtype=torch.float32, device=device))
            burst[0].fill_(float(i))

        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, sparse), label)
        loss.backward()
        optimizer.step()
        done = i + 1

        if args.log_every and done % args.log_every == 0:
            now = time.perf_counter()
            rate = (done - last_i) / max(now - last_t, 1e-9)
            print(f"iter {done}/{total} loss {loss.item():.4f} it/s {rate:.2f}", flush=True)
            last_t, last_i = now, done

    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, optimizer, done)
        if code:
            print(f"SIGTERM: checkpoint saved at iteration {done}", flush=True)
    print(f"done: {done} iterations in {elapsed:.2f} s ({(done - start_iter) / max(elapsed, 1e-9):.2f} it/s)",
          flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
