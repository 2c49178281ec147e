"""The advisor's step-time model (byteps_thc.advisor), with injected per-element costs
(deterministic, no timing)."""
import ast
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from byteps_thc import ThcConfig
from byteps_thc.advisor import calibrate, cli, costs, host, models, replay, wire
from byteps_thc.advisor.costs import LARGE_TENSOR_BYTES, HostCosts
from byteps_thc.advisor.predict import Scenario, predict, predict_one, recommend
from byteps_thc.advisor.wire import CompressorSpec, parse_spec
from byteps_thc.thc import reference as R

ZERO = HostCosts({k: 0.0 for k in costs.COST_KEYS}, "zero")
# a host where every operation costs 1 ns per element and THC's encode/decode 5 ns
ONE_NS = HostCosts(dict({k: 1e-9 for k in costs.COST_KEYS}, thc_encode=5e-9, thc_decode=5e-9),
                   "1ns")
# the published parameter counts (torchvision's resnet50 and vgg16, Hugging Face bert-base-uncased)
PARAM_COUNTS = {"resnet50": 25557032, "vgg16": 138357544, "bert-base": 109482240}
M = 1 << 20            # elements of one large tensor


def sc(**kw):
    base = dict(tensors=[25 * M], bandwidth_gbit=1.0, compute_s=0.1, workers=2, efficiency=1.0,
                latency_s=0.0)
    base.update(kw)
    return Scenario(**base)


def test_model_shapes_have_the_published_parameter_counts():
    assert set(PARAM_COUNTS) | {"ncf"} == set(models.MODELS)
    for name, count in PARAM_COUNTS.items():
        assert sum(models.model_tensors(name)) == count
    # ncf is our own description: two tables of 10^6 x 32 and a 64-128-64-32-1 tower
    mlp = 64 * 128 + 128 + 128 * 64 + 64 + 64 * 32 + 32 + 32 + 1
    assert sum(models.model_tensors("ncf")) == 2 * 10**6 * 32 + mlp
    assert len(models.model_shapes("resnet50")) == 161     # weights, biases, BN gamma/beta
    assert len(models.model_shapes("bert-base")) == 199


def test_partitions_follow_byteps_rules():
    parts = wire.partitions([1024000 * 2 + 10, 100], partition_bytes=4096000,
                              min_compress_bytes=65536)
    assert parts == [(1024000, True), (1024000, True), (10, True), (100, False)]


def test_wire_bytes_per_compressor():
    d = 1 << 20
    assert wire.wire_bytes(CompressorSpec("none"), d, True, 2) == (4 * d, 4 * d)
    assert wire.wire_bytes(CompressorSpec("fp16"), d, True, 2) == (2 * d, 2 * d)
    # THC: b bits up, the sums down in ceil(log2(n*g + 1)) bits: 60 -> 6, 270 -> 9
    assert wire.wire_bytes(CompressorSpec("thc"), d, True, 2) == (d / 2, d * 6 / 8)
    assert wire.wire_bytes(CompressorSpec("thc"), d, True, 9) == (d / 2, d * 9 / 8)
    # tiled by the rotation blocks: 1,024,000 is one block of 2^20 (1.024x), 589,824 = 2^19 + 2^16
    up, down = wire.wire_bytes(CompressorSpec("thc"), 1024000, True, 2)
    assert (up, down) == ((1 << 20) / 2, (1 << 20) * 6 / 8)
    up, down = wire.wire_bytes(CompressorSpec("thc"), 589824, True, 2)
    assert (up, down) == (589824 / 2, 589824 * 6 / 8)
    # small tensors travel uncompressed whatever the compressor (but fp16 casts everything)
    assert wire.wire_bytes(CompressorSpec("thc"), 100, False, 2) == (400, 400)
    assert wire.wire_bytes(CompressorSpec("onebit"), d, True, 2) == (d / 8 + 4, d / 8 + 4)
    assert wire.wire_bytes(parse_spec("topk-0.01"), d, True, 2) == (8 * int(0.01 * d),) * 2
    assert wire.wire_bytes(parse_spec("randomk-1000"), d, True, 2) == (8000, 8000)
    up, _ = wire.wire_bytes(parse_spec("dithering-8"), d, True, 2, dithering_rate=4.0)
    assert up == d * 4 / 8 + 8


def test_dithering_rate_grows_with_levels():
    rates = [wire.dithering_bits_per_element(s) for s in (2, 4, 8, 16)]
    assert rates == sorted(rates) and 1 < rates[0] < rates[-1] < 8


def test_network_bound_step_time_is_exact_without_cpu_costs():
    # 25 Mi floats, 2 workers, 1 Gbit/s: the server link carries 2 x 100 MiB each way (overlapped)
    p = predict_one(sc(), CompressorSpec("none"), ZERO)
    bw = 1e9 / 8
    parts = wire.partitions([25 * M])
    fill = 2 * 2 * 4 * max(n for n, _ in parts) / bw
    assert p.network_s == pytest.approx(2 * 4 * 25 * M / bw + fill)
    assert p.step_s == pytest.approx(0.1 + p.network_s)
    assert p.bound == "network"
    assert p.wire_bytes_per_step == pytest.approx(2 * 2 * 4 * 25 * M)


def test_thc_cuts_bytes_to_5_32_and_wins_on_a_slow_network():
    preds = {p.compressor: p for p in predict(sc(), [CompressorSpec("none"), CompressorSpec("fp16"),
                                                     CompressorSpec("thc")], ZERO)}
    ratio = preds["thc"].wire_bytes_per_step / preds["none"].wire_bytes_per_step
    # 4 bits up, 6-bit sums down (n*g = 60); a partition of 1,024,000 padded to 2^20 adds 2.4 %
    assert ratio == pytest.approx((4 + 6) / 64, rel=0.03)
    assert preds["thc"].step_s < preds["fp16"].step_s < preds["none"].step_s
    assert preds["thc"].speedup > 2.5


def test_compression_loses_when_the_network_is_fast_and_cpu_is_slow():
    slow_cpu = HostCosts(dict(ONE_NS.per_elem, thc_encode=50e-9, thc_decode=50e-9), "slow")
    preds = predict(sc(bandwidth_gbit=100.0), [CompressorSpec("none"), CompressorSpec("thc")],
                    slow_cpu)
    assert preds[0].compressor == "none"
    thc = [p for p in preds if p.compressor == "thc"][0]
    assert thc.bound == "cpu" and thc.speedup < 1
    assert "none wins" in recommend(preds)


def test_shared_host_serialises_cpu_work():
    costs = HostCosts(dict(ONE_NS.per_elem, tcp_byte=0.0), "no tcp")
    own = predict_one(sc(bandwidth_gbit=100.0), CompressorSpec("thc"), costs)
    shared = predict_one(sc(bandwidth_gbit=100.0, cores=1), CompressorSpec("thc"), costs)
    assert shared.step_s > own.step_s
    # with one core, the two workers' and the server's CPU work add up
    w, s = own.worker_cpu_s, own.server_cpu_s
    assert shared.step_s - own.step_s == pytest.approx(2 * w + s - max(w, s), rel=1e-6)


def test_shared_host_counts_kernel_tcp_work():
    base = HostCosts(dict(ZERO.per_elem), "zero")
    tcp = HostCosts(dict(ZERO.per_elem, tcp_byte=1e-9), "tcp")
    a = predict_one(sc(bandwidth_gbit=1000.0, cores=2), CompressorSpec("none"), base)
    b = predict_one(sc(bandwidth_gbit=1000.0, cores=2), CompressorSpec("none"), tcp)
    assert b.bound == "cpu"
    assert b.step_s - a.step_s == pytest.approx(b.wire_bytes_per_step * 1e-9 / 2
                                                - a.network_s, rel=1e-6)
    # on dedicated machines the NIC's work is not the host's
    c = predict_one(sc(bandwidth_gbit=1000.0), CompressorSpec("none"), tcp)
    assert c.step_s == pytest.approx(a.step_s)


def test_byteps_compressors_pay_server_recompression_thc_does_not():
    n = 8
    thc = predict_one(sc(workers=n), CompressorSpec("thc"), ONE_NS)
    onebit = predict_one(sc(workers=n), CompressorSpec("onebit"), ONE_NS)
    elems = sum(e for e, _ in wire.partitions([25 * M]))
    padded = sum(R.geometry(ThcConfig(), e).padded for e, _ in wire.partitions([25 * M]))
    assert thc.server_cpu_s == pytest.approx(n * 1e-9 * padded)   # lookup+add, padded lengths
    assert onebit.server_cpu_s == pytest.approx((n * 2e-9 + 1e-9) * elems)         # dec+add, enc


def test_for_workers_config_changes_lane_and_bytes():
    spec = CompressorSpec("thc", thc=ThcConfig.for_workers(16, downstream_bits=16), label="thc-n")
    up, down = wire.wire_bytes(spec, 1 << 20, True, 16)
    assert spec.thc.granularity == 960 and down == 14 * (1 << 20) / 8  # 16 * 960 < 2^14
    assert parse_spec("thc-n", 4).thc == ThcConfig.for_workers(4)


def test_parse_spec_and_errors():
    assert parse_spec("onebit+ef").ef and parse_spec("onebit+ef").label == "onebit+ef"
    assert parse_spec("topk-0.01").k == 0.01
    with pytest.raises(ValueError):
        parse_spec("topk")
    with pytest.raises(ValueError):
        parse_spec("zip")
    with pytest.raises(ValueError):
        Scenario(tensors=[1], bandwidth_gbit=0, compute_s=0)


def test_parse_bytes():
    assert cli.parse_bytes("102M") == 102_000_000
    assert cli.parse_bytes("1MiB") == 1 << 20
    assert cli.parse_bytes("4096000") == 4096000


def test_cli_prints_a_recommendation(capsys, monkeypatch):
    monkeypatch.setattr(host, "host_costs", lambda **kw: ONE_NS)
    assert cli.main(["--model-bytes", "100M", "--bandwidth", "1,100", "--compute-ms", "50",
                        "--compressors", "none,fp16,thc"]) == 0
    out = capsys.readouterr().out
    assert "thc wins" in out and "compressor" in out


def test_cli_json(capsys, monkeypatch):
    monkeypatch.setattr(host, "host_costs", lambda **kw: ONE_NS)
    cli.main(["--model", "resnet50", "--bandwidth", "10", "--json", "--compressors",
                 "none,thc"])
    data = json.loads(capsys.readouterr().out)
    preds = data["runs"][0]["predictions"]
    assert {p["compressor"] for p in preds} == {"none", "thc"}
    assert all(math.isfinite(p["step_s"]) for p in preds)


def test_host_costs_cache_roundtrip(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_measure(**kw):
        calls.append(1)
        return HostCosts(dict(ONE_NS.per_elem), "numpy+thc codec")
    monkeypatch.setattr(host, "measure_costs", fake_measure)
    path = str(tmp_path / "c.json")
    a = host.host_costs(cache_path=path)
    assert "measuring this host's costs once" in capsys.readouterr().err  # minutes: say so
    b = host.host_costs(cache_path=path)
    assert a.per_elem == b.per_elem and len(calls) == 1 and "cached" in b.source
    assert capsys.readouterr().err == ""
    host.host_costs(cache_path=path, refresh=True)
    assert len(calls) == 2


# ------------------------------------------------------------------------------------------------
# The stack costs of a calibration cluster (byteps_thc.advisor.calibrate)
# ------------------------------------------------------------------------------------------------
STACK0 = {k: 0.0 for k in costs.STACK_KEYS}
STACK = dict(STACK0, stack_byte_w=1e-9, stack_byte_s=0.5e-9, stack_part_w=1e-4, stack_part_s=2e-4)


def test_shared_host_counts_the_stack_per_byte_and_partition_instead_of_tcp():
    costs = HostCosts(dict(ZERO.per_elem, tcp_byte=7e-9, **STACK), "stack")
    assert costs.has_stack and not ZERO.has_stack
    p = predict_one(sc(bandwidth_gbit=1000.0, cores=2), CompressorSpec("none"), costs)
    parts = len(wire.partitions([25 * M]))
    b = 2 * 4 * 25 * M                                   # one worker's bytes up and down
    wstack = b * 1e-9 + parts * 1e-4
    sstack = 2 * (b * 0.5e-9 + parts * 2e-4)             # both workers' bytes and partitions
    assert p.bound == "cpu"
    # tcp_byte is not added on top: the calibration's CPU includes the kernel's TCP
    assert p.step_s == pytest.approx(0.1 + (2 * wstack + sstack) / 2, rel=1e-9)
    assert p.worker_cpu_s == pytest.approx(wstack) and p.server_cpu_s == pytest.approx(sstack)
    # processes on machines of their own: the stack is not priced (as tcp_byte was not)
    own = predict_one(sc(bandwidth_gbit=1000.0), CompressorSpec("none"), costs)
    assert own.step_s == pytest.approx(0.1 + own.network_s)


def test_stack_charges_every_partition():
    costs = HostCosts(dict(ZERO.per_elem, **STACK), "stack")
    # one core: the step's CPU is everything added up (no process's own share can exceed it)
    one = predict_one(sc(tensors=[1 << 20], bandwidth_gbit=1e4, cores=1), CompressorSpec("none"),
                      costs)
    many = predict_one(sc(tensors=[1 << 14] * 64, bandwidth_gbit=1e4, cores=1),
                       CompressorSpec("none"), costs)
    assert one.wire_bytes_per_step == many.wire_bytes_per_step
    assert len(wire.partitions([1 << 20])) == 2       # 4 MiB > BYTEPS_PARTITION_BYTES
    per_part = 2 * 1e-4 + 2 * 2e-4                      # two workers' and the server's share
    assert many.step_s - one.step_s == pytest.approx(62 * per_part, rel=1e-6)


def test_calibrated_extras_correct_a_stand_in_and_stop_at_zero():
    spec = parse_spec("topk-0.01+ef")
    tensors = [25 * M, 1000]                             # the small one travels uncompressed
    elems = sum(e for e, c in wire.partitions(tensors) if c)
    base = predict_one(sc(tensors=tensors), spec, ONE_NS)
    cal = predict_one(sc(tensors=tensors), spec,
                      HostCosts(dict(ONE_NS.per_elem, **dict(STACK0, topk_xw=3e-9,
                                                             topk_xs=-0.5e-9)), "cal"))
    assert cal.worker_cpu_s - base.worker_cpu_s == pytest.approx(3e-9 * elems, rel=1e-9)
    assert cal.server_cpu_s - base.server_cpu_s == pytest.approx(-2 * 0.5e-9 * elems, rel=1e-9)
    cheap = predict_one(sc(tensors=[25 * M]), spec,
                        HostCosts(dict(ONE_NS.per_elem, **dict(STACK0, topk_xs=-1.0)), "cheap"))
    assert cheap.server_cpu_s == 0.0
    # other compressors are not touched by topk's extras
    other = HostCosts(dict(ONE_NS.per_elem, **dict(STACK0, topk_xw=3e-9)), "x")
    assert predict_one(sc(), CompressorSpec("thc"), other).step_s == pytest.approx(
        predict_one(sc(), CompressorSpec("thc"), ONE_NS).step_s)


def _calibration_run(text, tensors, truth, micro, n=2):
    """A StackCost with the CPU a host of known costs (`truth`, `micro`) would show."""
    spec = parse_spec(text, n)
    parts = wire.partitions(tensors)
    up = down = w = s = 0.0
    for e, c in parts:
        u, d = wire.wire_bytes(spec, e, c, n)
        mw, ms = costs.partition_cpu(spec, e, c, n, micro)
        up, down = up + u, down + d
        ce = wire.codec_elems(spec, e, c)
        w += mw + (truth.get(f"{spec.name}_xw", 0.0) * ce if c else 0.0)
        s += ms + (n * truth.get(f"{spec.name}_xs", 0.0) * ce if c else 0.0)
    w += (up + down) * truth["stack_byte_w"] + len(parts) * truth["stack_part_w"]
    s += n * ((up + down) * truth["stack_byte_s"] + len(parts) * truth["stack_part_s"])
    large = sum(t for t in tensors if 4 * t >= LARGE_TENSOR_BYTES)
    w += truth.get(f"{spec.name}_lw", 0.0) * large
    s += n * truth.get(f"{spec.name}_ls", 0.0) * large
    return calibrate.StackCost(spec.label, list(tensors), 10, 0.1, n * w, s, 0.0, 0.0, up, down,
                               n)


def test_calibrate_derive_recovers_the_costs_of_a_known_host():
    truth = dict(stack_byte_w=0.6e-9, stack_byte_s=0.3e-9, stack_part_w=1.2e-4,
                 stack_part_s=1.5e-4, topk_xw=8e-9, topk_xs=2e-9, thc_xw=2.5e-9, thc_xs=0.2e-9)
    big = list(calibrate.DEFAULT_TENSORS)
    small = list(calibrate.SMALL_TENSORS)
    runs = [_calibration_run(t, big, truth, ONE_NS) for t in ("topk-0.01+ef", "thc")]
    got = calibrate.derive(_calibration_run("none", big, truth, ONE_NS),
                           _calibration_run("none", small, truth, ONE_NS), runs, ONE_NS)
    assert set(got) == set(truth)
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k
    # THC's extras against the codec the stack ran (here 1 ns/coordinate slower to encode than
    # the costs they will be added to): what the stack costs beyond that codec
    slow = HostCosts(dict(ONE_NS.per_elem, thc_encode=6e-9), "slow codec")
    runs = [_calibration_run("thc", big, truth, slow)]
    got = calibrate.derive(_calibration_run("none", big, truth, ONE_NS),
                           _calibration_run("none", small, truth, ONE_NS), runs, ONE_NS,
                           codec=slow)
    assert got["thc_xw"] == pytest.approx(truth["thc_xw"], rel=1e-6)
    with pytest.raises(ValueError):   # one partition size cannot separate bytes from partitions
        calibrate.derive(_calibration_run("none", big, truth, ONE_NS),
                         _calibration_run("none", big, truth, ONE_NS), [], ONE_NS)


def test_load_costs(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"per_elem": dict(ONE_NS.per_elem, **STACK), "source": "s"}))
    c = costs.load_costs(str(path))
    assert c.per_elem == dict(ONE_NS.per_elem, **STACK) and c.has_stack and "s" in c.source
    path.write_text(json.dumps({"per_elem": {"copy": 1e-9}}))
    with pytest.raises(ValueError, match="add_f32"):
        costs.load_costs(str(path))


def test_thc_codec_work_follows_the_padded_partition():
    # a BytePS partition of 1,024,000 coordinates is rotated and quantised as 2^20
    spec = CompressorSpec("thc")
    assert wire.thc_padded(spec, 1024000) == 1 << 20
    assert wire.thc_padded(spec, 589824) == 589824  # tiled: 2^19 + 2^16, no padding
    odd = predict_one(sc(tensors=[1000000]), spec, ONE_NS)    # one block of 2^20: 1.049x
    full = predict_one(sc(tensors=[1024000]), spec, ONE_NS)   # one partition, also 2^20
    # the same codec work; no copies on a THC partition (the codec reads the tensor, patch 0043)
    assert full.worker_cpu_s == odd.worker_cpu_s
    assert odd.server_cpu_s == full.server_cpu_s
    none = CompressorSpec("none")   # the uncompressed pipeline copies each element twice
    assert predict_one(sc(tensors=[1024000]), none, ONE_NS).worker_cpu_s == pytest.approx(
        2 * 1e-9 * 1024000, rel=1e-9)
    assert wire.codec_elems(spec, 1000000, True) == 1 << 20
    assert wire.codec_elems(spec, 589824, True) == 589824
    assert wire.codec_elems(spec, 589824, False) == 589824
    assert wire.codec_elems(parse_spec("topk-0.01"), 589824, True) == 589824


def test_large_tensors_pay_their_calibrated_extra():
    costs = HostCosts(dict(ONE_NS.per_elem, **dict(STACK0, fp16_lw=2e-9, fp16_ls=1e-9)), "large")
    spec = CompressorSpec("fp16")
    limit = LARGE_TENSOR_BYTES // 4
    below = predict_one(sc(tensors=[limit - 1]), spec, costs)
    assert below.worker_cpu_s == pytest.approx(predict_one(sc(tensors=[limit - 1]), spec,
                                                           ONE_NS).worker_cpu_s)
    at = predict_one(sc(tensors=[limit]), spec, costs)
    plain = predict_one(sc(tensors=[limit]), spec, ONE_NS)
    assert at.worker_cpu_s - plain.worker_cpu_s == pytest.approx(2e-9 * limit, rel=1e-9)
    assert at.server_cpu_s - plain.server_cpu_s == pytest.approx(2 * 1e-9 * limit, rel=1e-9)
    # only the large tensor's elements, not the model's
    mixed = predict_one(sc(tensors=[limit, 1000]), spec, costs)
    assert mixed.worker_cpu_s - predict_one(sc(tensors=[limit, 1000]), spec, ONE_NS).worker_cpu_s \
        == pytest.approx(2e-9 * limit, rel=1e-9)


def test_calibrate_derive_recovers_large_tensor_costs():
    truth = dict(stack_byte_w=0.6e-9, stack_byte_s=0.3e-9, stack_part_w=1.2e-4,
                 stack_part_s=1.5e-4, fp16_xw=-0.5e-9, fp16_xs=-2e-9, none_lw=0.5e-9,
                 none_ls=0.1e-9, fp16_lw=1.9e-9, fp16_ls=0.2e-9)
    big, small = list(calibrate.DEFAULT_TENSORS), list(calibrate.SMALL_TENSORS)
    large = list(calibrate.LARGE_TENSORS)
    assert 4 * large[0] >= LARGE_TENSOR_BYTES > 4 * max(big)
    none_big = _calibration_run("none", big, truth, ONE_NS)
    fp16_big = _calibration_run("fp16", big, truth, ONE_NS)
    got = calibrate.derive(none_big, _calibration_run("none", small, truth, ONE_NS), [fp16_big],
                           ONE_NS, None, [none_big, fp16_big],
                           [_calibration_run(t, large, truth, ONE_NS) for t in ("none", "fp16")])
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k


# ------------------------------------------------------------------------------------------------
# The package's shape and its command lines
# ------------------------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COSTS = os.path.join(ROOT, "tests", "data", "advise-costs-median3.json")
# each module of byteps_thc.advisor imports only modules before it in this list
LAYERS = ["models", "wire", "costs", "predict", "replay", "calibrate", "host", "cli", "__main__"]


def test_advisor_modules_import_one_way():
    pkg = os.path.join(ROOT, "byteps_thc", "advisor")
    assert sorted(f[:-3] for f in os.listdir(pkg) if f.endswith(".py")) == \
        sorted(LAYERS + ["__init__"])
    for i, name in enumerate(LAYERS):
        with open(os.path.join(pkg, name + ".py")) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level != 1:
                continue
            used = [node.module] if node.module else [a.name for a in node.names]
            for dep in used:
                assert dep in LAYERS[:i], f"{name} imports .{dep}"
                # and at module level: no import inside a function dodges an order
                assert node in tree.body, f"{name} imports .{dep} inside a function"
    with open(os.path.join(pkg, "__init__.py")) as f:   # so `-m byteps_thc.advisor.x` runs once
        assert not [n for n in ast.parse(f.read()).body if isinstance(n, (ast.Import,
                                                                          ast.ImportFrom))]


def test_replay_command_line_carries_the_shapes():
    argv = replay.worker_argv(5, 2, shapes=[(4, 5), (6,)], compute_ms=1.5, interface="eth0")
    assert argv[:3] == [sys.executable, "-m", "byteps_thc.advisor.replay"]
    assert replay.parse_shapes(argv[argv.index("--shapes") + 1]) == [(4, 5), (6,)]
    assert argv[argv.index("--steps") + 1] == "5" and argv[argv.index("--warmup") + 1] == "2"
    line = replay.RESULT_TAG + json.dumps({"rank": 1, "cpu": 0.5})
    assert replay.results(["noise", line]) == [{"rank": 1, "cpu": 0.5}]


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_advisor_command_line_and_its_former_name():
    args = ["--model", "resnet50", "--bandwidth", "1", "--compressors", "none,thc", "--json",
            "--costs", COSTS]
    new, old = _run("byteps_thc.advisor", *args), _run("byteps_thc.advise", *args)
    assert new.returncode == 0 and old.returncode == 0, new.stderr + old.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)
    assert "byteps_thc.advisor" in old.stderr and new.stderr == ""
    runs = json.loads(new.stdout)["runs"]
    # 1 Gbit/s, 2 workers: ResNet-50's 102 MB step is network-bound uncompressed, THC wins
    assert runs[0]["predictions"][0]["compressor"] == "thc", runs


def test_the_calibration_command_line():
    new = _run("byteps_thc.advisor.calibrate", "--help")
    assert new.returncode == 0, new.stderr
    assert "--calibrate" in new.stdout


# ------------------------------------------------------------------------------------------------
# LHC
# ------------------------------------------------------------------------------------------------
# ONE_NS plus LHC's codec: 1 ns per element to encode and to decode, 100 ns per nonzero each way
LHC_NS = HostCosts(dict(ONE_NS.per_elem, lhc_enc=1e-9, lhc_dec=1e-9, lhc_enc_nz=100e-9,
                        lhc_dec_nz=100e-9, lhc_topk=5e-9, lhc_add=1e-10), "lhc")
P = 1024000            # one BytePS partition (4096000 bytes)


def _lhc_payload(d, nonzeros):
    """docs/LHC.md, by hand: 24-byte header, 8 ceil(d/64) of bitmap, 4 m of sketch, m = 3 s with
    s = max(ceil(N / 2.25), ceil(cbrt(N^2 / 2e-3))), N = min(capacity, d)."""
    n = min(nonzeros, d)
    s = max(math.ceil(n / 2.25), math.ceil((n * n / 2e-3) ** (1 / 3) - 1e-9))
    return 24 + 8 * math.ceil(d / 64) + 4 * 3 * s


def test_lhc_specs_parse_and_carry_their_flags():
    assert parse_spec("lhc").lhc is None                 # sized by the advisor
    c = parse_spec("lhc-c20480")
    assert (c.label, c.lhc.capacity, c.lhc.topk) == ("lhc-c20480", 20480, None)
    t = parse_spec("lhc-topk-0.01", workers=4)           # never overloads: n * k of a partition
    assert (t.label, t.lhc.topk, t.lhc.capacity) == ("lhc-topk-0.01", 0.01, 4 * 10240)
    assert parse_spec("lhc-topk-0.01-c30000").lhc.capacity == 30000
    assert wire.launcher_flags(t) == ["--compressor", "lhc", "--lhc-capacity", "40960",
                                      "--lhc-seed", "42", "--lhc-topk", "0.01",
                                      "--lhc-topk-method", "exact"]
    for bad in ("lhc-x", "lhc-topk", "lhc-topk-2", "lhc-c0", "lhc-topk-0.01-c"):
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_lhc_wire_bytes_are_the_codecs_payload():
    for d, cap in ((P, 20480), (P, 1000), (1000, 20480), (589824, 65536)):
        b = _lhc_payload(d, cap)
        assert wire.wire_bytes(parse_spec(f"lhc-c{cap}"), d, True, 2, density=1e-4) == (b, b)
    # below BYTEPS_MIN_COMPRESS_BYTES a tensor travels as float32
    assert wire.wire_bytes(parse_spec("lhc-c20480"), 1000, False, 2) == (4000, 4000)


def test_lhc_overload_adds_the_fallback_round_at_the_2core_fraction():
    spec = parse_spec("lhc-c20480")
    m = 3 * math.ceil(20480 / 2.25)
    base = _lhc_payload(P, 20480)
    union = round(0.90 * m)                       # load 0.90: the 2-core is 0.661 of the union
    up, down = wire.wire_bytes(spec, P, True, 2, density=union / P, union=union / P)
    assert up == down
    assert (up - base - 16) / (4 * union) == pytest.approx(0.661, abs=0.003)
    under = round(0.80 * m)                       # below c_3 = 0.8185: no fallback
    assert wire.wire_bytes(spec, P, True, 2, density=under / P, union=under / P)[0] == base


def test_lhc_work_follows_the_nonzeros():
    spec = parse_spec("lhc-c20480")
    rho, n = 0.004, 2
    union = 1 - (1 - rho) ** n                    # independent supports
    w, s = costs.partition_cpu(spec, P, True, n, LHC_NS, density=rho)
    assert w == pytest.approx(2e-9 * P + 100e-9 * rho * P + 100e-9 * union * P, rel=1e-9)
    assert s == pytest.approx(n * 1e-10 * _lhc_payload(P, 20480), rel=1e-9)
    # top-k keeps k = 1% of each worker's dense partition and pays its selection per element
    top = parse_spec("lhc-topk-0.01")
    k = 10240
    w, _ = costs.partition_cpu(top, P, True, n, LHC_NS)
    kept_union = P * (1 - (1 - k / P) ** n)
    assert w == pytest.approx((2e-9 + 5e-9) * P + 100e-9 * (k + kept_union), rel=1e-9)
    with pytest.raises(ValueError, match="lhc_enc"):   # costs of before LHC: a clear refusal
        costs.partition_cpu(spec, P, True, n, ONE_NS)
    assert all(p.compressor != "lhc" for p in predict(sc(), None, ONE_NS))


def test_advisor_picks_lhc_for_a_sparse_embedding_model_and_thc_for_a_dense_one():
    tensors = [16 * P]                             # 16 partitions of one table
    specs = [parse_spec(t) for t in ("none", "fp16", "thc", "lhc")]
    bw = 1.25e8                                    # 1 Gbit/s, efficiency 1: bytes/s
    rho = 0.002
    sparse = sc(tensors=tensors, density=[rho])
    preds = {p.compressor.split("-")[0]: p for p in predict(sparse, specs, LHC_NS)}
    # plain lhc is sized for 1.25x the expected summed support of a partition
    union = P * (1 - (1 - rho) ** 2)
    cap = 1024 * math.ceil(1.25 * union / 1024)
    assert preds["lhc"].compressor == f"lhc-c{cap}"
    lhc_b = _lhc_payload(P, cap)
    thc_down = (1 << 20) * 6 / 8                   # 1,024,000 is rotated as 2^20; 6-bit sums
    assert preds["lhc"].up_bytes == preds["lhc"].down_bytes == 16 * lhc_b
    assert preds["thc"].down_bytes == 16 * thc_down
    # an upper bound of LHC's step (network and CPU added, not overlapped, plus the fill) from
    # the inputs is below the network time alone of THC's bigger sums
    lhc_net = 2 * 16 * lhc_b / bw + 2 * 2 * lhc_b / bw
    lhc_cpu = 16 * (2e-9 * P + 100e-9 * (rho * P + union))
    assert 0.1 + lhc_net + lhc_cpu + lhc_cpu / 16 < 0.1 + 2 * 16 * thc_down / bw
    assert min(preds.values(), key=lambda p: p.step_s).compressor.startswith("lhc")
    assert "lhc" in recommend(list(preds.values())).split(" wins")[0]
    # dense: every value nonzero, so the sketch is sized for the whole partition and LHC sends
    # more than float32 itself (4 bytes a value), priced as it is; THC's 4-bit pushes and 6-bit
    # sums win
    dense_sc = sc(tensors=tensors, density=[1.0])
    assert _lhc_payload(P, P) > 4 * P
    dense = {p.compressor.split("-")[0]: p for p in predict(dense_sc, specs, LHC_NS)}
    assert dense["lhc"].up_bytes == 16 * _lhc_payload(P, P) > 16 * 4 * P
    assert min(dense.values(), key=lambda p: p.step_s).compressor == "thc"
    # and on a fast network with a slow codec nothing wins (the uncompressed path's copies are
    # the only CPU): 100 Gbit/s, LHC's nonzero work 10 us
    slow = HostCosts(dict(LHC_NS.per_elem, lhc_dec_nz=1e-5, thc_encode=50e-9), "slow")
    fast = predict(sc(tensors=tensors, density=[rho], bandwidth_gbit=100.0), specs, slow)
    assert fast[0].compressor == "none"


def test_densities_of_a_zipf_table_match_sampling():
    # uniform ids (s = 0): the closed form rows * (1 - (1 - 1/rows)^B)
    rows, b = 5000, 3000
    assert models.expected_rows_touched(rows, b, 0.0) == pytest.approx(
        rows * (1 - (1 - 1 / rows) ** b), rel=1e-9)
    # Zipf(1.0): the mean of 20 seeded samples of distinct ids; the count of distinct ids is a
    # sum of negatively correlated indicators, so its variance is at most its mean E
    rng = np.random.default_rng(int(os.environ.get("ADVISE_TEST_SEED", "5")))
    p = models.zipf_probabilities(rows, 1.0)
    e = models.expected_rows_touched(rows, b, 1.0)
    got = np.mean([np.unique(rng.choice(rows, b, p=p)).size for _ in range(20)])
    assert abs(got - e) < 5 * math.sqrt(e / 20)
    one, union = models.densities("ncf", 2)
    assert union[0] > one[0] and union[0] < 2 * one[0]     # the hot rows overlap
    assert one[2:] == [1.0] * (len(one) - 2)              # the MLP is dense
    assert models.densities("resnet50", 2) is None


def test_replay_fills_only_the_rows_a_batch_touches():
    import torch
    emb = models.Embedding(0, 4000, 1.0)
    rows = replay._SparseRows(emb, (20000, 8), rank=1)
    g = torch.full((20000, 8), 7.0)               # what the last push_pull left
    rows.fill(g, step=3)
    touched = (g != 0).any(dim=1)
    assert torch.all((g[~touched] == 0))          # nothing of the last step is left
    e = models.expected_rows_touched(20000, 4000, 1.0)
    assert abs(int(touched.sum()) - e) < 5 * math.sqrt(e)
    again = torch.zeros(20000, 8)
    replay._SparseRows(emb, (20000, 8), rank=1).fill(again, step=3)
    assert torch.equal(again, g)                  # seeded by table, rank and step
    other = torch.zeros(20000, 8)
    replay._SparseRows(emb, (20000, 8), rank=0).fill(other, step=3)
    assert not torch.equal(other, g)


def test_scenario_density_is_checked():
    with pytest.raises(ValueError, match="one per tensor"):
        sc(tensors=[10, 20], density=[0.1])
    with pytest.raises(ValueError, match="1.5"):
        sc(density=[1.5])


def test_cli_takes_a_density(capsys, monkeypatch):
    monkeypatch.setattr(host, "host_costs", lambda refresh=False: LHC_NS)
    assert cli.main(["--model-bytes", "400M", "--density", "0.002", "--bandwidth", "1",
                     "--compute-ms", "20", "--compressors", "none,thc,lhc"]) == 0
    out = capsys.readouterr().out
    assert "0.20% nonzero" in out and "lhc-c" in out
    with pytest.raises(SystemExit):
        cli.main(["--model-bytes", "400M", "--density", "2", "--bandwidth", "1",
                  "--compute-ms", "20"])
    assert "--density 2.0 must lie in [0, 1]" in capsys.readouterr().err


def test_lhc_prices_a_payload_larger_than_its_partition_as_it_is():
    # a partition of 24,576 values at capacity 20,480: 24 + 8 * 384 + 4 * 3 * 9103 = 112,332
    # bytes, more than its 98,304 float32 bytes; the fork sends it (docs/LHC.md), so the advisor
    # prices it and keeps it in the default list
    assert 24 + 8 * 384 + 4 * 3 * math.ceil(20480 / 2.25) == 112332 > 4 * 24576
    s = sc(tensors=[P + 24576])
    got = predict_one(s, parse_spec("lhc-topk-0.01"), LHC_NS)
    assert got.up_bytes == _lhc_payload(P, 20480) + 112332
    assert any(p.compressor == "lhc-topk-0.01" for p in predict(s, None, LHC_NS))


def test_cli_says_which_lhc_it_left_out(capsys, monkeypatch):
    monkeypatch.setattr(host, "host_costs", lambda refresh=False: LHC_NS)
    assert cli.main(["--model", "resnet50", "--bandwidth", "10"]) == 0
    assert "left out" not in capsys.readouterr().out   # the costs price LHC: nothing left out
    monkeypatch.setattr(host, "host_costs", lambda refresh=False: ONE_NS)
    assert cli.main(["--model", "ncf", "--bandwidth", "10"]) == 0
    assert "lhc (the costs have no LHC codec figures)" in capsys.readouterr().out
