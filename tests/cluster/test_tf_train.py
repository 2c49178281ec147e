"""TensorFlow 2 / Keras 3 training through the real BytePS pipeline, on a `bpslaunch --local 2`
cluster.

One cluster runs one worker script (WORKER below) that trains the digits MLP of
example/tensorflow/train_digits.py six times (eager, tf.function and model.fit, each with THC and
uncompressed; every model has its own variables, so its own BytePS names) and then pushes
two tensors under one name. The tests read its report:

- each style trains with THC to within 2 points of uncompressed, and both workers end with
  bit-identical weights (THC and none);
- the THC gradients went through the compressor registry (declared with THC's kwargs) under one
  stable name per variable;
- two tensors under one name with different sizes or dtypes get the clear error naming both,
  the worker goes on, and no process aborts;
- a THC tensor's average is the reference's decoded mean bit for bit (the op returns the pull's
  mean as it is) and its sum n times that mean; uncompressed float32, int32 (floor) and fp16
  tensors average and sum exactly (a cluster of its own, SCALE below).

Skipped, with the reason, when TensorFlow or the fork's TF plugin is not installed (`make test-tf`
builds the fork with it: BYTEPS_THC_TENSORFLOW=1). The cluster is bounded in time (the launcher's
--timeout and the subprocess timeout): a failure never hangs.
"""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from test_thc_server import check_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "example", "tensorflow", "train_digits.py")
# BYTEPS_THC_FORK_DIR (tests/conftest.py): every process imports byteps from that build
FORK_DIR = os.path.abspath(os.environ["BYTEPS_THC_FORK_DIR"]) \
    if os.environ.get("BYTEPS_THC_FORK_DIR") else ""
MODES = ("eager", "function", "fit")

WORKER = """
import importlib.util, json, sys
import tensorflow as tf
import byteps.tensorflow as bps
from byteps_thc import tensorflow as btf

bps.init()
spec = importlib.util.spec_from_file_location("train_digits", %(example)r)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
args = ex.parse_args(sys.argv[1:])
data = ex.load_digits_split(args.seed)


def report(kind, **kw):
    print("REPORT " + json.dumps(dict(kind=kind, **kw)), flush=True)


for mode in %(modes)r:
    for comp_name, comp in (("thc", bps.Compression.thc()), ("none", bps.Compression.none)):
        name = "mlp_%%s_%%s" %% (mode, comp_name)
        r = ex.train(bps, args, mode, comp, data, name=name,
                     log=lambda line: print(name, line, flush=True))
        grads = [n for n in btf.declared_names() if n.startswith("Gradient.%%s/" %% name)]
        thc = [n for n in grads if (btf.core._DECLARED[n] or {}).get("compressor_type") == "thc"]
        report("%%s-%%s" %% (mode, comp_name), accuracy=r["accuracy"], digest=r["digest"],
               gradient_names=len(grads), thc_names=len(thc),
               trainable_variables=r["trainable_variables"])

# one name, two tensors: a clear error on this worker, never an abort; the cluster goes on
bps.push_pull(tf.ones(10), name="dup.size", average=False)
bps.push_pull(tf.ones(10), name="dup.dtype", average=False)
errors = {}
for key, tensor in (("size", tf.ones(20)), ("dtype", tf.ones(10, tf.int32))):
    try:
        bps.push_pull(tensor, name="dup." + key, average=False)
        errors[key] = ("no error", "")
    except tf.errors.OpError as e:
        errors[key] = (type(e).__name__, e.message)
after = bps.push_pull(tf.ones(4), name="after", average=False).numpy().tolist()
report("mismatch", size_type=errors["size"][0], size_error=errors["size"][1],
       dtype_type=errors["dtype"][0], dtype_error=errors["dtype"][1], after=after)
bps.shutdown()
"""


# The op's average attr against the pull's sum or mean (PushPullScale in the fork): THC tensors
# "thc_avg" and "thc_sum" (declared keys 0 and 1, two partitions, two steps: error feedback and
# the step carried over), then uncompressed ones checked in the test.
SCALE = """
import json, os, sys
os.environ["BYTEPS_PARTITION_BYTES"] = "1024000"  # 300,000 floats: two partitions
import numpy as np
import tensorflow as tf
import byteps.tensorflow as bps

bps.init()
rank, size, out = bps.rank(), bps.size(), sys.argv[1]
thc = bps.Compression.thc()
for step in range(2):
    g = np.random.default_rng(1000 * step + rank)
    x = (g.standard_normal(300_000) * (rank + 1)).astype(np.float32)
    y = bps.push_pull(tf.constant(x), name="thc_avg", compression=thc, average=True)
    s = bps.push_pull(tf.constant(x), name="thc_sum", compression=thc, average=False)
    for name, t in (("x", x), ("y", y.numpy()), ("s", s.numpy())):
        np.save("%s/%s_%d_%d.npy" % (out, name, rank, step), t)
got = {}
v = float(rank + 1)
for average in (True, False):
    tag = "avg" if average else "sum"
    got["f32_" + tag] = bps.push_pull(tf.fill([1000], v), name="f32", average=average).numpy()
    got["i32_" + tag] = bps.push_pull(tf.constant([rank + 1, -(rank + 1)] * 500, tf.int32),
                                      name="i32", average=average).numpy()
    got["fp16_" + tag] = bps.push_pull(tf.fill([40_000], v), name="fp16", average=average,
                                       compression=bps.Compression.fp16).numpy()
print("REPORT " + json.dumps(dict(kind="scale", **{k: sorted(set(a.tolist()))
                                                    for k, a in got.items()})), flush=True)
bps.shutdown()
"""


pytestmark = [pytest.mark.needs_tf, pytest.mark.needs_fork("server", "tensorflow")]


def run_cluster(worker, args, timeout, launch_args=(), cwd=ROOT):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (FORK_DIR, ROOT) if p] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for k in [k for k in env if k.startswith(("BYTEPS_", "DMLC_"))]:
        env.pop(k)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow",
                "TF_NUM_INTEROP_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "1"})
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "byteps_thc.launch", "--local", "2",
                        "--timeout", str(timeout - 20)] + list(launch_args) +
                       ["--", sys.executable, worker] + list(args),
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def reports(out):
    """{(worker, kind): payload} from the workers' `REPORT <json>` lines."""
    got = {}
    for w, payload in re.findall(r"\[worker (\d)\] REPORT (\{.*\})", out):
        r = json.loads(payload)
        got[(int(w), r.pop("kind"))] = r
    return got


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    worker = tmp_path_factory.mktemp("tf") / "worker.py"
    worker.write_text(WORKER % {"example": EXAMPLE, "modes": MODES})
    code, out, err, took = run_cluster(str(worker), ["--epochs", "3"], timeout=480)
    assert code == 0, f"exit {code} after {took:.0f}s\n{out[-6000:]}\n{err[-3000:]}"
    got = reports(out)
    assert len(got) == 2 * (2 * len(MODES) + 1), out[-4000:]
    return got, out


@pytest.mark.parametrize("mode", MODES)
def test_thc_within_two_points_of_uncompressed(cluster_run, mode):
    got, _ = cluster_run
    thc, none = got[(0, f"{mode}-thc")], got[(0, f"{mode}-none")]
    assert none["accuracy"] > 0.9, none
    assert thc["accuracy"] >= none["accuracy"] - 0.02, (thc, none)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compressor", ["thc", "none"])
def test_workers_end_bit_identical(cluster_run, mode, compressor):
    got, _ = cluster_run
    r0, r1 = got[(0, f"{mode}-{compressor}")], got[(1, f"{mode}-{compressor}")]
    assert r0["digest"] == r1["digest"] and r0["accuracy"] == r1["accuracy"], (r0, r1)


@pytest.mark.parametrize("mode", MODES)
def test_thc_through_the_registry_under_stable_names(cluster_run, mode):
    got, _ = cluster_run
    for w in (0, 1):
        thc, none = got[(w, f"{mode}-thc")], got[(w, f"{mode}-none")]
        # one gradient name per trainable variable, however many steps (no per-step names)
        assert thc["gradient_names"] == thc["trainable_variables"] == 6, thc
        assert none["gradient_names"] == 6, none
        # the two large kernels (64x512, 512x512) are declared with THC's kwargs; the rest is
        # under BYTEPS_MIN_COMPRESS_BYTES and travels uncompressed
        assert thc["thc_names"] == 2 and none["thc_names"] == 0, (thc, none)


def test_name_reused_with_another_size_or_dtype_is_a_clear_error(cluster_run):
    got, out = cluster_run
    for w in (0, 1):
        r = got[(w, "mismatch")]
        size_err, dtype_err = r["size_error"], r["dtype_error"]
        assert "'dup.size'" in size_err and "float32 (40 bytes)" in size_err \
            and "float32[20] (80 bytes)" in size_err, size_err
        assert "'dup.dtype'" in dtype_err and "float32 (40 bytes)" in dtype_err \
            and "int32[10] (40 bytes)" in dtype_err, dtype_err
        assert "InvalidArgument" in r["size_type"], r
        assert r["after"] == [2.0] * 4, r  # the cluster still works afterwards
    assert "Check failed" not in out and "core dumped" not in out


def test_vanilla_error_feedback_gets_the_learning_rate(tmp_path):
    """BytePS's vanilla EF mmaps ./lr.s when its compressor is created; upstream only MXNet wrote
    it, and a TF worker aborted ("open lr.s failed"). The first declare with vanilla EF creates
    it, and DistributedOptimizer writes its learning rate at every step (model.fit: inside the
    traced train step)."""
    import struct
    code, out, err, took = run_cluster(
        EXAMPLE, ["--mode", "fit", "--epochs", "1", "--lr", "0.04"], timeout=300,
        launch_args=["--compressor", "onebit", "--compressor-ef", "vanilla"], cwd=str(tmp_path))
    assert code == 0, f"exit {code} after {took:.0f}s\n{out[-4000:]}\n{err[-3000:]}"
    assert "lr.s failed" not in out + err
    assert struct.unpack("d", (tmp_path / "lr.s").read_bytes()[:8])[0] == pytest.approx(0.04)


def test_average_and_sum_of_thc_and_uncompressed_tensors(tmp_path):
    """The op averages itself: a THC pull yields the mean, which the average returns bit for bit
    (the reference's decode, total=False) and the sum multiplies by n; uncompressed tensors are
    summed by the server and divided by n (integers: floor, as Python's //)."""
    worker = tmp_path / "scale.py"
    worker.write_text(SCALE)
    code, out, err, took = run_cluster(str(worker), [str(tmp_path)], timeout=300)
    assert code == 0, f"exit {code} after {took:.0f}s\n{out[-4000:]}\n{err[-3000:]}"
    n, part = 2, 1024000 // 4
    f32 = lambda v: v.astype(np.float32)  # noqa: E731
    check_pipeline(tmp_path, n, 2, 0, "x", "y", part, f32)
    check_pipeline(tmp_path, n, 2, 1, "x", "s", part, f32, summed=True)
    total = sum(range(1, n + 1))
    for w in range(n):
        r = reports(out)[(w, "scale")]
        assert r["f32_avg"] == [total / n] and r["f32_sum"] == [total], r
        assert r["fp16_avg"] == [total / n] and r["fp16_sum"] == [total], r
        assert r["i32_avg"] == sorted([total // n, -total // n]), r
        assert r["i32_sum"] == [-total, total], r
