"""Smoke tests of the emulated-network benchmark: benchmarks/bench_network.py, harness/netem.py.

The network tests need root and iproute2 (`ip`, `tc`); the cluster test also needs the BytePS
fork (`make byteps`). Each is skipped, saying why, when its needs are not met. Everything they
create lives in network namespaces named thcb<pid>-* with addresses from 198.18.0.0/15, and is
removed at the end.
"""
import io
import json
import os
import signal
import sys
import time

import pytest

from byteps_thc.launch.supervisor import ProcSpec, Supervisor
from harness import netem, supervised

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "bench_network.py")

needs_net = pytest.mark.needs_root("ip", "tc")  # network namespaces, veth pairs, tbf qdiscs


def _namespaces(prefix):
    return [n for n in netem.list_namespaces() if n.startswith(prefix)]


def test_only_benchmarking_addresses_are_accepted():
    assert str(netem.check_subnet("198.18.0.0/24")) == "198.18.0.0/24"
    assert str(netem.check_subnet("198.19.255.0/24")) == "198.19.255.0/24"
    for bad in ("10.0.0.0/24", "192.168.1.0/24", "172.16.0.0/24", "8.8.8.0/24", "198.20.0.0/24",
                "198.16.0.0/14"):
        with pytest.raises(ValueError):
            netem.check_subnet(bad)


def test_tbf_parameters_scale_with_rate():
    slow, fast = netem.tbf_args(1.0), netem.tbf_args(25.0)
    assert slow[:2] == ["rate", "1000000000bit"]
    assert int(fast[3]) > int(slow[3]) >= 2 * 65536


@needs_net
def test_rate_limited_link_and_cleanup():
    prefix = f"thcbt{os.getpid()}"
    net = netem.EmulatedNetwork(["srv", "w0"], prefix=prefix)
    try:
        net.create()
        assert len(_namespaces(prefix)) == 3
        net.set_rate(1.0)
        before = net.counters("w0")["tx_bytes"]
        gbit = netem.measure_tcp(net, "w0", "srv", seconds=1.0)
        # tbf holds the line rate (the lower side depends on free CPU: 0.95 on an idle host)
        assert 0 < gbit < 1.05, gbit
        sent = net.counters("w0")["tx_bytes"] - before
        assert sent >= gbit * 1e9 / 8 * 0.9
    finally:
        net.destroy()
    assert _namespaces(prefix) == []


@needs_net
def test_killed_run_leaves_nothing_after_cleanup_stale():
    code = ("import time; from harness import netem; "
            "n = netem.EmulatedNetwork(['a']); n.create(); print(n.prefix, flush=True); "
            "time.sleep(60)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))  # this checkout's harness
    spec = ProcSpec("netem", "worker", [sys.executable, "-c", code], env)
    with Supervisor([spec], err=io.StringIO(), echo=False, keep_lines=True, tag="netem") as sup:
        lines = sup.logs["netem"].lines
        deadline = time.monotonic() + 60
        while not lines and sup.procs["netem"].poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lines, f"no prefix printed; exit code {sup.procs['netem'].poll()}"
        prefix = lines[0][1].strip()
        assert _namespaces(prefix)
        os.kill(sup.pids["netem"], signal.SIGKILL)  # killed outright: no cleanup of its own
        sup.procs["netem"].wait(timeout=30)
        assert _namespaces(prefix), "the killed run's namespaces are gone before cleanup_stale"
    netem.cleanup_stale()
    assert _namespaces(prefix) == []


def _bench_tiny(tmp_path, compressors, *extra):
    """One run of the benchmark on the tiny model at 1 Gbit/s, 2 steps; (its output, its pid).
    Past 110 s it is stopped with SIGTERM, on which the script removes its namespaces."""
    run = supervised.run(
        [sys.executable, BENCH, "--workloads", "tiny", "--bandwidths", "1", "--compressors",
         compressors, "--steps", "2", "--min-steps", "2", "--warmup", "1", "--time-budget", "1.5",
         "--run-timeout", "45", "--json", str(tmp_path / "r.json"),
         "--logdir", str(tmp_path / "logs"), *extra,
         # the committed costs: a host's first own calibration takes minutes (not this test's)
         "--costs", os.path.join(ROOT, "tests", "data", "advise-costs-median3.json")],
        cwd=ROOT, timeout=110, kill_timeout=20, name="bench_network")
    assert not run.timed_out, "benchmark smoke run took over 110 s:\n" + run.output[-3000:]
    assert run.code == 0, run.output[-3000:]
    return run.output, run.pid


@needs_net
@pytest.mark.needs_fork
def test_bench_smoke_tiny_model_two_compressors(tmp_path):
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    text, pid = _bench_tiny(tmp_path, "none,thc", "--plot", str(tmp_path / "img"))
    assert time.monotonic() - t0 < 115
    records = json.loads(out.read_text())
    by = {r["compressor"]: r for r in records}
    assert set(by) == {"none", "thc"}, text[-3000:]
    for r in records:
        assert r["status"] == "ok", r.get("error")
        for key in ("compressor", "workload", "bandwidth_gbit", "step_time_s",
                    "wire_bytes_per_step"):
            assert key in r
        assert r["workload"] == "tiny" and r["bandwidth_gbit"] == 1.0
        assert r["step_time_s"] > 0 and r["server_cpu_s_per_step"] is not None
    # THC moves far fewer bytes (4 bits up, 8 down, against 32 + 32; small tensors stay fp32)
    assert by["thc"]["wire_bytes_per_step"] < 0.4 * by["none"]["wire_bytes_per_step"]
    assert (tmp_path / "img" / "bench_step_time.png").exists()
    assert _namespaces(f"thcb{pid}-") == []


def test_ncf_replay_is_priced_with_its_tables_density():
    from benchmarks import bench_network
    from byteps_thc.advisor import models
    sc = bench_network._scenario("ncf", 10.0, 9.0, 10.0, 2)
    one, union = models.densities("ncf", 2)
    assert sc.density == one and sc.union_density == union
    assert sc.tensors[:2] == [10**6 * 32] * 2
    assert bench_network._scenario("resnet50", 10.0, 9.0, 174.0, 2).density is None


@needs_net
@pytest.mark.needs_fork
def test_bench_smoke_tiny_model_lhc_topk(tmp_path):
    out = tmp_path / "r.json"
    text, pid = _bench_tiny(tmp_path, "none,lhc-topk-0.01")
    by = {r["compressor"]: r for r in json.loads(out.read_text())}
    assert set(by) == {"none", "lhc-topk-0.01"}, text[-3000:]
    for r in by.values():
        assert r["status"] == "ok", r.get("error")
    # capacity 2 x 10,240 (two workers' top-k of a full partition): the tail partition of
    # 24,576 values gets a 112,332-byte payload, more than its 98,304 float32 bytes, which
    # BytePS's COMPRESS stage used to abort on (patch 0045 lets THC and LHC push it)
    assert by["lhc-topk-0.01"]["lhc"] == {"capacity": 20480, "topk": 0.01,
                                          "topk_method": "exact", "seed": 42}
    # tiny's 1024x1024 and 256x1024 tensors: partitions of 1,024,000, 24,576 and 262,144 values
    # (5,242,880 bytes of float32 each way), each sent as a 24-byte header, a bitmap of d/8 and
    # a sketch of 4 m bytes: m = 3 s, s = max(ceil(20480 / 2.25), ceil(cbrt(20480^2 / 2e-3)))
    # = 9103
    parts = (1024000, 24576, 262144)
    lhc = sum(24 + 8 * -(-d // 64) + 4 * 3 * 9103 for d in parts)
    small = 4 * (1024 + 256 + 10 * 256 + 10)   # the bias and the last layer stay float32
    # what each worker pushes and pulls, both ways, at most 10% over for headers and the max
    # round (the uncompressed run carries its float32 bytes the same way)
    got = by["lhc-topk-0.01"]["wire_bytes_per_step"] / by["none"]["wire_bytes_per_step"]
    assert got < 1.1 * (lhc + small) / (4 * sum(parts) + small), got
    assert _namespaces(f"thcb{pid}-") == []
