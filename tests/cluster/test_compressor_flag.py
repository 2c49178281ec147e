"""`bpslaunch --compressor thc` reaches scripts written for BytePS, and says what it did.

The scripts (tests/cluster/scripts/) are upstream-style benchmarks that know nothing of
byteps-thc and pass `compression=bps.Compression.none` (or `.fp16`) explicitly. Each run is a
real `bpslaunch --local 2` cluster. Checked from the outside of the code under test:

- the server's log: the THC keys it registered (csrc/byteps/src/byteps/server/thc_server.cc);
- the bytes on the wire: each cluster runs in its own network namespace (`unshare -n`, root), so
  the loopback counters of /proc/net/dev, read in that namespace after the run, count every byte
  of that cluster and nothing else (whole run: set-up, broadcasts and every step);
- the workers' output: the in-force line, the warning, the end-of-run message.

The expected numbers of compressed tensors come from the MLP's shapes (SIZES below), not from
byteps-thc. Skipped when the BytePS fork (or, for the TF tests, TensorFlow) is not installed.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import test_launch_local as launch_local
from test_launch_local import ROOT, pytestmark  # noqa: F401

SCRIPTS = os.path.join(ROOT, "tests", "cluster", "scripts")
TORCH = os.path.join(SCRIPTS, "torch_synthetic.py")
TF = os.path.join(SCRIPTS, "tf_synthetic.py")
# enough steps that the one-off uncompressed traffic (broadcast, BytePS's init push) is small
STEPS = ["--num-warmup-batches", "2", "--num-batches-per-iter", "8", "--num-iters", "5"]

# the scripts' MLP: input 1024, two hidden layers of 512, 10 classes; float32 gradients
INPUT, HIDDEN, CLASSES = 1024, 512, 10
SIZES = [INPUT * HIDDEN, HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN * CLASSES, CLASSES]
THRESHOLD = 65536  # BytePS's default BYTEPS_MIN_COMPRESS_BYTES (and byteps-thc's)
BIG = sum(4 * n >= THRESHOLD for n in SIZES)  # 2: the two large weight matrices
SMALL = len(SIZES) - BIG

FROM_LAUNCHER = r"chosen by bpslaunch --compressor thc"  # bpslaunch sets BYTEPS_COMPRESSOR_SET_BY


def _netns():
    """The command prefix that runs a command in a private network namespace, or None."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-n", "--", "ip", "link", "set", "lo", "up"],
                           capture_output=True)
    return ["unshare", "-n", "--"] if probe.returncode == 0 else None


NETNS = _netns()
needs_netns = pytest.mark.skipif(NETNS is None, reason="needs root, unshare and ip (a private "
                                 "network namespace, so that only this cluster's bytes count)")


class Run:
    def __init__(self, code, output):
        self.code, self.output = code, output
        m = re.search(r"^LO_TX (\d+)$", output, re.M)
        self.lo_bytes = int(m.group(1)) if m else None
        self.thc_keys = set(re.findall(r"THC key (\d+) registered", output))
        rank0 = [line for line in output.splitlines() if line.startswith("[worker 0] ")]
        self.in_force = [line for line in rank0 if "byteps-thc: compressor " in line]


def bpslaunch(script_argv, compressor=None, timeout=600, extra_env=None, expect=0, result=None):
    """One `bpslaunch --local 2` cluster (in a private network namespace when possible); its
    launcher's and processes' output together, and the namespace's loopback bytes sent, as a
    `result` (default Run). The cluster gets this environment less any compressor setting, plus
    `extra_env`; `expect` 0 asserts success, 1 failure, None neither."""
    env = {k: v for k, v in os.environ.items() if k == "BYTEPS_THC_FORK_DIR"
           or not k.startswith(("BYTEPS_COMPRESSOR", "BYTEPS_THC_", "BYTEPS_MIN_COMPRESS"))}
    env.update(extra_env or {})
    args = ["--local", "2", "--timeout", str(timeout - 60)]
    if compressor:
        args += ["--compressor", compressor]
    args += ["--", sys.executable] + list(script_argv)
    # in the namespace: bring lo up, run, then print lo's transmitted bytes (everything sent)
    shell = ('ip link set lo up && "$@"; rc=$?; '
             'awk \'$1 == "lo:" {print "LO_TX " $10}\' /proc/net/dev; exit $rc')
    prefix = (NETNS + ["sh", "-c", shell, "netns"]) if NETNS else ()
    code, out, err, _ = launch_local.bpslaunch(args, timeout=timeout, env=env, prefix=prefix)
    run = (result or Run)(code, out + err)
    if expect is not None:
        assert (code == 0) == (expect == 0), (out + err)[-4000:]
    return run


def _counts_text(compressed, small):
    return (f"{len(SIZES)} gradient tensors: {compressed} compressed, {small} under "
            f"BYTEPS_MIN_COMPRESS_BYTES={THRESHOLD} go uncompressed")


# ------------------------------------------------------------------------------------------------
# PyTorch
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_runs():
    return {
        "plain": bpslaunch([TORCH, "--no-cuda"] + STEPS),
        "thc": bpslaunch([TORCH, "--no-cuda"] + STEPS, compressor="thc"),
        "fp16": bpslaunch([TORCH, "--no-cuda", "--fp16-pushpull"] + STEPS, compressor="thc"),
    }


def test_compression_none_in_the_script_takes_the_launchers_thc(torch_runs):
    thc, plain = torch_runs["thc"], torch_runs["plain"]
    assert len(thc.thc_keys) == BIG, thc.output[-3000:]
    assert plain.thc_keys == set()
    assert "final loss" in thc.output


def test_the_in_force_line_once_with_settings_source_and_counts(torch_runs):
    lines = torch_runs["thc"].in_force
    assert len(lines) == 1, torch_runs["thc"].output[-3000:]
    line = lines[0]
    assert "THC bits=4 granularity=30" in line and "table=[" in line  # ThcConfig.describe()
    assert re.search(FROM_LAUNCHER, line), line
    assert _counts_text(BIG, SMALL) in line
    plain = torch_runs["plain"].in_force
    assert len(plain) == 1 and "compressor Compression.none; chosen by default" in plain[0]
    assert "THC was chosen" not in torch_runs["thc"].output


def test_an_explicit_fp16_stays_and_is_warned_about_once(torch_runs):
    fp16 = torch_runs["fp16"]
    assert fp16.thc_keys == set(), fp16.output[-3000:]
    warnings = re.findall(r"UserWarning: byteps-thc: the script chose Compression\.fp16, .*"
                          r"chose Compression\.thc\(.*\); "
                          r"the script's Compression\.fp16 is in force", fp16.output)
    assert len(warnings) == 1, fp16.output[-3000:]
    assert len(fp16.in_force) == 1 and "compressor Compression.fp16; chosen by script" \
        in fp16.in_force[0]
    if fp16.lo_bytes and torch_runs["plain"].lo_bytes:  # fp16 halves the payload; THC would not
        ratio = fp16.lo_bytes / torch_runs["plain"].lo_bytes
        print(f"wire bytes (whole run): fp16 {fp16.lo_bytes}: {ratio:.3f}x none's")
        assert 0.4 < ratio < 0.7, ratio


def test_thc_that_compressed_nothing_says_so_at_the_end():
    run = bpslaunch([TORCH, "--no-cuda", "--input-size", "16", "--hidden", "16",
                     "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
                     "--num-iters", "1"], compressor="thc")
    said = re.findall(r"^\[worker \d\] byteps-thc: THC was chosen but no tensor reached "
                      rf"BYTEPS_MIN_COMPRESS_BYTES={THRESHOLD}", run.output, re.M)
    assert len(said) == 1, run.output[-3000:]
    assert said[0].startswith("[worker 0]")
    assert run.thc_keys == set()
    assert len(run.in_force) == 1 and "6 gradient tensors: 0 compressed, 6 under" in \
        run.in_force[0]


# ------------------------------------------------------------------------------------------------
# TensorFlow: DistributedGradientTape and DistributedOptimizer with Compression.none
# ------------------------------------------------------------------------------------------------
def _tf_ready():
    try:
        return importlib.util.find_spec("tensorflow") is not None and \
            importlib.util.find_spec("byteps.tensorflow") is not None
    except ImportError:
        return False


needs_tf = pytest.mark.skipif(not _tf_ready(), reason="TensorFlow or the fork's TF plugin is "
                              "not installed (make test-tf)")


@pytest.fixture(scope="module")
def tf_runs():
    return {
        "tape-plain": bpslaunch([TF, "--api", "tape"] + STEPS),
        "tape-thc": bpslaunch([TF, "--api", "tape"] + STEPS, compressor="thc"),
        "fit-thc": bpslaunch([TF, "--api", "fit"] + STEPS, compressor="thc"),
    }


@needs_tf
@pytest.mark.parametrize("api", ["tape", "fit"])
def test_tf_compression_none_takes_the_launchers_thc(tf_runs, api):
    run = tf_runs[f"{api}-thc"]
    assert len(run.thc_keys) == BIG, run.output[-3000:]
    assert len(run.in_force) == 1, run.output[-3000:]
    assert "THC bits=4" in run.in_force[0] and re.search(FROM_LAUNCHER, run.in_force[0])
    assert _counts_text(BIG, SMALL) in run.in_force[0]
    assert tf_runs["tape-plain"].thc_keys == set()


# ------------------------------------------------------------------------------------------------
# Both: the bytes on the wire
# ------------------------------------------------------------------------------------------------
@needs_netns
@pytest.mark.parametrize("runs, thc, plain", [
    pytest.param("torch_runs", "thc", "plain", id="torch"),
    pytest.param("tf_runs", "tape-thc", "tape-plain", marks=needs_tf, id="tf")])
def test_thc_from_the_flag_puts_at_most_0_3x_the_bytes_on_the_wire(request, runs, thc, plain):
    runs = request.getfixturevalue(runs)
    thc, plain = runs[thc].lo_bytes, runs[plain].lo_bytes
    assert thc and plain
    print(f"wire bytes (whole run): THC {thc}, none {plain}: {thc / plain:.3f}x")  # -rP shows it
    assert thc <= 0.3 * plain, f"THC {thc} bytes, none {plain} bytes: {thc / plain:.3f}x"
