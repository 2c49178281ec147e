"""Upstream BytePS's other torch APIs on real `bpslaunch --local 2` clusters: the DDP wrapper,
CrossBarrier, asynchronous training, the timeline, and the stall log of their waits.

The scripts (tests/cluster/scripts/torch_ddp.py, torch_cross_barrier.py, torch_async.py,
torch_synthetic.py) are written as upstream's examples are and know nothing of byteps-thc.
Checked from outside the code under test: the server's log (the THC keys it registered), the
workers' output (the in-force line, each rank's parameter digest, the stall lines), the bytes
on the loopback interface of the cluster's own network namespace (root only) and the trace files.
The expected counts come from the MLP's shapes (test_compressor_flag's SIZES).
"""
import json
import os
import re

import pytest

import test_compressor_flag as cf
from test_launch_local import ROOT, pytestmark  # noqa: F401

SCRIPTS = os.path.join(ROOT, "tests", "cluster", "scripts")
DDP = os.path.join(SCRIPTS, "torch_ddp.py")
BARRIER = os.path.join(SCRIPTS, "torch_cross_barrier.py")
ASYNC = os.path.join(SCRIPTS, "torch_async.py")
SYNTHETIC = os.path.join(SCRIPTS, "torch_synthetic.py")
INTERRUPT = os.path.join(SCRIPTS, "torch_interrupt.py")
STEPS = ["--num-warmup-batches", "2", "--num-batches-per-iter", "6", "--num-iters", "3"]
COUNTS = (f"{len(cf.SIZES)} gradient tensors: {cf.BIG} compressed, {cf.SMALL} under "
          f"BYTEPS_MIN_COMPRESS_BYTES={cf.THRESHOLD} go uncompressed")


class Run(cf.Run):
    def __init__(self, code, output):
        super().__init__(code, output)
        self.digests = dict(re.findall(r"\] rank (\d) parameter digest (\w+)", output))


def run(script_argv, compressor=None, env=None, timeout=400, expect=0):
    """One `bpslaunch --local 2` cluster (test_compressor_flag's), `env` added to its
    environment."""
    return cf.bpslaunch(script_argv, compressor, timeout, extra_env=env, expect=expect, result=Run)


def _agree(r: Run):
    assert sorted(r.digests) == ["0", "1"], r.output[-3000:]
    assert r.digests["0"] == r.digests["1"], r.digests


# ------------------------------------------------------------------------------------------------
# byteps.torch.parallel.DistributedDataParallel
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_runs():
    return {c: run([DDP] + STEPS, compressor=c) for c in ("thc", "none", "onebit")}


def test_ddp_with_thc_from_the_launcher_compresses_and_says_so(ddp_runs):
    thc, none = ddp_runs["thc"], ddp_runs["none"]
    assert len(thc.thc_keys) == cf.BIG, thc.output[-3000:]
    assert none.thc_keys == set()
    [line] = thc.in_force
    assert "THC bits=4" in line and "chosen by bpslaunch --compressor thc" in line, line
    assert COUNTS in line, line
    [plain] = none.in_force
    assert "compressor Compression.none; chosen by default" in plain, plain
    if thc.lo_bytes and none.lo_bytes:
        ratio = thc.lo_bytes / none.lo_bytes
        print(f"DDP wire bytes (whole run): THC {thc.lo_bytes}, {ratio:.3f}x none's")
        assert ratio < 0.5, ratio


@pytest.mark.parametrize("compressor", ["thc", "none", "onebit"])
def test_ddp_workers_end_bit_identical(ddp_runs, compressor):
    _agree(ddp_runs[compressor])


def test_ddp_onebit_is_declared_with_its_kwargs(ddp_runs):
    [line] = ddp_runs["onebit"].in_force
    assert "compressor_type=onebit" in line and "chosen by bpslaunch --compressor onebit" in line


def test_ddp_explicit_fp16_stays_with_one_warning():
    r = run([DDP, "--fp16-pushpull"] + STEPS, compressor="thc")
    assert r.thc_keys == set(), r.output[-3000:]
    assert len(re.findall(r"UserWarning: byteps-thc: the script chose Compression\.fp16",
                          r.output)) == 1, r.output[-3000:]
    _agree(r)




def test_ctrl_c_interrupts_a_blocked_synchronize_and_loses_nothing():
    """SIGINT one second into a synchronize() that waits for a worker 8 s late ends the wait with
    KeyboardInterrupt at once (within the 0.1 s signal check, well before the late push), and
    synchronizing the same handle again returns the whole sum (1 + 2 = 3) on both ranks."""
    r = run([INTERRUPT], env={"THC_TEST_LATE_S": "8"})
    m = re.search(r"rank 0: KeyboardInterrupt after ([\d.]+) s", r.output)
    assert m, r.output[-3000:]
    assert float(m.group(1)) < 4.0, r.output[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: sum 3.0 of 1000" in r.output, r.output[-3000:]


@pytest.mark.parametrize("script", [DDP, BARRIER], ids=["ddp", "cross_barrier"])
def test_wait_past_stall_warn_is_logged_with_the_tensor(script):
    """Rank 1 sleeps 4 s before its second backward; rank 0's wait for it passes
    BYTEPS_THC_STALL_WARN=1 and is logged with the gradient's name."""
    r = run([script, "--delay-rank", "1", "--delay-s", "4"] + STEPS, compressor="thc",
            env=dict(BYTEPS_THC_STALL_WARN="1"))
    assert re.search(r"\[worker 0\] byteps-thc: worker 0 has waited \d+ s for the push_pull of "
                     r"'Gradient\.[0-9.a-z]+'", r.output), r.output[-3000:]
    _agree(r)


# ------------------------------------------------------------------------------------------------
# byteps.torch.cross_barrier.CrossBarrier
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compressor,optimizer", [("thc", "sgd"), ("none", "sgd"),
                                                  ("thc", "adam")])
def test_cross_barrier_trains_and_workers_agree(compressor, optimizer):
    r = run([BARRIER, "--optimizer", optimizer] + STEPS, compressor=compressor)
    assert len(r.thc_keys) == (cf.BIG if compressor == "thc" else 0), r.output[-3000:]
    [line] = r.in_force
    assert ("THC bits=4" in line and COUNTS in line) if compressor == "thc" else \
        "Compression.none; chosen by default" in line, line
    _agree(r)


# ------------------------------------------------------------------------------------------------
# BYTEPS_ENABLE_ASYNC=1
# ------------------------------------------------------------------------------------------------
def test_async_training_uncompressed_runs_and_ends_on_the_servers_sum():
    r = run([ASYNC] + STEPS, env=dict(BYTEPS_ENABLE_ASYNC="1"))
    assert "Check failed" not in r.output and "asynchronous" in r.output, r.output[-3000:]
    initial = dict(re.findall(r"\] rank (\d) initial digest (\w+)", r.output))
    assert initial["0"] == initial["1"], initial  # the broadcast under async training
    losses = re.findall(r"\] rank \d loss first ([0-9.]+) last ([0-9.]+)", r.output)
    assert len(losses) == 2 and all(float(b) < float(a) for a, b in losses), losses
    _agree(r)  # both read the server's store: the initial parameters plus every change
    assert r.digests["0"] != initial["0"]


@pytest.mark.parametrize("compressor,why", [("thc", "THC's server adds integer table values"),
                                            ("onebit", "without decompressing it")])
def test_async_training_with_a_compressor_is_refused_at_once(compressor, why):
    r = run([ASYNC] + STEPS, compressor=compressor,
            env=dict(BYTEPS_ENABLE_ASYNC="1"), expect=1)
    assert r.code != 0
    assert "ValueError: BYTEPS_ENABLE_ASYNC=1 (asynchronous training) cannot use" in r.output
    assert why in r.output and "Check failed" not in r.output, r.output[-3000:]


def test_ddp_under_async_training_is_refused_at_once():
    r = run([DDP] + STEPS, env=dict(BYTEPS_ENABLE_ASYNC="1"), expect=1)
    assert "needs byteps.torch.DistributedOptimizer" in r.output, r.output[-3000:]
    assert "Check failed" not in r.output


# ------------------------------------------------------------------------------------------------
# BYTEPS_TRACE_ON=1: the timeline
# ------------------------------------------------------------------------------------------------
def test_traces_land_in_one_folder_per_rank_with_thcs_stages_and_bytes(tmp_path):
    env = dict(BYTEPS_TRACE_ON="1", BYTEPS_TRACE_DIR=str(tmp_path),
               BYTEPS_TRACE_START_STEP="3", BYTEPS_TRACE_END_STEP="6")
    r = run([SYNTHETIC, "--no-cuda"] + STEPS, compressor="thc", env=env)
    for rank in (0, 1):
        path = tmp_path / str(rank) / "comm.json"
        assert path.exists(), r.output[-3000:]
        assert f"rank {rank}: communication traces output done! ({path})" in r.output
        events = json.loads(path.read_text())["traceEvents"]
        stages = {}  # tensor -> the stages its partitions' events name
        nbytes = {}  # (tensor, stage) -> the byte counts its events carry
        for e in events:
            if e["tid"] != "total":
                tensor, stage = e["name"].rsplit(".", 1)
                stages.setdefault(tensor, set()).add(stage)
                if "bytes" in e["args"]:
                    nbytes.setdefault((tensor, stage), set()).add(e["args"]["bytes"])
        # the MLP's two large weights are THC's (test_compressor_flag's BIG), the rest plain
        thc = {"THC_NORM", "COMPRESS", "PUSH", "PULL", "DECOMPRESS"}
        for layer in ("0", "2", "4"):
            big = layer in ("0", "2")
            got = stages.get(f"Comm.byteps.Gradient.{layer}.weight", set())
            if big:
                assert thc <= got, (layer, got)
            else:
                assert {"PUSH", "PULL"} <= got and not got & {"THC_NORM", "COMPRESS"}, got
        assert all(e["dur"] >= 0 for e in events)
        # bytes, from the shapes alone (each tensor is one partition, under BytePS's 4096000):
        # THC pushes 4 bits a coordinate (the layers' sizes are powers of two: no padding) and a
        # header, and pulls sums packed in 6 bits (2 workers x granularity 30 = 60 < 2^6) and a
        # header; a plain tensor pushes and pulls 4 bytes a value. Every traced step moves the
        # same.
        for name, d in (("0.weight", cf.SIZES[0]), ("2.weight", cf.SIZES[2])):
            t = f"Comm.byteps.Gradient.{name}"
            [push] = nbytes[(t, "PUSH")]
            assert d // 2 <= push <= d // 2 + 64, (name, push)
            assert nbytes[(t, "COMPRESS")] == {push}
            [pull] = nbytes[(t, "PULL")]
            assert d * 6 // 8 <= pull <= d * 6 // 8 + 64, (name, pull)
            assert nbytes[(t, "DECOMPRESS")] == {pull}
            [norm] = nbytes[(t, "THC_NORM")]
            assert 0 < norm <= 256, norm
        for name, d in (("4.weight", cf.SIZES[4]), ("0.bias", cf.SIZES[1])):
            t = f"Comm.byteps.Gradient.{name}"
            assert nbytes[(t, "PUSH")] == nbytes[(t, "PULL")] == {4 * d}, (name, nbytes)
