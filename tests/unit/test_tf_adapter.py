"""byteps_thc.tensorflow without a BytePS build: compressors, kwargs, names, the tape, the Keras 3
optimizer and model.fit against a stand-in for byteps.tensorflow.ops (push_pull = 2 x the tensor,
as two identical workers would sum).

Runs in a subprocess: TensorFlow and PyTorch are not loaded into one process. Skipped without
TensorFlow.
"""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed")

SCRIPT = r'''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
import keras
from byteps_thc import tensorflow as btf
from byteps_thc.config import ThcConfig

# ---- stand-in for byteps.tensorflow.ops: two workers holding the same tensors ----------------
calls, declared = [], []

class FakeOps:
    class C_LIB:
        @staticmethod
        def byteps_push_pull(tensor, name=None, input_name=None):
            calls.append(input_name)
            return tensor * tf.cast(2, tensor.dtype)

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

btf._ops = lambda: FakeOps

# ---- compressors and kwargs -------------------------------------------------------------------
thc = btf.Compression.thc(bits=4)
assert thc.kwargs(tf.zeros([512, 512])) == ThcConfig(bits=4).to_kwargs()
assert thc.kwargs(tf.zeros([10])) is None                    # under BYTEPS_MIN_COMPRESS_BYTES
assert thc.kwargs(tf.zeros([512, 512], tf.int32)) is None     # integers: never compressed
env = {"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3", "BYTEPS_THC_GRANULARITY": "14"}
assert btf.Compression.from_env(env) == btf.Compression.thc(bits=3, granularity=14)
assert btf.Compression.from_env({}) is btf.Compression.none
try:
    btf.Compression.from_env({"BYTEPS_COMPRESSOR": "nope"})
    raise AssertionError("no error")
except ValueError as e:
    assert "nope" in str(e)
w, ctx = thc.compress(tf.ones([4], tf.bfloat16))
assert w.dtype == tf.float32 and thc.decompress(w, ctx).dtype == tf.bfloat16
w, ctx = btf.Compression.none.compress(tf.constant([True, False]))
assert w.dtype == tf.int32 and btf.Compression.none.decompress(w, ctx).dtype == tf.bool

# ---- names: stable per variable, unique, in order of first use --------------------------------
a, b = tf.Variable(tf.zeros([3]), name="w"), tf.Variable(tf.zeros([4]), name="w")
assert btf.variable_name(a) == "w" and btf.variable_name(b) == "w_1"
assert btf.variable_name(a) == "w"
try:
    btf.push_pull(tf.ones([3]))
    raise AssertionError("unnamed eager push_pull accepted")
except ValueError as e:
    assert "name=" in str(e)
out = btf.push_pull(tf.ones([3]), name="x", average=True)
assert np.allclose(out.numpy(), 1.0)
out = btf.push_pull(tf.ones([3], tf.int32), name="xi", op=btf.Sum)
assert out.numpy().tolist() == [2, 2, 2]

# ---- DistributedGradientTape: eager and tf.function give the same names, once each -----------
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

plain = grads(False)
calls.clear()
for _ in range(3):
    eager = grads(True)
names_eager = list(calls)
for p, e in zip(plain, eager):
    np.testing.assert_allclose(p.numpy(), e.numpy(), rtol=1e-6)   # (2 g) / 2
calls.clear()
fn = tf.function(lambda: grads(True))
for _ in range(3):
    fn()
assert sorted(set(calls)) == sorted(set(names_eager)), (calls, names_eager)
grad_names = [n for n, _ in declared if n.startswith("Gradient.net/")]
assert len(grad_names) == 4, grad_names                          # one per variable, ever
kw = dict(declared)
assert kw["Gradient.net/dense/kernel"]["compressor_type"] == "thc"    # 64x512 float32
assert kw["Gradient.net/dense/bias"] == {} or kw["Gradient.net/dense/bias"] is None or \
    "compressor_type" not in kw["Gradient.net/dense/bias"]

# ---- Keras 3 DistributedOptimizer: custom loop and model.fit ---------------------------------
# (the stand-in records a push_pull when it is traced: eager lists run as one cached tf.function)
opt = btf.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=thc)
assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD)
net2 = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)], name="net2")
before = [v.numpy() for v in net2.trainable_variables]
g2 = [tf.ones_like(v) for v in net2.trainable_variables]
calls.clear()
opt.apply_gradients(zip(g2, net2.trainable_variables))
assert calls == ["Gradient.net2/dense_2/kernel", "Gradient.net2/dense_2/bias"], calls
for b0, v in zip(before, net2.trainable_variables):   # averaged gradient of ones: lr * 1
    np.testing.assert_allclose(v.numpy(), b0 - 0.1, rtol=1e-6)
model.compile(optimizer=btf.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=thc),
              loss=loss_fn, jit_compile=False)
calls.clear()
hist = model.fit(x, y, epochs=2, batch_size=4, verbose=0)
assert len(calls) == 4, calls       # traced once: 4 push_pull ops, run every step
assert np.isfinite(hist.history["loss"][-1])
try:
    btf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    raise AssertionError("legacy optimizer accepted")
except ValueError as e:
    assert "Keras 3" in str(e)

# ---- broadcast_variables: root's values (stand-in: root 0 pushes x, others zeros: 2x here) ---
v = tf.Variable([1.5, -2.0])
btf.broadcast_variables([v], root_rank=0)
assert v.numpy().tolist() == [3.0, -4.0]
print("TF ADAPTER OK")
'''


def test_tf_adapter_against_stand_in_ops(tmp_path):
    script = tmp_path / "tf_adapter.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2")
    env.pop("BYTEPS_COMPRESSOR", None)
    p = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=420)
    assert p.returncode == 0 and "TF ADAPTER OK" in p.stdout, p.stdout[-3000:] + p.stderr[-5000:]
