"""Smoke test of the BytePS fork: a real scheduler, server and 2 CPU workers on 127.0.0.1.

Started by hand (environment variables, no launcher). Each worker runs `byteps.torch` push_pull:
- a known tensor, summed and averaged, several times in a row: the second push_pull is the one
  that deadlocked while `wait_and_clear` held the GIL (patch 0005);
- a tensor split into several partitions (BYTEPS_PARTITION_BYTES);
- a tensor declared with a registry compressor (onebit): it flows COPYD2H -> COMPRESS -> PUSH ->
  PULL -> DECOMPRESS -> COPYH2D, which also runs ReadyTable::SetReadyCount (patch 0006);
- many rounds of round-dependent data on one key: every worker must pull exactly round r's sum,
  never a mix with round r+1 (the server's double buffer, patch 0012).
The whole cluster is killed after TIMEOUT seconds at the latest.
"""
import re
import sys

TIMEOUT = 300  # a loaded 2-core machine starts four torch processes slowly

WORKER = r'''
import os, sys, time
import torch
import byteps.torch as bps

part = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
assert n == 2 and bps.local_size() == 1, (n, bps.local_size())
print("rank %d of %d" % (r, n), flush=True)


def basic():
    # a known tensor, sum then average, repeated (the 2nd call deadlocked before patch 0005)
    for step in range(3):
        x = torch.arange(1000, dtype=torch.float32) + 10.0 * (r + 1) + step
        s = bps.push_pull(x, average=False, name="known")
        exp = 2 * torch.arange(1000, dtype=torch.float32) + 30.0 + 2 * step
        assert torch.equal(s, exp), (step, s[:4], exp[:4])
        a = bps.push_pull(x, average=True, name="known_avg")
        assert torch.equal(a, exp / 2), (step, a[:4])
        print("rank %d push_pull %d ok" % (r, step), flush=True)
    # several partitions (BYTEPS_PARTITION_BYTES=65536: 320000 bytes -> 5 keys), float64
    big = torch.full((40000,), float(r + 1), dtype=torch.float64)
    out = bps.push_pull(big, average=False, name="big")
    assert torch.equal(out, torch.full_like(big, 3.0)), out[:4]
    print("rank %d partitions ok" % r, flush=True)


def compressed():
    # a registry compressor in the CPU pipeline: onebit with scaling sends sign * mean|x|, so
    # the server sums two constants and every element comes back as mean|x0| + mean|x1|
    bps.declare("onebit", compressor_type="onebit", compressor_onebit_scaling="true")
    g = torch.arange(1, 4097, dtype=torch.float32) * (r + 1)
    m = float(torch.arange(1, 4097, dtype=torch.float64).mean()) * 3
    for step in range(3):
        c = bps.push_pull(g, average=False, name="onebit")
        assert torch.allclose(c, torch.full_like(c, m), rtol=1e-5), (c[:4], m)
    print("rank %d compressed ok %.3f" % (r, float(c[0])), flush=True)


def rounds():
    # many rounds on one key with round-dependent data, one worker slower: every worker pulls
    # exactly round k's sum, never a mix with round k+1 (the server's double buffer)
    base = torch.arange(262144, dtype=torch.float32)
    for k in range(25):
        y = bps.push_pull(base + 1000.0 * k * (r + 1), average=False, name="rounds")
        bad = (y != 2 * base + 3000.0 * k).nonzero()
        assert bad.numel() == 0, "round %d: %d wrong values, e.g. %s" % (
            k, bad.numel(), y[bad[0]].tolist())
        if r == 1 and k % 4 == 0:
            time.sleep(0.02)
    print("rank %d rounds ok" % r, flush=True)


globals()[part]()
bps.shutdown()
print("rank %d done" % r, flush=True)
'''


def _run(cluster, tmp_path, part, expect):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # no BYTEPS_THREADPOOL_SIZE: compression must work without it (patch 0010)
    results = cluster([sys.executable, str(script), part], num_workers=2, timeout=TIMEOUT,
                      env={"BYTEPS_PARTITION_BYTES": "65536", "BYTEPS_MIN_COMPRESS_BYTES": "1024"})
    for i, (code, out) in enumerate(results):
        assert code == 0, "worker %d exited %d:\n%s" % (i, code, out[-4000:])
        for what in expect + ["done"]:
            assert re.search(r"rank \d %s" % what, out), "worker %d: no '%s'\n%s" % (
                i, what, out[-4000:])


def test_push_pull_sum_average_twice(cluster, tmp_path):
    """Known tensors summed and averaged, several partitions; the 2nd push_pull must not hang."""
    _run(cluster, tmp_path, "basic", ["push_pull 2 ok", "partitions ok"])


def test_registry_compressor_in_cpu_pipeline(cluster, tmp_path):
    """onebit runs in COMPRESS/DECOMPRESS of the CPU worker (and on the server)."""
    _run(cluster, tmp_path, "compressed", ["compressed ok"])


def test_rounds_never_mix(cluster, tmp_path):
    """25 rounds on one key, one worker slower: each pull is exactly that round's sum."""
    _run(cluster, tmp_path, "rounds", ["rounds ok"])
