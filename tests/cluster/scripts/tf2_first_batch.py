"""A TensorFlow 2 synthetic benchmark in the shape of BytePS's and Horovod's TF2 examples: the
train step is a tf.function that pushes its gradients through `bps.DistributedGradientTape` and,
on its first batch only, broadcasts the model's and the optimizer's variables from rank 0 inside
the function (`if first_batch:`). Each step also sums a constant over the workers
(`bps.push_pull(tf.constant(...))`), as a script counting its workers would.

It knows nothing of byteps-thc: `compression=bps.Compression.none` is upstream's boilerplate, and
`bpslaunch --compressor thc` decides. Each worker starts from its own random weights (seeded by
its rank), so only the broadcast makes them agree. At the end every worker prints

    workers summed: <the constant's sums, one per step>
    parameter digest <sha256 of every model and optimizer variable's bytes>

tests/cluster/test_tf_upstream_api.py runs it (--mode function: the step traced; eager: the same
step run eagerly; --broadcast-step N: the broadcast on step N instead of the first).
"""
import argparse
import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import synthetic  # tests/cluster/scripts/synthetic.py
import tensorflow as tf

import byteps.tensorflow as bps

parser = argparse.ArgumentParser(description="TF2 benchmark, broadcast on the first batch",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--mode", choices=("function", "eager"), default="function")
parser.add_argument("--broadcast-step", type=int, default=0)
parser.add_argument("--steps", type=int, default=12)
synthetic.model_args(parser)
args = parser.parse_args()

bps.init()
keras.utils.set_random_seed(1000 + bps.rank())  # different weights on every worker
model = keras.Sequential([keras.Input((args.input_size,)),
                          keras.layers.Dense(args.hidden, activation="relu"),
                          keras.layers.Dense(args.hidden, activation="relu"),
                          keras.layers.Dense(10)])
opt = keras.optimizers.SGD(0.01, momentum=0.9)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
data = tf.random.stateless_normal((args.batch_size, args.input_size), seed=(1, 2))
target = tf.random.stateless_uniform((args.batch_size,), (3, 4), 0, 10, dtype=tf.int64)


def benchmark_step(first_batch):
    compression = bps.Compression.none
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    tape = bps.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    # after the first step, so that the optimizer's variables exist (upstream's note)
    if first_batch:
        bps.broadcast_variables(model.variables, root_rank=0)
        bps.broadcast_variables(opt.variables, root_rank=0)
    workers = bps.push_pull(tf.constant(1.0), name="workers", average=False)
    return loss, workers


if args.mode == "function":
    benchmark_step = tf.function(benchmark_step)

summed = []
for step in range(args.steps):
    loss, workers = benchmark_step(step == args.broadcast_step)
    summed.append(float(workers))
    if bps.rank() == 0:
        print(f"step {step}: loss {float(loss):.4f}", flush=True)

digest = hashlib.sha256()
for v in list(model.variables) + list(opt.variables):
    digest.update(v.numpy().tobytes())
print("workers summed: " + " ".join(f"{s:g}" for s in summed), flush=True)
print(f"parameter digest {digest.hexdigest()[:16]}", flush=True)
bps.shutdown()
