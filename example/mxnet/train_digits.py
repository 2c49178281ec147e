"""Train an MLP on scikit-learn's bundled digits (no download) with BytePS and MXNet Gluon.

    make mxnet-env            # mxnet 1.9.1 needs its own environment (numpy < 1.24)
    PY=.cache/venv-mxnet/bin/python
    $PY -m byteps_thc.launch --local 2 --compressor thc -- $PY example/mxnet/train_digits.py
    $PY -m byteps_thc.launch --local 2 -- $PY example/mxnet/train_digits.py      # uncompressed

The same data, split, model shape and schedule as example/pytorch/train_digits.py; gradients are
averaged by bps.DistributedTrainer with whatever compression `bpslaunch --compressor` chose (or
`--compressor` here). Prints per-epoch progress, the final test accuracy and a digest of the
weights (equal on all workers). Without a BytePS launcher it trains in this one process.
"""
import hashlib
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from example import common


def parse_args(argv=None):
    p = common.digits_parser(__doc__, compressors=("env", "none", "thc"))
    p.add_argument("--prefix", default="mlp_", help="Gluon name prefix of the model")
    return p.parse_args(argv)


def make_model(hidden, prefix):
    mx.random.seed(1234)  # every worker starts alike; the trainer's first step broadcasts anyway
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(gluon.nn.Dense(hidden, activation="relu", in_units=64),
                gluon.nn.Dense(hidden, activation="relu", in_units=hidden),
                gluon.nn.Dense(10, in_units=hidden))
    net.initialize(mx.init.Xavier())
    return net


def weights_digest(net):
    h = hashlib.sha256()
    for name, p in sorted(net.collect_params().items()):
        h.update(name.encode())
        h.update(p.data().asnumpy().tobytes())
    return h.hexdigest()[:16]


def train(bps, args, compression, data, log=print):
    x_te, y_te = data[1]
    rank, size = bps.rank(), bps.size()
    xs, ys, steps_per_epoch = common.shard(data[0], rank, size, args.batch_size)
    net = make_model(args.hidden, args.prefix)
    opt_params = {"learning_rate": args.lr, "momentum": args.momentum}
    if size > 1 or hasattr(bps, "DistributedTrainer"):
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", opt_params,
                                         compression=compression)
    else:
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt_params)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xte = nd.array(x_te)

    def accuracy():
        return float((net(xte).argmax(axis=1).asnumpy().astype(np.int64) == y_te).mean())

    rng = np.random.default_rng(args.seed + 1000 * rank)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(ys))
        total, correct, seen = 0.0, 0, 0
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            xb, yb = nd.array(xs[idx]), nd.array(ys[idx])
            with autograd.record():
                out = net(xb)
                loss = loss_fn(out, yb)
            loss.backward()
            trainer.step(len(idx))
            total += float(loss.sum().asscalar())
            correct += int((out.argmax(axis=1).asnumpy().astype(np.int64) == ys[idx]).sum())
            seen += len(idx)
        log(f"epoch {epoch:2d}/{args.epochs}  loss {total / seen:.4f}  "
            f"train acc {correct / seen:.4f}  test acc {accuracy():.4f}")
    return {"accuracy": accuracy(), "digest": weights_digest(net),
            "steps": steps_per_epoch * args.epochs, "seconds": time.perf_counter() - t0}


def main(argv=None):
    args = parse_args(argv)
    bps, distributed = common.start("mxnet")
    compression = None
    if distributed and args.compressor == "thc":
        compression = bps.Compression.thc(bits=args.thc_bits)
    elif distributed and args.compressor == "env":
        from byteps_thc.mxnet import from_env
        compression = from_env()
    data = common.load_digits_split(args.seed)
    if bps.rank() == 0:
        print(f"digits: {len(data[0][1])} training and {len(data[1][1])} test images, "
              f"{bps.size()} worker(s), MLP 64-{args.hidden}-{args.hidden}-10, "
              f"compression {compression!r}", flush=True)
    tx0 = common.loopback_tx_bytes()
    result = train(bps, args, compression, data, log=lambda line: print(line, flush=True))
    result.update(common.wire_stats(tx0, common.loopback_tx_bytes(), result["steps"]))
    return common.finish(bps, args, result)


if __name__ == "__main__":
    sys.exit(main())
