"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with BytePS.

    bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py
    bpslaunch --local 2 -- python example/pytorch/train_digits.py          # uncompressed

Every worker trains on its own shard of the training set; gradients are averaged by BytePS, with
whatever compression `bpslaunch --compressor` chose (or `--compressor` here, which overrides it,
except `--compressor none`: like upstream's `Compression.none`, it leaves the choice to bpslaunch).
Prints per-epoch progress and the final test accuracy. `--stats-json` writes what rank 0 measured
(accuracy, steps, bytes that crossed the loopback interface during training), for scripts/demo.py.

Without a BytePS launcher (no DMLC_ROLE) it trains in this one process, uncompressed.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=512,
                   help="hidden width; the default makes most bytes large, compressible tensors")
    p.add_argument("--compressor", choices=("env", "none", "fp16", "thc"), default="env",
                   help="env (default): what bpslaunch --compressor chose")
    p.add_argument("--thc-bits", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--stats-json", metavar="PATH", help="rank 0 writes its measurements here")
    return p.parse_args(argv)


def load_digits_split(seed=0):
    """Standardised digits, split 80/20 the same way on every worker."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-3
    return ((x_tr - mean) / std, y_tr), ((x_te - mean) / std, y_te)


def make_model(hidden, dtype):
    torch.manual_seed(1234)  # every worker starts alike; broadcast_parameters makes sure
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10)).to(dtype)


def loopback_tx_bytes():
    """Bytes sent through the loopback interface so far (/proc/net/dev), or None."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])
    except OSError:
        pass
    return None


def param_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes()
                 if p.dtype != torch.bfloat16 else p.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]


class Single:
    """Stands in for byteps.torch when no launcher started us."""
    @staticmethod
    def init():
        pass

    @staticmethod
    def rank():
        return 0

    @staticmethod
    def size():
        return 1

    @staticmethod
    def shutdown():
        pass


def main(argv=None):
    args = parse_args(argv)
    distributed = "DMLC_ROLE" in os.environ
    if distributed:
        import byteps.torch as bps
    else:
        bps = Single
        print("no DMLC_ROLE: training in this process only (use bpslaunch --local N for BytePS)")
    bps.init()
    rank, size = bps.rank(), bps.size()
    dtype = getattr(torch, args.dtype)

    (x_tr, y_tr), (x_te, y_te) = load_digits_split(args.seed)
    n_train = len(y_tr)
    x_tr, y_tr = x_tr[rank::size], y_tr[rank::size]             # this worker's shard
    # every worker must make the same number of steps: the smallest shard's
    steps_per_epoch = (n_train // size) // args.batch_size
    x_tr_t, y_tr_t = torch.from_numpy(x_tr).to(dtype), torch.from_numpy(y_tr)
    x_te_t, y_te_t = torch.from_numpy(x_te).to(dtype), torch.from_numpy(y_te)

    model = make_model(args.hidden, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    compression_name = "none"
    if distributed:
        if args.compressor == "env":
            compression = None  # DistributedOptimizer: what bpslaunch --compressor chose
        elif args.compressor == "thc":
            compression = bps.Compression.thc(bits=args.thc_bits)
        else:
            compression = getattr(bps.Compression, args.compressor)
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression)
        compression_name = repr(opt._compression) if hasattr(opt, "_compression") else "?"
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.broadcast_optimizer_state(opt, root_rank=0)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"digits: {n_train} training and {len(y_te)} test images, "
              f"{size} worker(s), {steps_per_epoch} steps/epoch of {args.batch_size} per worker, "
              f"MLP 64-{args.hidden}-{args.hidden}-10 ({n_params} parameters, {args.dtype}), "
              f"compression {compression_name}", flush=True)

    def barrier(tag):
        if distributed and size > 1:
            t = torch.zeros(1)
            bps.push_pull(t, average=False, name=f"barrier.{tag}")

    def evaluate():
        model.eval()
        with torch.no_grad():
            pred = model(x_te_t).float().argmax(1)
        model.train()
        return (pred == y_te_t).float().mean().item()

    barrier("start")
    tx0, t0 = loopback_tx_bytes(), time.perf_counter()
    steps = 0
    gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_tr_t), generator=gen)
        total_loss, correct, seen = 0.0, 0, 0
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            xb, yb = x_tr_t[idx], y_tr_t[idx]
            opt.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out.float(), yb)
            loss.backward()
            opt.step()
            steps += 1
            total_loss += loss.item() * len(yb)
            correct += (out.argmax(1) == yb).sum().item()
            seen += len(yb)
        acc = evaluate()
        print(f"epoch {epoch:2d}/{args.epochs}  loss {total_loss / seen:.4f}  "
              f"train acc {correct / seen:.4f}  test acc {acc:.4f}", flush=True)
    barrier("end")
    seconds = time.perf_counter() - t0
    tx1 = loopback_tx_bytes()
    acc = evaluate()
    digest = param_digest(model)
    print(f"final test accuracy: {acc:.4f}  ({steps} steps, {seconds:.1f}s)  "
          f"parameter digest {digest}", flush=True)
    if rank == 0 and args.stats_json:
        wire = (tx1 - tx0) if tx0 is not None and tx1 is not None else None
        stats = {"compressor": os.environ.get("BYTEPS_COMPRESSOR", "none")
                 if args.compressor == "env" else args.compressor,
                 "workers": size, "accuracy": acc, "steps": steps, "seconds": seconds,
                 "loopback_tx_bytes": wire,
                 "bytes_per_step": (wire / steps) if wire is not None and steps else None,
                 "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                 "digest": digest}
        with open(args.stats_json, "w") as f:
            json.dump(stats, f, indent=1)
    bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
