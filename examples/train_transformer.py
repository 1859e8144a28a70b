"""Train a small causal transformer language model on synthetic token streams.

A plain PyTorch training script: no colocate imports, no downloads. Token embedding +
learned positions + nn.TransformerEncoder with a causal mask, next-token cross-entropy.
Each iteration sleeps --host-ms milliseconds to mimic waiting on a data loader, then moves
a batch to the device and runs zero_grad / forward / backward / optimizer.step().

With --checkpoint PATH, SIGTERM makes it stop after the current iteration, save the model, the
optimizer and the iteration count to PATH and exit with 143 (128+SIGTERM); started again with the
same PATH it prints "resumed from iteration N" and goes on from there (a completed run saves too).

    python examples/train_transformer.py --iters 200 --batch-size 8
    colocate run -- python examples/train_transformer.py --duration 60
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
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--host-ms", type=float, default=10.0, help="host-side data phase per iteration (sleep), 0 disables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="progress line every N iterations, 0 silences")
    p.add_argument("--mem-burst-at", type=int, default=None, help="from this iteration on, hold an extra device buffer")
    p.add_argument("--mem-burst-mib", type=float, default=0.0, help="size of the extra buffer in MiB")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--width", type=int, default=128, help="model width (d_model; 4 heads, feed-forward 4x)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="checkpoint file, relative to the working directory: resume from it if it exists; "
                        "on SIGTERM save to it and exit 143")
    args = p.parse_args(argv)
    if args.iters is None and args.duration is None:
        args.iters = 200
    return args


class TinyLM(nn.Module):
    def __init__(self, vocab, seq_len, d_model=128, nhead=4, layers=2, ff=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, ff, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens):
        t = tokens.size(1)
        h = self.tok(tokens) + self.pos[:, :t]
        h = self.encoder(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def make_pool(batch_size, seq_len, vocab, pool_size=8):
    """Pre-generate token streams from a random first-order Markov chain (learnable structure)."""
    nxt = torch.randint(0, vocab, (vocab, 4))  # each token has 4 likely successors
    pool = []
    for _ in range(pool_size):
        seq = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (batch_size,))
        for j in range(1, seq_len + 1):
            seq[:, j] = nxt[seq[:, j - 1], torch.randint(0, 4, (batch_size,))]
        pool.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
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

    model = TinyLM(args.vocab, args.seq_len, d_model=args.width, ff=4 * args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_iter = load_checkpoint(args.checkpoint, model, optimizer)
    if start_iter:
        print(f"resumed from iteration {start_iter}", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    pool = make_pool(args.batch_size, args.seq_len, args.vocab)
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
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
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
