"""The GPU worker's THC stage plan on an emulated device, in every test run (no GPU needed).

`BYTEPS_THC_DEVICE_STAGES=emulated` makes a CPU-only worker run a THC partition as the GPU worker
does (csrc/byteps/src/byteps/common/compressor/impl/thc_device.h): the norm and the encode on the
"device" (host memory of the partition's own), COPYD2H carrying the b-bit payload, PUSH, PULL,
COPYH2D carrying the packed sums, the decode on the device into the output tensor. Real
`bpslaunch --local 2` clusters of tests/cluster/scripts/worker_pipeline.py, checked from outside:
- every output equals, byte for byte, the CPU plan's run of the same script, and the NumPy
  reference's decode of the codec's encodes (several partitions of float32 and float16 tensors,
  a tiled one among them, 3 steps of error feedback, in place, averaged and summed);
- rank 0's plan line names the stages in order and the bytes each copy carries, as the reference
  geometry gives them for that partition (payload d_pad*b/8, sums d_pad*SumBits(2)/8);
- a NaN step skips that partition on every worker and leaves later steps exact; a mismatched
  configuration fails every worker's push_pull with the server's message; a bad value of the
  variable fails the push_pull with a message naming it.
"""
import re

import numpy as np
import pytest

from byteps_thc import ThcConfig
from byteps_thc.thc import reference as R
from test_thc_server import _run_local, check_pipeline

pytestmark = pytest.mark.needs_fork
EMULATED = {"BYTEPS_THC_DEVICE_STAGES": "emulated"}
PART_BYTES, STEPS, D = 1024000, 3, 600_000  # partitions of 256000 floats: the last one is tiled
PLAN = re.compile(r"THC device stages \(emulated\), tensor '([^']+)' key (\d+) \((\d+) values\): "
                  r"THC_NORM .* -> COMPRESS .* -> COPYD2H (\d+) bytes \(the payload\) -> PUSH -> "
                  r"PULL -> COPYH2D (\d+) bytes \(the packed sums of 2 workers\) -> DECOMPRESS")


def test_emulated_device_stages_equal_the_cpu_plan_bit_for_bit(tmp_path):
    cpu, dev = tmp_path / "cpu", tmp_path / "emulated"
    cpu.mkdir()
    dev.mkdir()
    rc, log = _run_local(2, cpu, STEPS, D, PART_BYTES)
    assert rc == 0, log[-4000:]
    assert "THC device stages" not in log
    rc, log = _run_local(2, dev, STEPS, D, PART_BYTES, EMULATED)
    assert rc == 0, log[-4000:]

    plans = PLAN.findall(log)
    assert len(plans) == 1, log[-4000:]  # once, on rank 0
    _name, _key, d, payload, sums = plans[0]
    geo = R.geometry(ThcConfig(), int(d))
    assert int(payload) == geo.payload_bytes
    assert int(sums) == -(-geo.padded * R.sum_bits(ThcConfig(), 2) // 8)

    files = sorted(p.name for p in cpu.glob("*.npy"))
    assert len(files) == 6 * 2 * STEPS and files == sorted(p.name for p in dev.glob("*.npy"))
    for name in files:
        a, b = np.load(cpu / name), np.load(dev / name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    check_pipeline(dev, 2, STEPS, 0, "x", "y", PART_BYTES // 4, lambda v: v.astype(np.float32))
    check_pipeline(dev, 2, STEPS, 1, "h", "z", PART_BYTES // 2, lambda v: v.astype(np.float16))
    check_pipeline(dev, 2, STEPS, 4, "x", "w", PART_BYTES // 4, lambda v: v.astype(np.float32))
    check_pipeline(dev, 2, STEPS, 5, "x", "s", PART_BYTES // 4, lambda v: v.astype(np.float32),
                   summed=True)


def test_emulated_device_stages_skip_a_nan_step(tmp_path):
    rc, log = _run_local(2, tmp_path, STEPS, D, PART_BYTES,
                         {**EMULATED, "THC_TEST_NAN_RANK": "1", "THC_TEST_NAN_STEP": "1"})
    assert rc == 0, log[-4000:]
    assert "the agreed norm is NaN" in log and "Skipped steps of this key: 1." in log, log[-3000:]
    part = (D // 2) // (PART_BYTES // 4)
    for key, yout in ((0, "y"), (4, "w")):
        check_pipeline(tmp_path, 2, STEPS, key, "x", yout, PART_BYTES // 4,
                       lambda v: v.astype(np.float32), skipped={(1, part)})


def test_emulated_device_stages_fail_the_script_on_a_mismatch(tmp_path):
    rc, log = _run_local(2, tmp_path, 1, 300_000, PART_BYTES,
                         {**EMULATED, "THC_TEST_MISMATCH": "1"}, timeout=200)
    assert rc != 0, log[-3000:]
    assert "THC key 0: registration refused" in log, log[-3000:]
    assert "THC: the norm round of tensor 'byteps.thc_f32" in log, log[-3000:]


def test_a_bad_device_stages_value_is_named(tmp_path):
    rc, log = _run_local(2, tmp_path, 1, 300_000, PART_BYTES, {"BYTEPS_THC_DEVICE_STAGES": "gpu"},
                         timeout=200)
    assert rc != 0, log[-3000:]
    assert "BYTEPS_THC_DEVICE_STAGES=gpu is not a plan" in log, log[-3000:]
