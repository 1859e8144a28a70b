"""Train a small CNN image classifier on synthetic 3x32x32 images (10 classes).

A plain PyTorch training script: no colocate imports, no downloads. Each iteration
sleeps --host-ms milliseconds to mimic waiting on a data loader, then moves a batch
to the device and runs zero_grad / forward / backward / optimizer.step().

With --checkpoint PATH, SIGTERM makes it stop after the current iteration, save the model, the
optimizer and the iteration count to PATH and exit with 143 (128+SIGTERM); started again with the
same PATH it prints "resumed from iteration N" and goes on from there (a completed run saves too).

    python examples/train_cnn.py --iters 200 --batch-size 32
    colocate run -- python examples/train_cnn.py --duration 60
"""
import argparse
import itertools
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None,
                   help="iterations to run (default 200; unlimited if only --duration is given)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds of training (whichever of --iters/--duration comes first)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--host-ms", type=float, default=10.0, help="host-side data phase per iteration (sleep), 0 disables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="progress line every N iterations, 0 silences")
    p.add_argument("--mem-burst-at", type=int, default=None, help="from this iteration on, hold an extra device buffer")
    p.add_argument("--mem-burst-mib", type=float, default=0.0, help="size of the extra buffer in MiB")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=16, help="channels of the first convolution (doubling after each)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="checkpoint file, relative to the working directory: resume from it if it exists; "
                        "on SIGTERM save to it and exit 143")
    args = p.parse_args(argv)
    if args.iters is None and args.duration is None:
        args.iters = 200
    return args


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.conv3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.fc1 = nn.Linear(4 * width * 4 * 4, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 16x16
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 8x8
        x = F.max_pool2d(F.relu(self.bn3(self.conv3(x))), 2)  # 4x4
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def make_pool(batch_size, pool_size=8, num_classes=10):
    """Pre-generate a few host batches; labels depend on the image so the loss can fall."""
    proto = torch.randn(num_classes, 3, 32, 32)
    pool = []
    for _ in range(pool_size):
        y = torch.randint(0, num_classes, (batch_size,))
        x = proto[y] + 1.0 * torch.randn(batch_size, 3, 32, 32)
        pool.append((x, y))
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

    model = SmallCNN(width=args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_iter = load_checkpoint(args.checkpoint, model, optimizer)
    if start_iter:
        print(f"resumed from iteration {start_iter}", flush=True)
    loss_fn = nn.CrossEntropyLoss()
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
        x, y = pool[i % len(pool)]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)

        if args.mem_burst_at is not None and i >= args.mem_burst_at and args.mem_burst_mib > 0:
            if not burst:
                burst.append(torch.empty(int(args.mem_burst_mib * 2**20) // 4, dtype=torch.float32, device=device))
            burst[0].fill_(float(i))

        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
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
