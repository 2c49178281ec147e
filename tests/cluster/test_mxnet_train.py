"""MXNet Gluon training with THC on a `bpslaunch --local 2` cluster, in MXNet's own environment.

mxnet 1.9.1 imports on Python 3.11 only with numpy < 1.24, so it has its own virtual environment
(`make mxnet-env`: .cache/venv-mxnet with the fork built for MXNet); `make test-mxnet` runs this
file (with BYTEPS_THC_TEST_MXNET=1). Not part of `make test`: skipped, with the reason, without
that variable (the environment's fork may be older than .venv's) or without the environment.

- example/mxnet/train_digits.py trains with THC to within 2 points of uncompressed, and both
  workers end with bit-identical weights (THC and none);
- two tensors under one name with different sizes get the clear error, not an abort;
- workers that declare THC with different `bits` (tests/cluster/scripts/mxnet_failures.py): a
  push_pull and DistributedTrainer.step raise mxnet.base.MXNetError naming the refusal and both
  settings; the script catches it, an uncompressed push_pull still works, and both exit 0;
- a THC push_pull with is_average=True is the reference's decoded mean bit for bit, and with
  is_average=False n times that mean; uncompressed float32 averages and sums exactly, under a
  name push-pulled without a declaration (tests/cluster/scripts/mxnet_scale.py);
- a peer that holds back its push: the waiting worker's log names the tensor (a first push and a
  later one); byteps.mxnet.fail_cluster fails the push_pull in flight and later ones with
  MXNetError (tests/cluster/scripts/mxnet_stall.py).
"""
import json
import os
import re
import textwrap

import numpy as np
import pytest

from harness import supervised
from test_thc_server import check_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MXPY = os.environ.get("BYTEPS_THC_MXNET_PYTHON", os.path.join(ROOT, ".cache", "venv-mxnet", "bin",
                                                              "python"))
EXAMPLE = os.path.join(ROOT, "example", "mxnet", "train_digits.py")
SCRIPTS = os.path.join(ROOT, "tests", "cluster", "scripts")


pytestmark = [
    pytest.mark.skipif(os.environ.get("BYTEPS_THC_TEST_MXNET") != "1",
                       reason="MXNet runs in its own environment: make test-mxnet "
                              "(BYTEPS_THC_TEST_MXNET=1)"),
    pytest.mark.skipif(not os.path.exists(MXPY), reason=f"no MXNet environment at {MXPY} "
                                                        "(make mxnet-env)"),
    pytest.mark.needs_fork("mxnet", python=MXPY),  # checked after the two above
]


def launch(args, timeout=400, extra_env=None):
    """`bpslaunch --local 2 -- ARGS` under MXNet's Python, run by the Supervisor; (exit code,
    stdout and stderr as they came). Past `timeout` it is stopped and the test fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BYTEPS_", "DMLC_"))}
    env["PYTHONPATH"] = ROOT
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env or {})
    run = supervised.run([MXPY, "-m", "byteps_thc.launch", "--local", "2", "--timeout",
                          str(timeout - 20), "--"] + args, env=env, cwd=ROOT, timeout=timeout,
                         name="bpslaunch")
    if run.timed_out:
        raise AssertionError(f"bpslaunch ran past {timeout} s\n{run.output[-6000:]}")
    return run.code, run.output


@pytest.fixture(scope="module")
def trained():
    got = {}
    for comp in ("thc", "none"):
        code, out = launch([MXPY, EXAMPLE, "--epochs", "4", "--compressor", comp])
        assert code == 0, out[-6000:]
        got[comp] = sorted(re.findall(
            r"\[worker (\d)\] final test accuracy: ([0-9.]+) .*parameter digest (\w+)", out))
        assert len(got[comp]) == 2, out[-3000:]
    return got


def test_thc_within_two_points_of_uncompressed(trained):
    thc, none = float(trained["thc"][0][1]), float(trained["none"][0][1])
    assert none > 0.9 and thc >= none - 0.02, trained


@pytest.mark.parametrize("comp", ["thc", "none"])
def test_workers_end_bit_identical(trained, comp):
    (_, a0, d0), (_, a1, d1) = trained[comp]
    assert d0 == d1 and a0 == a1


def test_name_reused_with_another_size_is_a_clear_error(tmp_path):
    script = tmp_path / "dup.py"
    script.write_text(textwrap.dedent("""
        import mxnet as mx
        import byteps.mxnet as bps
        from byteps.mxnet.ops import byteps_declare_tensor, byteps_push_pull
        bps.init()
        a, b = mx.nd.ones(10), mx.nd.ones(20)
        byteps_declare_tensor("dup")
        byteps_push_pull(a, name="dup", is_average=False)
        a.wait_to_read()
        try:
            byteps_push_pull(b, name="dup", is_average=False)
            b.wait_to_read()
            print("NO ERROR", flush=True)
        except mx.base.MXNetError as e:
            print("ERROR", str(e).splitlines()[0][:400], flush=True)
        bps.shutdown()
    """))
    code, out = launch([MXPY, str(script)], timeout=200)
    assert "NO ERROR" not in out, out
    assert "'byteps.dup' is used by two different tensors" in out, out[-5000:]


def test_mismatched_bits_raise_mxnet_error(tmp_path):
    code, out = launch([MXPY, os.path.join(SCRIPTS, "mxnet_failures.py"), str(tmp_path)],
                            timeout=300)
    log = out
    assert code == 0, log[-4000:]
    for style, tensor in (("push_pull", "'byteps.mx.big_0'"), ("trainer", "'byteps.gradient_")):
        for r in (0, 1):
            text = (tmp_path / f"{style}_{r}.txt").read_text()
            assert text.startswith("MXNetError: ") and tensor in text, text
            assert f"failed on rank {r}" in text, text
            assert "registration refused" in text and "THC settings differ between workers" in text
            assert "bits=3" in text and "bits=4" in text, text
            assert "same THC or LHC settings" in text, text
    assert "rank 0: after [2.0, 2.0, 2.0, 2.0]" in out and "rank 1: after [2.0, 2.0, 2.0, 2.0]" \
        in out, log[-3000:]
    assert "Check failed" not in log and "SIGABRT" not in log


def test_average_and_sum_of_thc_and_uncompressed_tensors(tmp_path):
    """The MXNet plugin scales as the fork's PushPullScale says: a THC pull yields the mean, which
    is_average=True returns as it is and is_average=False multiplies by n; an uncompressed pull
    yields the sum, which is_average=True divides by n."""
    code, out = launch([MXPY, os.path.join(SCRIPTS, "mxnet_scale.py"), str(tmp_path)])
    assert code == 0, out[-6000:]
    n, part = 2, 1024000 // 4
    f32 = lambda v: v.astype(np.float32)  # noqa: E731
    check_pipeline(tmp_path, n, 2, 0, "x", "y", part, f32)
    check_pipeline(tmp_path, n, 2, 1, "x", "s", part, f32, summed=True)
    reps = [json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines()
            if "REPORT " in line]
    assert len(reps) == n, out[-3000:]
    total = sum(range(1, n + 1))
    for r in reps:
        assert r == {"f32_avg": [total / n], "f32_sum": [total]}, r


DELAY, WARN = 8, 2


@pytest.fixture(scope="module")
def stall_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mxnet_stall")
    code, log = launch([MXPY, os.path.join(SCRIPTS, "mxnet_stall.py"), str(DELAY), str(out)],
                       timeout=300, extra_env={"BYTEPS_THC_STALL_WARN": str(WARN)})
    return code, log, out


def waited_for(output, worker):
    return re.findall(rf"^\[worker {worker}\] byteps-thc: worker {worker} has waited (\d+) s for "
                      rf"the push_pull of '([^']+)' \(BYTEPS_THC_STALL_WARN={WARN}\)", output, re.M)


def test_a_stalled_peer_is_named_in_the_waiting_workers_log(stall_run):
    """Worker 1 holds back a new tensor's first push (worker 0 waits in BytePS's InitTensor,
    on the script's thread) and a known tensor's push (worker 0 waits in MXNet's engine)."""
    code, output, _ = stall_run
    assert "rank 0: stalls done" in output, output[-4000:]
    waits = waited_for(output, 0)
    assert {"byteps.stall.first", "byteps.stall.again"} <= {n for _, n in waits}, \
        (waits, output[-4000:])
    assert all(int(s) >= WARN for s, _ in waits), waits
    assert not [n for _, n in waited_for(output, 1) if n.startswith("byteps.stall.")], \
        output[-4000:]


def test_fail_cluster_fails_pending_and_later_mxnet_push_pulls(stall_run):
    code, output, out = stall_run
    assert code == 0, output[-4000:]
    pending = (out / "pending_0.txt").read_text()
    assert pending.startswith("MXNetError: ") and "node 1 declared dead" in pending, pending
    for r, peer in ((0, 1), (1, 0)):
        later = (out / f"later_{r}.txt").read_text()
        assert later.startswith("MXNetError: ") and f"node {peer} declared dead" in later, later
        assert (out / f"reason_{r}.txt").read_text() == f"test: node {peer} declared dead"
