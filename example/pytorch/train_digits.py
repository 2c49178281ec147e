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
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F

# example/shared/ (not example/ itself, whose pytorch/, tensorflow/ and mxnet/ folders would pass
# for namespace packages of those names)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "shared"))
import example_common as common


def parse_args(argv=None):
    p = common.digits_parser(__doc__)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    return p.parse_args(argv)


def make_model(hidden, dtype):
    torch.manual_seed(1234)  # every worker starts alike; broadcast_parameters makes sure
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10)).to(dtype)


def param_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes()
                 if p.dtype != torch.bfloat16 else p.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv=None):
    args = parse_args(argv)
    bps, distributed = common.start("torch")
    rank, size = bps.rank(), bps.size()
    dtype = getattr(torch, args.dtype)

    data = common.load_digits_split(args.seed)
    x_tr, y_tr, steps_per_epoch = common.shard(data[0], rank, size, args.batch_size)
    n_train, (x_te, y_te) = len(data[0][1]), data[1]
    x_tr_t, y_tr_t = torch.from_numpy(x_tr).to(dtype), torch.from_numpy(y_tr)
    x_te_t, y_te_t = torch.from_numpy(x_te).to(dtype), torch.from_numpy(y_te)

    model = make_model(args.hidden, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    compression_name = "none"
    if distributed:
        # env: None, and DistributedOptimizer takes what bpslaunch --compressor chose
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=common.choose_compression(bps, args))
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
    tx0, t0 = common.loopback_tx_bytes(), time.perf_counter()
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
    result = dict(common.wire_stats(tx0, common.loopback_tx_bytes(), steps),
                  accuracy=evaluate(), steps=steps, seconds=seconds, digest=param_digest(model),
                  param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    return common.finish(bps, args, result)


if __name__ == "__main__":
    sys.exit(main())
