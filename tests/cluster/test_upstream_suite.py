"""Upstream BytePS's own tests, run from the pinned sdist against the fork.

The sdist (`.cache/byteps/dist/byteps-0.2.5.post15.tar.gz`, which `make byteps` downloads and
checks) ships upstream's tests/. Each test file is read from the sdist when the test runs (never
copied into this repository) and changed only by the named transformations listed in CHANGES
below, each one for a GPU, a download or an API that TensorFlow 2.21 / Keras 3 removed. A
transformation whose text the file no longer contains exactly `count` times fails the test,
so a changed sdist cannot silently run something else.

What runs where:
- test_tensorflow_keras.py: here, in `make test` (TensorFlow and the fork's TF plugin), on a
  `bpslaunch --local 2` cluster (upstream's run_byteps_test.sh ran it on one worker with
  BYTEPS_FORCE_DISTRIBUTED=1; with two, its push_pulls reach the server). Upstream's file runs
  test_train_model from its __main__; the runner below runs test_sparse_as_dense as well. Both
  say "No assertions, we just need to verify that it doesn't hang": the run is bounded in time
  and must exit 0 on both workers.
- test_mxnet.py, test_onebit.py, test_topk.py, test_randomk.py, test_dithering.py (with
  meta_test.py and utils.py): MXNet's, `make test-mxnet`; not run yet (docs/UPSTREAM.md says why).
"""
import os
import sys
import tarfile
from typing import NamedTuple

import pytest

from test_launch_local import ROOT, bpslaunch

SDIST = os.path.join(ROOT, ".cache", "byteps", "dist", "byteps-0.2.5.post15.tar.gz")
TESTS = "byteps-0.2.5.post15/tests/"


class Change(NamedTuple):
    name: str
    why: str
    old: str
    new: str
    count: int = 1


# test_tensorflow_keras.py was written for TF 1 (sessions) and Keras 2
KERAS_CHANGES = [
    Change("keras-module",
           "TF 2.16+'s tensorflow.keras is a partial Keras 3 alias (no losses.mean_squared_error)",
           "from tensorflow import keras", "import keras"),
    Change("keras-backend-module",
           "TF 2.16+ has no tensorflow.python.keras; Keras 3's backend module replaces it",
           "from tensorflow.python.keras import backend as K",
           "from keras import backend as K"),
    Change("tf1-session-config",
           "tf.ConfigProto (a TF 1 session's GPU options) is gone, and the test needs no GPU",
           "        self.config = tf.ConfigProto()\n"
           "        self.config.gpu_options.allow_growth = True\n"
           "        self.config.gpu_options.visible_device_list = str(bps.local_rank())\n",
           ""),
    Change("tf1-test-session",
           "TF 2 runs eagerly: no test_session, no K.set_session (the body runs as it is)",
           "        with self.test_session(config=self.config) as sess:\n"
           "            K.set_session(sess)\n",
           "        if True:  # byteps-thc: TF 2 has no session\n", count=2),
    Change("keras3-learning-rate",
           "Keras 3 optimizers take learning_rate=, not lr=",
           "keras.optimizers.RMSprop(lr=0.0001)",
           "keras.optimizers.RMSprop(learning_rate=0.0001)", count=2),
    Change("keras3-thresholded-relu",
           "Keras 3 removed ThresholdedReLU; ReLU(threshold=) is the same function",
           "keras.layers.ThresholdedReLU(0.5)", "keras.layers.ReLU(threshold=0.5)"),
    Change("keras3-no-sample-weight-mode",
           "Keras 3's compile() has no sample_weight_mode (per-timestep weights are implicit)",
           ",\n                          sample_weight_mode='temporal')", ")"),
    Change("keras3-fit-generator",
           "Keras 3 removed fit_generator (fit takes generators) and fit's workers=",
           "model.fit_generator(generator(),", "model.fit(generator(),"),
    Change("keras3-fit-no-workers", "Keras 3's fit() has no workers=",
           "                                workers=4,\n", ""),
    Change("keras3-embedding-input-length", "Keras 3's Embedding has no input_length=",
           "keras.layers.Embedding(1000, 64, input_length=10)",
           "keras.layers.Embedding(1000, 64)"),
]

KERAS_RUNNER = """
import sys
sys.path.insert(0, %(dir)r)
import test_tensorflow_keras as t
keras_test = t.TfKerasTests()
keras_test.test_train_model()
keras_test.test_sparse_as_dense()
print("upstream keras tests done", flush=True)
"""


def sdist_test(name):
    """The text of upstream's tests/<name> in the pinned sdist."""
    if not os.path.exists(SDIST):
        pytest.skip(f"the pinned sdist is not downloaded ({SDIST}; make byteps)")
    with tarfile.open(SDIST) as tar:
        return tar.extractfile(TESTS + name).read().decode()


def transform(text, changes):
    for c in changes:
        found = text.count(c.old)
        assert found == c.count, (f"transformation {c.name!r}: expected {c.count} occurrence(s) "
                                  f"of {c.old!r} in upstream's test, found {found}")
        text = text.replace(c.old, c.new)
    return text


def test_every_transformation_names_its_reason():
    for c in KERAS_CHANGES:
        assert c.name and c.why and c.old != c.new, c


@pytest.mark.needs_tf
@pytest.mark.needs_fork("server", "tensorflow")
def test_upstream_tensorflow_keras_tests(tmp_path):
    (tmp_path / "test_tensorflow_keras.py").write_text(
        transform(sdist_test("test_tensorflow_keras.py"), KERAS_CHANGES))
    runner = tmp_path / "run_keras_tests.py"
    runner.write_text(KERAS_RUNNER % {"dir": str(tmp_path)})
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    code, out, err, took = bpslaunch(
        ["--local", "2", "--timeout", "280", "--", sys.executable, str(runner)], timeout=300,
        env=env, cwd=str(tmp_path))
    log = out + err
    assert code == 0, f"exit {code} after {took:.0f} s\n{log[-5000:]}"
    for w in (0, 1):
        assert f"[worker {w}] upstream keras tests done" in log, log[-5000:]
