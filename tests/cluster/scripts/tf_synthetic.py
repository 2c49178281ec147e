"""A synthetic-data TensorFlow 2 / Keras 3 benchmark written the way BytePS's and Horovod's
examples are: `bps.DistributedGradientTape` in a custom loop (--api tape) or
`bps.DistributedOptimizer` with model.fit (--api fit), passing `compression=bps.Compression.none`
explicitly (or `.fp16` with --fp16-pushpull). It knows nothing of byteps-thc;
tests/cluster/test_compressor_flag.py runs it under `bpslaunch --compressor ...`.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import synthetic  # tests/cluster/scripts/synthetic.py
import tensorflow as tf

import byteps.tensorflow as bps

parser = synthetic.parser("TensorFlow synthetic benchmark")
parser.add_argument("--api", choices=("tape", "fit"), default="tape",
                    help="DistributedGradientTape in a tf.function, or DistributedOptimizer + fit")
args = parser.parse_args()

bps.init()
keras.utils.set_random_seed(1234)
model = keras.Sequential([keras.Input((args.input_size,)),
                          keras.layers.Dense(args.hidden, activation="relu"),
                          keras.layers.Dense(args.hidden, activation="relu"),
                          keras.layers.Dense(10)])
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none
data = tf.random.normal((args.batch_size, args.input_size), seed=1)
target = tf.random.uniform((args.batch_size,), 0, 10, dtype=tf.int64, seed=2)


log = synthetic.rank0_log(bps)
log(f"Model: MLP {args.input_size}-{args.hidden}-{args.hidden}-10, batch size {args.batch_size}, "
    f"{bps.size()} workers, API {args.api}")
steps = args.num_warmup_batches + args.num_batches_per_iter * args.num_iters
if args.api == "tape":
    opt = keras.optimizers.SGD(0.01)
    bps.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def benchmark_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = bps.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    synthetic.timed_iters(lambda: benchmark_step().numpy(), args, log)
    log(f"final loss {float(benchmark_step()):.4f}")
else:
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=compression)
    model.compile(optimizer=opt, loss=loss_fn, jit_compile=False)
    x = tf.tile(data, (steps, 1))
    y = tf.tile(target, (steps,))
    history = model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False,
                        callbacks=[bps.BroadcastGlobalVariablesCallback(0)],
                        verbose=2 if bps.rank() == 0 else 0)
    log(f"final loss {history.history['loss'][-1]:.4f}")
bps.shutdown()
