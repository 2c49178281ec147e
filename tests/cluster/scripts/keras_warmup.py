"""A Keras 3 training script in the shape of BytePS's and Horovod's Keras examples: model.fit with
`bps.DistributedOptimizer` and upstream's callbacks from `byteps.tensorflow.keras.callbacks`
(BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateWarmupCallback). It knows
nothing of byteps-thc: `compression=bps.Compression.none` is upstream's boilerplate and
`bpslaunch --compressor thc` decides.

Each worker starts from its own random weights (the broadcast makes them agree) and trains on its
own synthetic shard. At the end every worker prints

    rates: <the optimizer's learning rate at the start of every batch>
    lr logged: <logs["lr"] of every epoch>
    parameter digest <sha256 of every model variable's bytes>

tests/cluster/test_tf_upstream_api.py runs it.
"""
import argparse
import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import synthetic  # tests/cluster/scripts/synthetic.py

import byteps.tensorflow.keras as bps

parser = argparse.ArgumentParser(description="Keras 3 model.fit with upstream's callbacks",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--warmup-epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=4)
synthetic.model_args(parser)
args = parser.parse_args()

bps.init()
keras.utils.set_random_seed(2000 + bps.rank())
model = keras.Sequential([keras.Input((args.input_size,)),
                          keras.layers.Dense(args.hidden, activation="relu"),
                          keras.layers.Dense(10)])
# upstream scales the rate by the number of workers; the warmup starts from rate / size
opt = bps.DistributedOptimizer(keras.optimizers.SGD(args.lr * bps.size(), momentum=0.9),
                               compression=bps.Compression.none)
model.compile(optimizer=opt, jit_compile=False,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
rng = np.random.default_rng(bps.rank())
n = args.batch_size * args.steps_per_epoch
x = rng.standard_normal((n, args.input_size)).astype(np.float32)
y = rng.integers(0, 10, n)

rates = []


class RecordRate(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


callbacks = [bps.callbacks.BroadcastGlobalVariablesCallback(0),
             bps.callbacks.MetricAverageCallback(),
             bps.callbacks.LearningRateWarmupCallback(warmup_epochs=args.warmup_epochs,
                                                      initial_lr=args.lr * bps.size()),
             RecordRate()]
history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False,
                    callbacks=callbacks, verbose=2 if bps.rank() == 0 else 0)

digest = hashlib.sha256()
for v in model.variables:
    digest.update(keras.ops.convert_to_numpy(v).tobytes())
print("rates: " + " ".join(f"{r:.9g}" for r in rates), flush=True)
print("lr logged: " + " ".join(f"{r:.9g}" for r in history.history["lr"]), flush=True)
print(f"parameter digest {digest.hexdigest()[:16]}", flush=True)
bps.shutdown()
