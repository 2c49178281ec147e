"""Upstream BytePS's TensorFlow 2 / Keras 3 API in the fork, with upstream-style scripts of our own
(tests/cluster/scripts/) on real `bpslaunch --local 2` clusters, under `--compressor thc` and
without:

- tf2_first_batch.py: a tf.function train step that broadcasts the model's and the optimizer's
  variables inside the function under `if first_batch:` (and sums a constant every step). It used
  to hang in its first step: a push_pull of a constant (a broadcast's zeros on every worker but
  the root) was evaluated by TensorFlow's constant folding while the function was being
  optimised, before any other op ran, and it waited there for a peer that waited for this
  worker's gradients. Traced and eager, broadcast on the first step or a later one;
- keras_warmup.py: model.fit with upstream's Keras callbacks from
  byteps.tensorflow.keras.callbacks, LearningRateWarmupCallback included (upstream's read
  optimizer.lr, which Keras 3 has not);
- tf_stall.py: a peer that holds back a push for longer than BYTEPS_THC_STALL_WARN, in a first
  push, a later one and a traced step: the waiting worker's log names each tensor; then
  byteps_thc.tensorflow.fail_cluster and cluster_failure.

Checked from outside the code under test: the exit status (every run is bounded in time: a hang
fails), the server's THC keys, the loopback bytes where a network namespace can be had, the
workers' printed digests and values against what the scripts' shapes and arithmetic say.
"""
import os
import re
import sys

import pytest

from test_compressor_flag import SCRIPTS, bpslaunch
from test_launch_local import bpslaunch as launch

pytestmark = [pytest.mark.needs_tf, pytest.mark.needs_fork("server", "tensorflow")]

FIRST_BATCH = os.path.join(SCRIPTS, "tf2_first_batch.py")
KERAS = os.path.join(SCRIPTS, "keras_warmup.py")
STALL = os.path.join(SCRIPTS, "tf_stall.py")
STEPS = 12
# tf2_first_batch.py's MLP: 1024-512-512-10; float32 kernels of 64 KiB and more are compressed
BIG_FIRST_BATCH = 2   # 1024x512, 512x512 (512x10 and the biases are under 64 KiB)
BIG_KERAS = 1         # keras_warmup.py's 1024-512-10: the 1024x512 kernel


def per_worker(output, pattern):
    """{worker: the first group of `pattern` on that worker's lines}."""
    got = {}
    for w, value in re.findall(r"^\[worker (\d)\] " + pattern + r"$", output, re.M):
        got.setdefault(int(w), value)
    return got


@pytest.fixture(scope="module")
def first_batch():
    steps = ["--steps", str(STEPS)]
    return {
        "function-thc": bpslaunch([FIRST_BATCH, "--mode", "function"] + steps, "thc", 420),
        "function-none": bpslaunch([FIRST_BATCH, "--mode", "function"] + steps, None, 420),
        "eager-thc": bpslaunch([FIRST_BATCH, "--mode", "eager"] + steps, "thc", 420),
        "later-none": bpslaunch([FIRST_BATCH, "--mode", "function", "--broadcast-step", "3"]
                                + steps, None, 420),
    }


@pytest.mark.parametrize("run", ["function-thc", "function-none", "eager-thc", "later-none"])
def test_broadcast_inside_the_step_runs_and_the_workers_agree(first_batch, run):
    r = first_batch[run]
    digests = per_worker(r.output, r"parameter digest ([0-9a-f]{16})")
    assert len(digests) == 2 and digests[0] == digests[1], r.output[-3000:]
    summed = per_worker(r.output, r"workers summed: (.*)")
    # the constant 1.0 pushed by each of the 2 workers, summed at every step
    assert summed == {0: " ".join(["2"] * STEPS), 1: " ".join(["2"] * STEPS)}, summed


@pytest.mark.parametrize("run", ["function-thc", "eager-thc"])
def test_thc_is_in_force_in_the_first_batch_script(first_batch, run):
    r, plain = first_batch[run], first_batch["function-none"]
    assert len(r.thc_keys) == BIG_FIRST_BATCH, r.output[-3000:]
    assert plain.thc_keys == set()
    if r.lo_bytes and plain.lo_bytes:  # a network namespace: only this cluster's bytes
        # 12 steps of 3 MiB of float32 gradients each way against THC's 4 bits up and 6 down,
        # plus the uncompressed broadcast and BytePS's init pushes in both runs
        print(f"wire bytes: THC {r.lo_bytes}, none {plain.lo_bytes}: "
              f"{r.lo_bytes / plain.lo_bytes:.3f}x")
        assert r.lo_bytes < 0.6 * plain.lo_bytes


@pytest.fixture(scope="module")
def keras_runs():
    return {c: bpslaunch([KERAS], c, 420) for c in ("thc", "none")}


@pytest.mark.parametrize("compressor", ["thc", "none"])
def test_keras_warmup_callback_on_keras3(keras_runs, compressor):
    r = keras_runs[compressor]
    assert "AttributeError" not in r.output, r.output[-3000:]
    digests = per_worker(r.output, r"parameter digest ([0-9a-f]{16})")
    assert len(digests) == 2 and digests[0] == digests[1], r.output[-3000:]
    # the script's defaults: rate 0.05 x 2 workers, 2 warmup epochs of 4 steps, 3 epochs; the
    # warmup's rate at batch b of epoch e < 2 is 0.1 / 2 * ((e + (b + 1) / 4) / 2 + 1)
    want = [0.05 * ((e + (b + 1) / 4) / 2 + 1) for e in range(2) for b in range(4)] + [0.1] * 4
    for w in (0, 1):
        rates = [float(v) for v in per_worker(r.output, r"rates: (.*)")[w].split()]
        assert rates == pytest.approx(want, rel=1e-6), rates
        logged = [float(v) for v in per_worker(r.output, r"lr logged: (.*)")[w].split()]
        assert logged == pytest.approx([want[3], want[7], want[11]], rel=1e-6), logged
    assert len(r.thc_keys) == (BIG_KERAS if compressor == "thc" else 0), r.output[-3000:]


DELAY, WARN = 8, 2


@pytest.fixture(scope="module")
def stall_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf_stall")
    env = dict(os.environ, BYTEPS_THC_STALL_WARN=str(WARN))
    code, stdout, stderr, took = launch(
        ["--local", "2", "--timeout", "280", "--", sys.executable, STALL, str(DELAY), str(out)],
        timeout=300, env=env)
    return code, stdout + stderr, out


def waited_for(output, worker):
    return re.findall(rf"^\[worker {worker}\] byteps-thc: worker {worker} has waited (\d+) s for "
                      rf"the push_pull of '([^']+)' \(BYTEPS_THC_STALL_WARN={WARN}\)", output, re.M)


def test_a_stalled_peer_is_named_in_the_waiting_workers_log(stall_run):
    code, output, _ = stall_run
    assert "stalls done" in output, output[-4000:]
    waits = waited_for(output, 0)
    names = {name for _, name in waits}
    assert {"stall.first", "stall.again"} <= names, (waits, output[-4000:])
    assert any(re.fullmatch(r"Gradient\.stallnet/dense\w*/(kernel|bias)", n) for n in names), waits
    assert all(int(s) >= WARN for s, _ in waits), waits
    # the worker that held back never waited for these (it may have waited in the traced step's
    # first run, while worker 0 was still tracing it)
    assert not [n for _, n in waited_for(output, 1) if n.startswith("stall.")], output[-4000:]


def test_fail_cluster_fails_pending_and_later_tf_push_pulls(stall_run):
    code, output, out = stall_run
    assert code == 0, output[-4000:]
    pending = (out / "pending_0.txt").read_text()
    assert pending.startswith("InternalError: ") and "node 1 declared dead" in pending, pending
    for r, peer in ((0, 1), (1, 0)):
        later = (out / f"later_{r}.txt").read_text()
        assert f"node {peer} declared dead" in later and "the cluster has failed" in later, later
        assert (out / f"reason_{r}.txt").read_text() == f"test: node {peer} declared dead"

