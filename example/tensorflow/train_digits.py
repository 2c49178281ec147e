"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with BytePS
and TensorFlow 2 / Keras 3, in one of three styles.

    bpslaunch --local 2 --compressor thc -- python example/tensorflow/train_digits.py --mode fit
    bpslaunch --local 2 --compressor thc -- python example/tensorflow/train_digits.py --mode function
    bpslaunch --local 2 -- python example/tensorflow/train_digits.py --mode eager    # uncompressed

--mode eager:    a Python loop, bps.DistributedGradientTape, the optimizer applied eagerly;
--mode function: the same step as one tf.function;
--mode fit:      Keras model.fit with bps.DistributedOptimizer and BroadcastGlobalVariablesCallback.

Every worker trains on its own shard of the training set; gradients are averaged by BytePS, with
whatever compression `bpslaunch --compressor` chose (or `--compressor` here, which overrides it,
except `--compressor none`: like upstream's `Compression.none`, it leaves the choice to bpslaunch).
Prints per-epoch progress and the final test accuracy and a digest of the weights (equal on all
workers). `--stats-json` writes what rank 0 measured. Without a BytePS launcher (no DMLC_ROLE) it
trains in this one process, uncompressed.
"""
import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

MODES = ("eager", "function", "fit")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="function")
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
    p.add_argument("--threads", type=int, default=0, help="TF intra-op threads (0: TF's default)")
    p.add_argument("--stats-json", metavar="PATH", help="rank 0 writes its measurements here")
    return p.parse_args(argv)


def load_digits_split(seed=0):
    """Standardised digits, split 80/20 the same way on every worker (as the PyTorch example)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-3
    return ((x_tr - mean) / std, y_tr), ((x_te - mean) / std, y_te)


def make_model(hidden, name="mlp"):
    keras.utils.set_random_seed(1234)  # every worker starts alike; the broadcast makes sure
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(10)], name=name)


def weights_digest(model):
    h = hashlib.sha256()
    for v in sorted(model.weights, key=lambda v: v.path):
        h.update(v.path.encode())
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()[:16]


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


class Single:
    """Stands in for byteps.tensorflow when no launcher started us."""
    Compression = None

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


def choose_compression(bps, args):
    if args.compressor == "env":
        return bps.Compression.from_env()  # what bpslaunch --compressor chose
    if args.compressor == "thc":
        return bps.Compression.thc(bits=args.thc_bits)
    return getattr(bps.Compression, args.compressor)


def train(bps, args, mode, compression, data, name="mlp", log=print):
    """Train one model in `mode`; returns a dict with accuracy, digest, steps, seconds."""
    (x_tr, y_tr), (x_te, y_te) = data
    rank, size = bps.rank(), bps.size()
    distributed = size > 1 or bps is not Single
    n_train = len(y_tr)
    xs, ys = x_tr[rank::size], y_tr[rank::size]                # this worker's shard
    steps_per_epoch = (n_train // size) // args.batch_size    # the same on every worker
    model = make_model(args.hidden, name)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def accuracy():
        logits = model(x_te, training=False)
        return float(np.mean(np.argmax(keras.ops.convert_to_numpy(logits), 1) == y_te))

    t0 = time.perf_counter()
    if mode == "fit":
        opt = keras.optimizers.SGD(args.lr, momentum=args.momentum)
        if distributed:
            opt = bps.DistributedOptimizer(opt, compression=compression)
        model.compile(optimizer=opt, loss=loss_fn, metrics=["accuracy"], jit_compile=False)
        ds = (tf.data.Dataset.from_tensor_slices((xs, ys))
              .shuffle(len(ys), seed=args.seed + 1000 * rank, reshuffle_each_iteration=True)
              .repeat().batch(args.batch_size, drop_remainder=True))

        class Progress(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                log(f"[{mode}] epoch {epoch + 1:2d}/{args.epochs}  loss {logs['loss']:.4f}  "
                    f"train acc {logs['accuracy']:.4f}  test acc {accuracy():.4f}")
        callbacks = [Progress()]
        if distributed:
            callbacks.insert(0, bps.BroadcastGlobalVariablesCallback(0))
        model.fit(ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch, verbose=0,
                  callbacks=callbacks)
    else:
        opt = keras.optimizers.SGD(args.lr, momentum=args.momentum)
        opt.build(model.trainable_variables)
        if distributed:
            bps.broadcast_variables(model.variables, root_rank=0)
            bps.broadcast_variables(opt.variables, root_rank=0)

        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            if distributed:
                tape = bps.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))
            return loss, correct

        if mode == "function":
            step = tf.function(step)
        rng = np.random.default_rng(args.seed + 1000 * rank)
        for epoch in range(1, args.epochs + 1):
            order = rng.permutation(len(ys))
            total, correct, seen = 0.0, 0, 0
            for s in range(steps_per_epoch):
                idx = order[s * args.batch_size:(s + 1) * args.batch_size]
                loss, c = step(tf.constant(xs[idx]), tf.constant(ys[idx]))
                total += float(loss) * len(idx)
                correct += int(c)
                seen += len(idx)
            log(f"[{mode}] epoch {epoch:2d}/{args.epochs}  loss {total / seen:.4f}  "
                f"train acc {correct / seen:.4f}  test acc {accuracy():.4f}")
    seconds = time.perf_counter() - t0
    return {"mode": mode, "accuracy": accuracy(), "digest": weights_digest(model),
            "steps": steps_per_epoch * args.epochs, "seconds": seconds,
            "trainable_variables": len(model.trainable_variables),
            "param_bytes": int(sum(np.prod(v.shape) * 4 for v in model.trainable_variables))}


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    distributed = "DMLC_ROLE" in os.environ
    if distributed:
        import byteps.tensorflow as bps
    else:
        bps = Single
        print("no DMLC_ROLE: training in this process only (use bpslaunch --local N for BytePS)")
    bps.init()
    rank, size = bps.rank(), bps.size()
    data = load_digits_split(args.seed)
    compression = choose_compression(bps, args) if distributed else None
    if rank == 0:
        shown = repr(compression) if compression is not None else "none"
        print(f"digits: {len(data[0][1])} training and {len(data[1][1])} test images, "
              f"{size} worker(s), mode {args.mode}, batch {args.batch_size} per worker, "
              f"MLP 64-{args.hidden}-{args.hidden}-10, compression {shown}", flush=True)
    tx0 = loopback_tx_bytes()
    result = train(bps, args, args.mode, compression, data,
                   log=lambda line: print(line, flush=True))
    tx1 = loopback_tx_bytes()
    print(f"final test accuracy: {result['accuracy']:.4f}  ({result['steps']} steps, "
          f"{result['seconds']:.1f}s)  parameter digest {result['digest']}", flush=True)
    if rank == 0 and args.stats_json:
        wire = (tx1 - tx0) if tx0 is not None and tx1 is not None else None
        result.update({"compressor": os.environ.get("BYTEPS_COMPRESSOR", "none")
                       if args.compressor == "env" else args.compressor, "workers": size,
                       "loopback_tx_bytes": wire,
                       "bytes_per_step": wire / result["steps"] if wire and result["steps"] else None})
        with open(args.stats_json, "w") as f:
            json.dump(result, f, indent=1)
    bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
