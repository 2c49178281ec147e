"""A TensorFlow worker for tests/cluster/test_failures.py: workers that declare THC with different
`bits` (rank 0: 4, rank 1: 3) must get a catchable TensorFlow error, in eager code and in
model.fit, and the process goes on; so must a tensor declared with compressor kwargs that name no
registered compressor (style badkwargs-declare, badkwargs-pushpull).

    tf_failures.py OUT_DIR
Writes OUT_DIR/<style>_<rank>.txt with the exception's class and message for style in eager, fit.
"""
import sys

import failures  # tests/cluster/scripts/failures.py
import keras
import numpy as np
import tensorflow as tf

import byteps.tensorflow as bps
from byteps_thc import tensorflow as bt

bps.init()
rank = bps.rank()
thc = bps.Compression.thc(bits=4 if rank == 0 else 3)
caught = failures.catcher(sys.argv[1], rank,
                          (tf.errors.InvalidArgumentError, tf.errors.InternalError),
                          lambda e: e.message)


# eager: one push_pull of a THC tensor (64 Ki floats, above BYTEPS_MIN_COMPRESS_BYTES)
ok = caught("eager", lambda: bps.push_pull(tf.ones([1 << 16]), name="eager.big",
                                          compression=thc, average=True).numpy())

# model.fit: the DistributedOptimizer's gradients
model = keras.Sequential([keras.Input((128,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(10)], name="fitmlp")
opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=thc)
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=False)
rng = np.random.default_rng(rank)
x, y = rng.standard_normal((64, 128)).astype(np.float32), rng.integers(0, 10, 64)
ok = caught("fit", lambda: model.fit(x, y, batch_size=32, epochs=1, verbose=0)) and ok

# compressor kwargs that name no registered compressor: the declare raises, and so does every
# push_pull of that name (it declares the name again)
ok = caught("badkwargs-declare", lambda: bt.declare("badkw", {"compressor_type": "thx"})) and ok
ok = caught("badkwargs-pushpull", lambda: bps.push_pull(tf.ones([1 << 16]), name="badkw",
                                                        average=False).numpy()) and ok

# the process goes on: an uncompressed push_pull still works
after = bps.push_pull(tf.ones([4]), name="after", average=False).numpy().tolist()
print(f"rank {rank}: after {after}", flush=True)
if not ok:
    raise SystemExit("a THC push_pull with mismatched bits, or a declare with unknown compressor "
                     "kwargs, did not raise")
