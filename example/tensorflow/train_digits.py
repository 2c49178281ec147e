"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with BytePS
and TensorFlow 2 / Keras 3, in one of three styles.

    bpslaunch --local 2 --compressor thc -- python example/tensorflow/train_digits.py --mode fit
    bpslaunch --local 2 --compressor thc -- python example/tensorflow/train_digits.py \
        --mode function
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
import hashlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf

from example import common
from example.common import load_digits_split  # tests/cluster/test_tf_train.py calls it here

MODES = ("eager", "function", "fit")


def parse_args(argv=None):
    p = common.digits_parser(__doc__)
    p.add_argument("--mode", choices=MODES, default="function")
    p.add_argument("--threads", type=int, default=0, help="TF intra-op threads (0: TF's default)")
    return p.parse_args(argv)


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


def train(bps, args, mode, compression, data, name="mlp", log=print):
    """Train one model in `mode`; returns a dict with accuracy, digest, steps, seconds."""
    x_te, y_te = data[1]
    rank, size = bps.rank(), bps.size()
    distributed = size > 1 or bps is not common.Single
    xs, ys, steps_per_epoch = common.shard(data[0], rank, size, args.batch_size)
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
    bps, distributed = common.start("tensorflow")
    rank, size = bps.rank(), bps.size()
    data = load_digits_split(args.seed)
    compression = (common.choose_compression(bps, args, bps.Compression.from_env)
                   if distributed else None)
    if rank == 0:
        shown = repr(compression) if compression is not None else "none"
        print(f"digits: {len(data[0][1])} training and {len(data[1][1])} test images, "
              f"{size} worker(s), mode {args.mode}, batch {args.batch_size} per worker, "
              f"MLP 64-{args.hidden}-{args.hidden}-10, compression {shown}", flush=True)
    tx0 = common.loopback_tx_bytes()
    result = train(bps, args, args.mode, compression, data,
                   log=lambda line: print(line, flush=True))
    result.update(common.wire_stats(tx0, common.loopback_tx_bytes(), result["steps"]))
    return common.finish(bps, args, result)


if __name__ == "__main__":
    sys.exit(main())
