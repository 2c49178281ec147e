"""byteps_thc.tensorflow without a BytePS build: `compression=Compression.none` on the tape and the
Keras 3 optimizer takes the launcher's compressor (BYTEPS_COMPRESSOR=thc), an explicit fp16 stays
with one warning, and rank 0 prints the in-force line once. Against a stand-in for
byteps.tensorflow.ops that records the declares.

Runs in a subprocess (TensorFlow and PyTorch are not loaded into one process). Skipped without
TensorFlow.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed")

SCRIPT = r'''
import os, warnings
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import keras
from byteps_thc import tensorflow as btf

declared = {}

class FakeOps:
    class C_LIB:
        @staticmethod
        def byteps_push_pull(tensor, name=None, input_name=None, average=False):
            return tensor if average else tensor * tf.cast(2, tensor.dtype)

    class TF_LIB_CTYPES:
        @staticmethod
        def byteps_tensorflow_declare_tensor_kwargs(name, n, keys, vals):
            declared[name.value.decode()] = {keys[i].decode(): vals[i].decode()
                                             for i in range(n.value)}
            return 0

    size = staticmethod(lambda: 2)
    rank = staticmethod(lambda: 0)

btf.core._ops = lambda: FakeOps
thc = btf.Compression.thc(seed=7)   # what BYTEPS_COMPRESSOR=thc BYTEPS_THC_SEED=7 chose

def layer(name):                     # kernel 256x128 float32 = 128 KiB: compressed; bias: not
    d = keras.layers.Dense(128, name=name)
    d.build((None, 256))
    return d

x = tf.ones([2, 256])

# DistributedGradientTape(compression=Compression.none): the launcher's THC
a = layer("a")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a(x))
    tape = btf.DistributedGradientTape(tape, compression=btf.Compression.none)
    tape.gradient(loss, a.trainable_variables)
assert caught == [], [str(w.message) for w in caught]
assert declared["Gradient.a/kernel"] == thc.config.to_kwargs(), declared
assert declared["Gradient.a/bias"] == {}

# DistributedOptimizer(compression=Compression.none), a custom step: the launcher's THC
b = layer("b")
opt = btf.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=btf.Compression.none)
assert opt._bps_compression == thc
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(b(x))
opt.apply_gradients(zip(tape.gradient(loss, b.trainable_variables), b.trainable_variables))
assert declared["Gradient.b/kernel"] == thc.config.to_kwargs(), declared

# an explicit fp16 stays; one warning, though the tape is made at every step
c = layer("c")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(c(x))
        tape = btf.DistributedGradientTape(tape, compression=btf.Compression.fp16)
        tape.gradient(loss, c.trainable_variables)
assert declared["Gradient.c/kernel"] == {}
assert len(caught) == 1 and caught[0].filename == __file__, [str(w.message) for w in caught]
assert "the script chose Compression.fp16, the environment (BYTEPS_COMPRESSOR=thc) chose " \
       "Compression.thc(" in str(caught[0].message)
print("TF CHOICE OK")
'''


def test_tf_compression_none_takes_the_launchers_choice(tmp_path):
    script = tmp_path / "tf_choice.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYTEPS_")}
    env.update(PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow", TF_NUM_INTRAOP_THREADS="1",
               TF_NUM_INTEROP_THREADS="2", BYTEPS_COMPRESSOR="thc", BYTEPS_THC_SEED="7")
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=420)
    assert p.returncode == 0 and "TF CHOICE OK" in p.stdout, p.stdout[-3000:] + p.stderr[-5000:]
    lines = [line for line in p.stderr.splitlines() if line.startswith("byteps-thc: compressor")]
    # once, at the first declare (the tape's two gradients), not for the later lists
    assert len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith("byteps-thc: compressor THC bits=4 granularity=30")
    assert "seed=7" in lines[0]
    assert "chosen by the environment (BYTEPS_COMPRESSOR=thc); 2 gradient tensors: 1 compressed, " \
           "1 under BYTEPS_MIN_COMPRESS_BYTES=65536 go uncompressed" in lines[0]
