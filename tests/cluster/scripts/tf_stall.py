"""A TensorFlow worker for tests/cluster/test_tf_upstream_api.py: a stalled peer, then a failed
cluster.

    tf_stall.py DELAY OUT_DIR

Stalls: worker 1 holds back its push of a tensor for DELAY seconds (run with
BYTEPS_THC_STALL_WARN well under DELAY) while worker 0 waits for it, three ways: a new tensor's
first push (BytePS's blocking InitTensor), a later push of a known tensor (eager), and a gradient
of a DistributedGradientTape inside tf.function. Worker 0's log must name each of them.

Failure (byteps_thc.tensorflow.fail_cluster / cluster_failure): worker 0 pushes a tensor that
worker 1 never pushes and fails its cluster 2 s later; worker 1 fails its own after DELAY. Every
push_pull in flight and every later one raises InternalError with the reason. Writes
OUT_DIR/<what>_<rank>.txt: the exception (pending, later) and the reason cluster_failure() gave.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import failures  # tests/cluster/scripts/failures.py
import keras
import tensorflow as tf

import byteps.tensorflow as bps
from byteps_thc import tensorflow as bt

bps.init()
rank = bps.rank()
delay, out_dir = float(sys.argv[1]), sys.argv[2]


def stall():
    """Worker 1 arrives DELAY seconds after worker 0 (both in step at the previous push_pull)."""
    if rank == 1:
        time.sleep(delay)


def push(name, n=1000):
    return bps.push_pull(tf.ones([n]), name=name, average=False).numpy()


push("warm")
stall()
push("stall.first")          # a new tensor: worker 0 waits in the blocking first push
push("stall.again")
stall()
push("stall.again")          # a known tensor: worker 0 waits in the pipeline

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32), keras.layers.Dense(4)],
                         name="stallnet")
opt = keras.optimizers.SGD(0.01)
x, y = tf.random.stateless_normal((8, 64), (1, 2)), tf.zeros((8,), tf.int64)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    tape = bps.DistributedGradientTape(tape)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))
    return loss


step()
push("sync")
stall()
step()                       # worker 0's traced step waits for worker 1's gradients
push("sync")
print(f"rank {rank}: stalls done", flush=True)


caught = failures.catcher(out_dir, rank, tf.errors.InternalError, text=lambda e: e.message)
failures.fail_cluster_twice(rank, delay, push, bt.fail_cluster, bt.cluster_failure, caught,
                            out_dir)
