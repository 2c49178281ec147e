"""The checks of byteps_thc.tensorflow that tests/unit/test_tf_adapter.py runs, one test each.

Run as `python tf_adapter_checks.py REPORT` in a process of its own, with TensorFlow and without
PyTorch: it runs every `check_*` function below in order and writes one JSON line per check to
REPORT, {"check": name, "error": null or the traceback}, as soon as it has run. It exits 0 when
every check ran, whatever their outcome.

No BytePS build: a stand-in for byteps.tensorflow.ops answers push_pull with 2 x the tensor, as
two workers holding the same tensors would sum, and with the tensor for average=True (the fork's
op averages itself). The checks share one process (TensorFlow and Keras
start once), the stand-in's records and the Keras model; Keras numbers layer names per process
(dense, dense_1, ...), so the checks run in this order.
"""
import json
import os
import sys
import traceback

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # before TensorFlow loads

import keras
import numpy as np
import tensorflow as tf

from byteps_thc import tensorflow as btf
from byteps_thc.thc.config import ThcConfig

# ---- stand-in for byteps.tensorflow.ops: two workers holding the same tensors ------------------
calls, declared = [], []


class FakeOps:
    class C_LIB:
        @staticmethod
        def byteps_push_pull(tensor, name=None, input_name=None, average=False):
            calls.append(input_name)
            return tensor if average else tensor * tf.cast(2, tensor.dtype)

    class TF_LIB_CTYPES:
        @staticmethod
        def byteps_tensorflow_declare_tensor_kwargs(name, n, keys, vals):
            kw = {keys[i].decode(): vals[i].decode() for i in range(n.value)}
            declared.append((name.value.decode(), kw))
            return 0

    @staticmethod
    def size():
        return 2

    @staticmethod
    def rank():
        return 0


btf.core._ops = lambda: FakeOps  # the adapter's one seam to the fork's ops

thc = btf.Compression.thc(bits=4)

# the model of the tape and model.fit checks: its layers are dense and dense_1
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(10)],
                         name="net")
x, y = tf.random.normal([8, 64], seed=1), tf.constant([1, 2, 3, 4, 5, 6, 7, 8]) % 10
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def grads(distributed):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    if distributed:
        tape = btf.DistributedGradientTape(tape, compression=thc)
    return tape.gradient(loss, model.trainable_variables)


# ---- compressors and kwargs ---------------------------------------------------------------------
def check_thc_kwargs_only_for_large_float_tensors():
    assert thc.kwargs(tf.zeros([512, 512])) == ThcConfig(bits=4).to_kwargs()
    assert thc.kwargs(tf.zeros([10])) is None                    # under BYTEPS_MIN_COMPRESS_BYTES
    assert thc.kwargs(tf.zeros([512, 512], tf.int32)) is None     # integers: never compressed


def check_compression_from_env():
    env = {"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3", "BYTEPS_THC_GRANULARITY": "14"}
    assert btf.Compression.from_env(env) == btf.Compression.thc(bits=3, granularity=14)
    assert btf.Compression.from_env({}) is btf.Compression.none
    try:
        btf.Compression.from_env({"BYTEPS_COMPRESSOR": "nope"})
        raise AssertionError("no error")
    except ValueError as e:
        assert "nope" in str(e)


def check_lhc_kwargs_and_from_env():
    lhc = btf.Compression.lhc(capacity=2048, topk=0.01)
    assert lhc.kwargs(tf.zeros([512, 512])) == lhc.config.to_kwargs()
    assert lhc.kwargs(tf.zeros([512, 512]))["compressor_type"] == "lhc"
    assert lhc.kwargs(tf.zeros([10])) is None                    # under BYTEPS_MIN_COMPRESS_BYTES
    env = {"BYTEPS_COMPRESSOR": "lhc", "BYTEPS_LHC_CAPACITY": "2048", "BYTEPS_LHC_TOPK": "0.01"}
    assert btf.Compression.from_env(env) == lhc


def check_compress_casts_and_decompress_restores_dtype():
    w, ctx = thc.compress(tf.ones([4], tf.bfloat16))
    assert w.dtype == tf.float32 and thc.decompress(w, ctx).dtype == tf.bfloat16
    w, ctx = btf.Compression.none.compress(tf.constant([True, False]))
    assert w.dtype == tf.int32 and btf.Compression.none.decompress(w, ctx).dtype == tf.bool


# ---- names: stable per variable, unique, in order of first use ----------------------------------
def check_variable_names_stable_and_unique():
    a, b = tf.Variable(tf.zeros([3]), name="w"), tf.Variable(tf.zeros([4]), name="w")
    assert btf.variable_name(a) == "w" and btf.variable_name(b) == "w_1"
    assert btf.variable_name(a) == "w"


def check_eager_push_pull_needs_a_name():
    try:
        btf.push_pull(tf.ones([3]))
        raise AssertionError("unnamed eager push_pull accepted")
    except ValueError as e:
        assert "name=" in str(e)


def check_push_pull_average_and_sum():
    out = btf.push_pull(tf.ones([3]), name="x", average=True)
    assert np.allclose(out.numpy(), 1.0)
    out = btf.push_pull(tf.ones([3], tf.int32), name="xi", op=btf.Sum)
    assert out.numpy().tolist() == [2, 2, 2]


# ---- DistributedGradientTape: eager and tf.function give the same names, once each -------------
# The eager tape's push_pulls run as one cached tf.function: the stand-in sees their names only
# in the first eager steps, which the first check records for the second.
names_eager = []


def check_tape_gradients_equal_plain_ones():
    plain = grads(False)
    calls.clear()
    for _ in range(3):
        eager = grads(True)
    names_eager[:] = calls
    for p, e in zip(plain, eager):
        np.testing.assert_allclose(p.numpy(), e.numpy(), rtol=1e-6)   # (2 g) / 2


def check_tape_names_same_eager_and_in_tf_function():
    assert names_eager, "no push_pull recorded by the first eager steps (tape_gradients_equal_...)"
    calls.clear()
    fn = tf.function(lambda: grads(True))
    for _ in range(3):
        fn()
    assert sorted(set(calls)) == sorted(set(names_eager)), (calls, names_eager)


def check_tape_declares_each_gradient_once():
    grads(True)
    tf.function(lambda: grads(True))()
    grad_names = [n for n, _ in declared if n.startswith("Gradient.net/")]
    assert len(grad_names) == 4, grad_names                          # one per variable, ever
    kw = dict(declared)
    assert kw["Gradient.net/dense/kernel"]["compressor_type"] == "thc"    # 64x512 float32
    assert kw["Gradient.net/dense/bias"] == {} or kw["Gradient.net/dense/bias"] is None or \
        "compressor_type" not in kw["Gradient.net/dense/bias"]


# ---- Keras 3 DistributedOptimizer: custom loop and model.fit -----------------------------------
# (the stand-in records a push_pull when it is traced: eager lists run as one cached tf.function)
def check_optimizer_is_the_keras_optimizer():
    opt = btf.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=thc)
    assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD)


def check_optimizer_applies_averaged_gradients():
    opt = btf.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=thc)
    net2 = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)], name="net2")
    before = [v.numpy() for v in net2.trainable_variables]
    g2 = [tf.ones_like(v) for v in net2.trainable_variables]
    calls.clear()
    opt.apply_gradients(zip(g2, net2.trainable_variables))
    assert calls == ["Gradient.net2/dense_2/kernel", "Gradient.net2/dense_2/bias"], calls
    for b0, v in zip(before, net2.trainable_variables):   # averaged gradient of ones: lr * 1
        np.testing.assert_allclose(v.numpy(), b0 - 0.1, rtol=1e-6)


def check_model_fit_traces_push_pull_once():
    model.compile(optimizer=btf.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=thc),
                  loss=loss_fn, jit_compile=False)
    calls.clear()
    hist = model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    assert len(calls) == 4, calls       # traced once: 4 push_pull ops, run every step
    assert np.isfinite(hist.history["loss"][-1])


def check_legacy_optimizer_refused():
    try:
        btf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        raise AssertionError("legacy optimizer accepted")
    except ValueError as e:
        assert "Keras 3" in str(e)


# ---- broadcast_variables: root's values (stand-in: root 0 pushes x, others zeros: 2x here) -----
def check_broadcast_variables_takes_roots_values():
    v = tf.Variable([1.5, -2.0])
    btf.broadcast_variables([v], root_rank=0)
    assert v.numpy().tolist() == [3.0, -4.0]


# ---- Keras 3 learning-rate callbacks (upstream's names; size() = 2 from the stand-in) -----------
def check_warmup_callback_sets_keras3_rate_and_corrects_momentum():
    from byteps_thc.tensorflow.callbacks import LearningRateWarmupCallback
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="warm")
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    net.compile(optimizer=opt, loss="mse", jit_compile=False)
    seen = []  # (epoch, batch, rate, velocity before the callback, velocity after it)

    class Before(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.v = [m.numpy().copy() for m in opt.momentums] if opt.built else None

    before = Before()

    class After(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            v = [m.numpy().copy() for m in opt.momentums] if opt.built else None
            seen.append((before.epoch, batch, float(opt.learning_rate.numpy()), before.v, v))

    warm = LearningRateWarmupCallback(warmup_epochs=1, initial_lr=0.1)
    xs = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    hist = net.fit(xs, xs[:, :3], batch_size=2, epochs=2, shuffle=False, verbose=0,
                   callbacks=[before, warm, After()])
    # the warmup's rate at batch b of epoch 0 (4 steps an epoch, 2 workers):
    # 0.1 / 2 * ((b + 1) / 4 * (2 - 1) / 1 + 1); from epoch 1 on it stays at 0.1
    want = [0.05 * ((b + 1) / 4 + 1) for b in range(4)] + [0.1] * 4
    got = [r for _, _, r, _, _ in seen]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert hist.history["lr"] == [np.float32(0.1).item()] * 2, hist.history
    # momentum correction: each change of the rate scales the velocity by new / old
    for (_, b, rate, v0, v1), prev in zip(seen[1:], got):
        if v0 is None:
            continue
        for a, c in zip(v0, v1):
            np.testing.assert_allclose(c, a * (rate / prev), rtol=1e-5, atol=1e-9)
    assert any(v0 is not None and np.any(v0[0]) for *_, v0, _ in seen[1:4])  # it was tested


def check_schedule_callback_refuses_a_schedule_rate():
    from byteps_thc.tensorflow.callbacks import LearningRateScheduleCallback
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="sched")
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    net.compile(optimizer=keras.optimizers.SGD(decay), loss="mse", jit_compile=False)
    try:
        net.fit(np.zeros((4, 4)), np.zeros((4, 3)), epochs=1, verbose=0,
                callbacks=[LearningRateScheduleCallback(0.5, initial_lr=0.1)])
        raise AssertionError("a schedule was accepted")
    except ValueError as e:
        assert "ExponentialDecay" in str(e) and "schedule" in str(e), e


CHECKS = [f for name, f in list(globals().items()) if name.startswith("check_")]


def main(report_path):
    with open(report_path, "w") as report:
        for check in CHECKS:
            try:
                check()
                error = None
            except Exception:
                error = traceback.format_exc()
            name = check.__name__[len("check_"):]
            report.write(json.dumps({"check": name, "error": error}) + "\n")
            report.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
