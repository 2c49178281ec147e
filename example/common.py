"""What the examples share: BytePS or one process, their flags, the digits data, the loopback
byte counter and the lines and stats they print.

The lines are read by others: "digits: ... steps/epoch" and "epoch N/M ... test acc" by
benchmarks/bench_network.py, "final test accuracy: ... parameter digest D" by it and the cluster
tests, --stats-json by scripts/demo.py and tests/cluster/test_torch_train.py.

The examples run as scripts, by path, and import this module as `from example import common`
(example/__init__.py says how). It imports no framework (the MXNet example runs in its own
environment).
"""
import argparse
import importlib
import json
import os
import time

import numpy as np

COMPRESSORS = ("env", "none", "fp16", "thc")


class Single:
    """Stands in for byteps.<framework> when no launcher started us: one worker, no BytePS."""

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
    def local_rank():
        return 0

    @staticmethod
    def shutdown():
        pass


def start(framework):
    """byteps.<framework> (e.g. "torch"), initialised, under a BytePS launcher (DMLC_ROLE set);
    else `Single`. Returns (bps, distributed)."""
    if "DMLC_ROLE" in os.environ:
        bps = importlib.import_module("byteps." + framework)
    else:
        bps = Single
        print("no DMLC_ROLE: running in this process only (use bpslaunch --local N for BytePS)")
    bps.init()
    return bps, bps is not Single


# ------------------------------------------------------------------------------------------------
# Flags
# ------------------------------------------------------------------------------------------------
def add_compressor_args(p, choices=COMPRESSORS):
    p.add_argument("--compressor", choices=choices, default="env",
                   help="env (default): what bpslaunch --compressor chose")
    p.add_argument("--thc-bits", type=int, default=4)


def digits_parser(doc, compressors=COMPRESSORS):
    """The flags of every train_digits.py; an example adds its own to the parser returned."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=512,
                   help="hidden width; the default makes most bytes large, compressible tensors")
    add_compressor_args(p, compressors)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats-json", metavar="PATH", help="rank 0 writes its measurements here")
    return p


def benchmark_parser(doc, models):
    """The flags of every benchmark_synthetic.py."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", choices=sorted(models), default="resnet50")
    p.add_argument("--batch-size", type=int, default=4, help="per worker")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-warmup", type=int, default=2)
    p.add_argument("--num-iters", type=int, default=10)
    add_compressor_args(p)
    return p


def choose_compression(bps, args, from_env=None):
    """The compression --compressor names: for env, what `from_env()` returns (None: nothing,
    which leaves the choice to what bpslaunch --compressor set); THC with --thc-bits; else
    bps.Compression.<name>."""
    if args.compressor == "env":
        return from_env() if from_env else None
    if args.compressor == "thc":
        return bps.Compression.thc(bits=args.thc_bits)
    return getattr(bps.Compression, args.compressor)


def chosen_compressor(args):
    """The compressor's name, as --stats-json records it."""
    if args.compressor == "env":
        return os.environ.get("BYTEPS_COMPRESSOR", "none")
    return args.compressor


# ------------------------------------------------------------------------------------------------
# Data and measurements
# ------------------------------------------------------------------------------------------------
def load_digits_split(seed=0):
    """Standardised digits, split 80/20 the same way on every worker."""
    from sklearn.datasets import load_digits  # only the digits examples need scikit-learn
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-3
    return ((x_tr - mean) / std, y_tr), ((x_te - mean) / std, y_te)


def shard(train, rank, size, batch_size):
    """This worker's part of the training set, and the steps per epoch: the smallest shard's, so
    that every worker makes the same number of steps."""
    x, y = train
    return x[rank::size], y[rank::size], (len(y) // size) // batch_size


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


def wire_stats(tx0, tx1, steps):
    """The loopback bytes sent between two loopback_tx_bytes() readings, in all and per step."""
    wire = (tx1 - tx0) if tx0 is not None and tx1 is not None else None
    return {"loopback_tx_bytes": wire,
            "bytes_per_step": (wire / steps) if wire is not None and steps else None}


def finish(bps, args, result):
    """Every worker prints its final line (the tests compare the workers' digests); rank 0
    writes `result` and the run's settings to --stats-json; then BytePS shuts down."""
    print(f"final test accuracy: {result['accuracy']:.4f}  ({result['steps']} steps, "
          f"{result['seconds']:.1f}s)  parameter digest {result['digest']}", flush=True)
    if bps.rank() == 0 and args.stats_json:
        stats = dict(result, compressor=chosen_compressor(args), workers=bps.size())
        with open(args.stats_json, "w") as f:
            json.dump(stats, f, indent=1)
    bps.shutdown()
    return 0


# ------------------------------------------------------------------------------------------------
# Synthetic benchmarks
# ------------------------------------------------------------------------------------------------
def print_model(args, n_params, size, compression):
    print(f"{args.model}: {n_params / 1e6:.1f} M parameters ({n_params * 4 / 2**20:.0f} MiB "
          f"float32), batch {args.batch_size}/worker, {args.image_size}px, {size} worker(s), "
          f"compression {compression}", flush=True)


def benchmark(bps, distributed, args, step, compression, n_params):
    """--num-warmup untimed calls of `step`, then --num-iters timed ones; rank 0 prints each one's
    rate and the RESULT line (with the loopback bytes per step under BytePS). Then BytePS shuts
    down."""
    rank, size = bps.rank(), bps.size()
    for _ in range(args.num_warmup):
        step()
    tx0, t0 = loopback_tx_bytes(), time.perf_counter()
    for i in range(args.num_iters):
        ts = time.perf_counter()
        step()
        if rank == 0:
            rate = args.batch_size / (time.perf_counter() - ts)
            print(f"iter {i + 1}/{args.num_iters}: {rate:.2f} samples/s per worker", flush=True)
    seconds = time.perf_counter() - t0
    per_step = wire_stats(tx0, loopback_tx_bytes(), args.num_iters)["bytes_per_step"]
    if rank == 0:
        per_worker = args.batch_size * args.num_iters / seconds
        line = (f"RESULT model={args.model} compression={compression} workers={size} "
                f"samples/s per worker={per_worker:.2f} total={per_worker * size:.2f}")
        if distributed and per_step is not None:
            # every worker pushes and pulls: uncompressed is about 2 x workers x the model
            line += (f" loopback bytes/step={per_step:.0f} "
                     f"({per_step / (n_params * 4):.3f} x the float32 model size, all workers' "
                     "pushes and pulls)")
        print(line, flush=True)
    bps.shutdown()
    return 0
