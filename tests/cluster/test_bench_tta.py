"""Smoke run of the time-to-accuracy benchmark (benchmarks/bench_tta.py): real training of a small
stdlib language model through three BytePS compressors and FSDP2 with THC's reduce-scatter on
emulated 1 Gbit/s links.

Needs root and iproute2 (network namespaces, tc) and the BytePS fork; skipped, saying why, where
they are missing. What it checks comes from outside the code under test: the model's parameter
count from its shapes, the float32 bytes those parameters need, the uniform loss of 256 byte
values, the target rule applied by hand to the fp32 record.
"""
import json
import math
import os
import sys
import time

import pytest

from harness import netem, supervised

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "bench_tta.py")

# a small model whose weight matrices are all above BytePS's 64 KiB compression threshold
DIM, LAYERS, HEADS, SEQ, STEPS, EVERY = 128, 2, 4, 64, 8, 4
FIELDS = ("compressor", "workers", "bandwidth_gbit", "steps", "wall_s", "bytes_per_step",
          "final_val_loss", "target_val_loss", "time_to_target_s", "curve")


def _params():
    per_layer = 4 * DIM + (3 * DIM * DIM + 3 * DIM) + (DIM * DIM + DIM) + \
        (4 * DIM * DIM + 4 * DIM) + (4 * DIM * DIM + DIM)
    return LAYERS * per_layer + 2 * 256 * DIM + SEQ * DIM + 2 * DIM


@pytest.mark.needs_root("ip", "tc")
@pytest.mark.needs_fork
def test_bench_tta_smoke_three_compressors_and_fsdp(tmp_path):
    out = tmp_path / "tta.json"
    argv = [sys.executable, BENCH, "--workers", "2", "--bandwidths", "1",
            "--compressors", "thc,fp16,none,fsdp-thc", "--steps", str(STEPS),
            "--eval-every", str(EVERY),
            "--eval-windows", "8", "--dim", str(DIM), "--layers", str(LAYERS), "--heads",
            str(HEADS), "--seq", str(SEQ), "--run-timeout", "50", "--json", str(out),
            "--plot", str(tmp_path / "img"), "--logdir", str(tmp_path / "logs")]
    t0 = time.monotonic()
    # past 180 s: SIGTERM, on which the script removes its namespaces
    run = supervised.run(argv, cwd=ROOT, timeout=180, kill_timeout=20, name="bench_tta")
    text = run.output
    assert not run.timed_out, "smoke run took over 180 s:\n" + text[-3000:]
    assert run.code == 0, text[-3000:]
    took = time.monotonic() - t0
    records = json.loads(out.read_text())
    by = {r["compressor"]: r for r in records}
    assert sorted(by) == ["fp16", "fsdp-thc", "none", "thc"], text[-3000:]
    assert by["fsdp-thc"]["system"] == "fsdp" and by["thc"]["system"] == "byteps"
    assert records[0]["compressor"] == "none"        # the target's run comes first
    for r in records:
        assert r["status"] == "ok", (r["compressor"], r.get("error"))
        for key in FIELDS:
            assert key in r, (r["compressor"], key)
        assert r["workers"] == 2 and r["bandwidth_gbit"] == 1.0 and r["steps"] == STEPS
        assert r["params"] == _params()
        curve = r["curve"]
        assert [p[1] for p in curve] == list(range(0, STEPS + 1, EVERY))
        walls = [p[0] for p in curve]
        assert walls[0] == 0 and walls == sorted(walls) and walls[-1] == pytest.approx(
            r["wall_s"], abs=1e-3)
        assert 0 < r["wall_s"] < took
        # an untrained model is near uniform over the 256 byte values, and training lowers it
        assert abs(curve[0][2] - math.log(256)) < 0.15, curve
        assert curve[-1][2] < curve[0][2] - 0.3, (r["compressor"], curve)
        assert r["final_val_loss"] == curve[-1][2]
    # every run starts from the same weights and evaluates the same held-out windows
    assert len({r["curve"][0][2] for r in records}) == 1
    # float32: each of 2 workers pushes and pulls every parameter, 4 bytes each way
    fp32 = 2 * 2 * 4 * _params()
    assert fp32 <= by["none"]["bytes_per_step"] < 1.3 * fp32, by["none"]["bytes_per_step"]
    assert by["fp16"]["bytes_per_step"] < 0.65 * by["none"]["bytes_per_step"]
    assert by["thc"]["bytes_per_step"] < 0.4 * by["none"]["bytes_per_step"]
    # the target: fp32's final held-out loss + 1%, the time the first evaluation at or below it
    target = by["none"]["final_val_loss"] * 1.01
    for r in records:
        assert r["target_val_loss"] == pytest.approx(target)
        hit = [p for p in r["curve"] if p[2] <= target]
        assert r["time_to_target_s"] == (hit[0][0] if hit else None)
    assert by["none"]["time_to_target_s"] is not None
    assert (tmp_path / "img" / "bench_tta_w2_1gbit.png").exists()
    assert [n for n in netem.list_namespaces() if n.startswith(f"thcb{run.pid}-")] == []
