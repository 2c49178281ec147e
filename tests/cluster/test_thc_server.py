"""The real BytePS scheduler and server (the fork build) on 127.0.0.1, driven by real ps-lite
clients (harness/thc_client.cc) that send exactly what BytePS workers send, for 2 and
3 workers:

- THC sums pulled from the server equal byteps_thc.ThcAggregator bit for bit, packed in the bits
  they need (8- and 16-bit lanes, several rounds, a rotation block, a tiled partition);
- the norm round returns the maximum;
- an uncompressed key and a onebit key still sum correctly;
- a registration whose kwargs name no registered compressor is refused: every round of that key
  fails with the refusal, the server stays up;
- a wrong-length payload, a mismatched configuration (push fingerprint, registration) and a bad norm
  produce clear errors (server log + the pulls of that round), while the server stays up and the
  next rounds and the other keys work.
"""
from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from harness import pslite as tc
from harness import supervised

byteps_thc = pytest.importorskip("byteps_thc")
from byteps_thc import ThcConfig  # noqa: E402
from byteps_thc.thc import reference as R  # noqa: E402

ROOT = tc.ROOT
pytestmark = pytest.mark.needs_fork("server")  # the worker pipeline tests need torch's plugin too


@pytest.fixture(scope="module", params=[2, 3], ids=["2workers", "3workers"])
def cluster(request, client_exe, tmp_path_factory):
    c = tc.Cluster(request.param, tmp_path_factory.mktemp(f"cluster{request.param}"), client_exe,
                   tc.server_argv())
    yield c
    c.close()


# ---- helpers -------------------------------------------------------------------------------
class Key:
    """One BytePS partition key as a worker drives it: init push, registration, rounds."""

    def __init__(self, cluster, key, d, kwargs=None, dtype=tc.FLOAT32):
        self.c, self.key, self.d, self.kwargs, self.dtype = cluster, key, d, kwargs, dtype
        self.dir = cluster.dir / f"key{key}"
        self.dir.mkdir(exist_ok=True)
        n = cluster.n
        init = self.dir / "init.bin"
        init.write_bytes(bytes(4 * d))
        cluster.all([f"push {key} {tc.command(tc.DEFAULT, dtype)} {init}"] * n)
        if kwargs is not None:
            self.register([kwargs] * n)

    def register(self, per_worker_kwargs):
        lines = []
        for i, kw in enumerate(per_worker_kwargs):
            p = self.dir / f"kwargs{i}.txt"
            p.write_text(tc.serialise_kwargs(kw))
            lines.append(f"push {self.key} {tc.command(tc.COMPRESSED, self.dtype)} {p}")
        self.c.all(lines)

    def fingerprint(self, kwargs=None):
        fp, payload_bytes, padded = self.c.clients[0].cmd(
            f"fp {self.key} {self.d} {tc.serialise_kwargs(kwargs or self.kwargs)}").split()
        return int(fp), int(payload_bytes), int(padded)

    def round(self, payloads, cmd_type=tc.DEFAULT, dtype=None, capacity=None):
        """Every worker pushes its bytes, then every worker pulls; returns the pulled bytes."""
        dtype = self.dtype if dtype is None else dtype
        cmd = tc.command(cmd_type, dtype)
        pushes, pulls, outs = [], [], []
        for i, data in enumerate(payloads):
            p = self.dir / f"push{i}.bin"
            p.write_bytes(bytes(data))
            pushes.append(f"push {self.key} {cmd} {p}")
            o = self.dir / f"pull{i}.bin"
            outs.append(o)
            pulls.append(f"pull {self.key} {cmd} {capacity or (64 + 8 * self.d + 2048)} {o}")
        self.c.all(pushes)
        self.c.all(pulls)
        return [o.read_bytes() for o in outs]


def thc_payloads(cfg, d, n, rng, scale=1.0):
    codecs = [byteps_thc.ThcCodec(cfg, d, rank=i) for i in range(n)]
    xs = [(rng.standard_normal(d) * scale * (i + 1)).astype(np.float32) for i in range(n)]
    m = max(codec.norm(x) for codec, x in zip(codecs, xs))
    return [codec.encode(x, m).tobytes() for codec, x in zip(codecs, xs)]


def expected_sums(cfg, d, n, payloads):
    agg = byteps_thc.ThcAggregator(cfg, d, n)
    for p in payloads:
        agg.add(np.frombuffer(p, dtype=np.uint8))
    return agg.result()


def header(fp):
    return struct.pack("<IIQ", tc.PUSH_MAGIC, tc.WIRE_VERSION, fp)


def check_sums(replies, cfg, d, n, payloads):
    want = expected_sums(cfg, d, n, payloads)
    for r in replies:
        h, body = tc.parse_reply(r)
        assert h["status"] == 0, body.decode(errors="replace")
        # the sums travel packed in ceil(log2(n*g + 1)) bits each (reference.publish)
        w = (n * cfg.granularity).bit_length()
        assert h["lane_bits"] == w and h["num_workers"] == n
        assert len(body) == -(-want.size * w // 8)
        got = R.unpack_sums(np.frombuffer(body, dtype=np.uint8), w, want.size)
        assert np.array_equal(got, want.astype(np.uint64))
        assert body == R.pack_sums(want, w).tobytes()
    return want


def error_of(reply):
    h, body = tc.parse_reply(reply)
    assert h["status"] != 0, "expected the round to fail"
    return body.decode()


# ---- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,granularity,rotation_block,d,keyno", [
    (4, 30, None, 100_000, 10),       # 8-bit lanes, 6-7-bit sums; tiled: 3 x 2^15 + 2^11
    (4, 100, 1024, 70_001, 11),       # n*g > 255 at 3 workers: 16-bit lanes; 1024-wide blocks
    (2, 7, None, 65_536, 12),         # b=2, a power-of-two partition
])
def test_thc_sums_bit_exact(cluster, bits, granularity, rotation_block, d, keyno):
    n = cluster.n
    cfg = ThcConfig(bits=bits, granularity=granularity, rotation_block=rotation_block)
    k = Key(cluster, keyno << 16, d, cfg.to_kwargs())
    fp, payload_bytes, padded = k.fingerprint()
    rng = np.random.default_rng(keyno * 10 + n)
    for rnd in range(3):
        payloads = thc_payloads(cfg, d, n, rng)
        assert len(payloads[0]) == payload_bytes
        replies = k.round([header(fp) + p for p in payloads])
        sums = check_sums(replies, cfg, d, n, payloads)
        assert len(sums) == padded
        assert tc.parse_reply(replies[0])[0]["round"] == rnd + 1
    assert cluster.server_alive()


def test_norm_round_returns_max(cluster):
    n = cluster.n
    cfg = ThcConfig()
    k = Key(cluster, 20 << 16, 4096, cfg.to_kwargs())
    fp = k.fingerprint()[0]
    for norms in ([1.5, 0.25, 7.0][:n], [0.0] * n, [3.0, 1e30, 2.0][:n]):
        replies = k.round([struct.pack("<Qd", fp, v) for v in norms], cmd_type=tc.THC_NORM,
                          dtype=tc.FLOAT64, capacity=2048)
        for r in replies:
            h, body = tc.parse_reply(r)
            assert h["status"] == 0, body
            assert struct.unpack("<d", body)[0] == max(norms)
    # non-finite norms propagate as in an uncompressed sum: NaN wins over inf, inf over numbers
    nan, inf = float("nan"), float("inf")
    for norms, want in (([nan] + [1.0] * (n - 1), "nan"), ([1.0] * (n - 1) + [inf], "inf"),
                        ([inf] + [1.0] * (n - 2) + [nan], "nan")):
        replies = k.round([struct.pack("<Qd", fp, v) for v in norms], cmd_type=tc.THC_NORM,
                          dtype=tc.FLOAT64, capacity=2048)
        for r in replies:
            h, body = tc.parse_reply(r)
            assert h["status"] == 0, body
            assert repr(struct.unpack("<d", body)[0]) == want, (norms, body)
    replies = k.round([struct.pack("<Qd", fp, 2.0)] * n, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64,
                      capacity=2048)
    assert struct.unpack("<d", tc.parse_reply(replies[0])[1])[0] == 2.0


def test_norm_round_nonfinite_error_mode(cluster):
    """thc_nonfinite=error (BYTEPS_THC_NONFINITE): a non-finite norm fails that round for everyone,
    naming the key and the sender; the next round works. Workers that disagree on the mode are
    refused at registration."""
    n = cluster.n
    kw = dict(ThcConfig().to_kwargs(), thc_nonfinite="error")
    key = 21 << 16
    k = Key(cluster, key, 4096, kw)
    fp = k.fingerprint()[0]
    bad = [struct.pack("<Qd", fp, float("nan"))] + [struct.pack("<Qd", fp, 1.0)] * (n - 1)
    for r in k.round(bad, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64, capacity=2048):
        msg = error_of(r)
        assert f"THC key {key}: norm push from node" in msg and "is nan" in msg, msg
        assert "BYTEPS_THC_NONFINITE=error" in msg, msg
    replies = k.round([struct.pack("<Qd", fp, 2.0)] * n, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64,
                      capacity=2048)
    assert struct.unpack("<d", tc.parse_reply(replies[0])[1])[0] == 2.0
    key = 22 << 16
    k = Key(cluster, key, 4096)
    k.kwargs = kw
    k.register([kw] * (n - 1) + [ThcConfig().to_kwargs()])
    for r in k.round([struct.pack("<Qd", fp, 1.0)] * n, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64,
                     capacity=2048):
        msg = error_of(r)
        assert f"THC key {key}: registration refused" in msg and "BYTEPS_THC_NONFINITE" in msg
        assert "declared thc_nonfinite=" in msg and "propagate" in msg and "error" in msg, msg


def test_uncompressed_key_still_sums(cluster):
    n, d = cluster.n, 50_000
    k = Key(cluster, 30 << 16, d)
    rng = np.random.default_rng(3)
    for _ in range(3):
        xs = [rng.integers(-1000, 1000, d).astype(np.float32) for _ in range(n)]
        replies = k.round([x.tobytes() for x in xs], capacity=4 * d)
        for r in replies:
            assert np.array_equal(np.frombuffer(r, dtype=np.float32), np.sum(xs, axis=0))


def onebit_compress(v):
    neg = (v < 0).reshape(-1, 32).astype(np.uint64)
    words = (neg << np.arange(31, -1, -1, dtype=np.uint64)).sum(axis=1).astype(np.uint32)
    scale = np.float32(np.abs(v.astype(np.float64)).sum() / v.size)
    return words.tobytes() + scale.tobytes()


def test_onebit_key_still_works(cluster):
    n, d = cluster.n, 4096
    k = Key(cluster, 31 << 16, d,
            {"compressor_type": "onebit", "compressor_onebit_scaling": "true"})
    rng = np.random.default_rng(4)
    for _ in range(2):
        # values +-2^i: every decompress, sum and scale below is exact in float32
        xs = [(np.where(rng.random(d) < 0.5, -1, 1) * 2.0 ** i).astype(np.float32)
              for i in range(n)]
        total = np.sum(xs, axis=0)
        replies = k.round([onebit_compress(x) for x in xs], capacity=4 * d)
        for r in replies:
            assert r == onebit_compress(total)


def test_wrong_length_payload_fails_round_server_stays_up(cluster):
    n, d = cluster.n, 100_000
    cfg = ThcConfig()
    key = 40 << 16
    k = Key(cluster, key, d, cfg.to_kwargs())
    fp, payload_bytes, _ = k.fingerprint()
    rng = np.random.default_rng(5)
    payloads = thc_payloads(cfg, d, n, rng)
    pushes = [header(fp) + p for p in payloads]
    pushes[-1] = pushes[-1][:-1]  # one byte short, from the last worker
    for r in k.round(pushes):
        msg = error_of(r)
        assert f"THC key {key}" in msg and "wrong payload length" in msg
        assert str(16 + payload_bytes - 1) in msg and str(16 + payload_bytes) in msg
    assert cluster.server_alive()
    assert "wrong payload length" in cluster.server_text()
    # the key recovers on the next round, and the other keys were never affected
    payloads = thc_payloads(cfg, d, n, rng)
    check_sums(k.round([header(fp) + p for p in payloads]), cfg, d, n, payloads)
    test_uncompressed_key_still_sums(cluster)


def test_mismatched_fingerprint_fails_round(cluster):
    n, d = cluster.n, 100_000
    cfg = ThcConfig()
    other = ThcConfig(granularity=31)
    key = 41 << 16
    k = Key(cluster, key, d, cfg.to_kwargs())
    fp = k.fingerprint()[0]
    bad_fp = k.fingerprint(other.to_kwargs())[0]
    assert bad_fp != fp
    rng = np.random.default_rng(6)
    payloads = thc_payloads(cfg, d, n, rng)
    pushes = [header(fp) + p for p in payloads]
    pushes[0] = header(bad_fp) + payloads[0]
    for r in k.round(pushes):
        msg = error_of(r)
        assert (f"THC key {key}" in msg and "configuration mismatch" in msg
                and "granularity=30" in msg)
    # garbage that is not THC at all
    pushes = [header(fp) + p for p in payloads]
    pushes[0] = b"\x00" * len(pushes[0])
    for r in k.round(pushes):
        assert "not a THC payload" in error_of(r)
    assert cluster.server_alive()
    payloads = thc_payloads(cfg, d, n, rng)
    check_sums(k.round([header(fp) + p for p in payloads]), cfg, d, n, payloads)


def test_mismatched_registration_fails_every_round(cluster):
    n, d = cluster.n, 20_000
    key = 42 << 16
    k = Key(cluster, key, d)
    good, other = ThcConfig(), ThcConfig(bits=3, granularity=16)
    k.kwargs = good.to_kwargs()
    k.register([good.to_kwargs()] * (n - 1) + [other.to_kwargs()])
    fp = k.fingerprint()[0]
    rng = np.random.default_rng(7)
    for _ in range(2):
        payloads = thc_payloads(good, d, n, rng)
        for r in k.round([header(fp) + p for p in payloads]):
            msg = error_of(r)
            assert f"THC key {key}: registration refused" in msg and "bits=3" in msg
    assert "registration refused" in cluster.server_text()
    assert cluster.server_alive()


@pytest.mark.parametrize("keyno, extra, why", [
    (43, {"thc_table": "0,3,5,7"}, "table"),  # 4 levels for bits=4
    # a scale per rotation block is the DDP hook's and FSDP's: BytePS keeps one norm per partition
    (44, {"thc_block_scale": "1"}, "thc_block_scale=1: BytePS's thc compressor keeps one norm "
                                   "per partition")])
def test_invalid_kwargs_refused_with_message(cluster, keyno, extra, why):
    n, d = cluster.n, 20_000
    key = keyno << 16
    kw = dict(ThcConfig().to_kwargs(), **extra)
    k = Key(cluster, key, d, kw)
    fp = k.fingerprint(ThcConfig().to_kwargs())[0]
    for r in k.round([header(fp) + bytes(d)] * n):
        msg = error_of(r)
        assert f"THC key {key}: registration refused" in msg and why in msg, msg
    assert cluster.server_alive()


@pytest.mark.parametrize("keyno, kwargs, why", [
    (50, {"compressor_type": "thx"}, "compressor_type=thx is not one of "),
    (51, {"type": "thc", "thc_bits": "4"}, "compressor_type is missing"),
    (52, {"compressor_type": "onebit", "ef_type": "vanila"}, "ef_type=vanila is not one of "),
], ids=["typo", "no-type", "bad-ef"])
def test_unknown_compressor_refused_server_stays_up(cluster, keyno, kwargs, why):
    # upstream's registration aborted the server here (a null compressor's CHECK, or the
    # registry's FATAL); the worker refuses such kwargs itself, so only a client can send them
    n, d = cluster.n, 20_000
    key = keyno << 16
    k = Key(cluster, key, d, kwargs)  # every registration is answered
    for _ in range(2):
        for r in k.round([bytes(4 * d)] * n, capacity=4 * d + 4096):
            msg = error_of(r)
            assert f"BytePS key {key}: registration from node " in msg and why in msg, msg
            assert "refused" in msg and "onebit" in msg and "thc" in msg, msg
    assert cluster.server_alive()
    assert "Check failed" not in cluster.server_text()
    test_uncompressed_key_still_sums(cluster)


# ---- the real worker pipeline ----------------------------------------------------------------
def _key_seed(seed, key):
    from byteps_thc.thc.reference import splitmix64
    return splitmix64(seed ^ splitmix64(key ^ 0x7468635F6B657921))


def check_pipeline(out, n, steps, declared_key, xin, yout, part_elems, cast, skipped=(),
                    summed=False):
    """Each partition of each worker's output == the reference's decode of the sum of the codec's
    encodes: the mean (total=False, what a THC pull yields and average=True returns as it is), bit
    for bit; `summed` (average=False): that mean times n in the output's dtype, the one multiply
    the worker makes. Per-key seed, rank = the worker's rank, EF and step carried across steps.
    (step, partition) in `skipped`: a NaN there, so every output is NaN and no codec encodes."""
    cfg = ThcConfig()
    codecs = {}
    for step in range(steps):
        xs = [np.load(out / f"{xin}_{r}_{step}.npy").astype(np.float32) for r in range(n)]
        ys = [np.load(out / f"{yout}_{r}_{step}.npy") for r in range(n)]
        d = xs[0].size
        for p, lo in enumerate(range(0, d, part_elems)):
            hi = min(d, lo + part_elems)
            key = (declared_key << 16) + p
            c = ThcConfig(seed=_key_seed(cfg.seed, key))
            cs = codecs.setdefault(p, [byteps_thc.ThcCodec(c, hi - lo, rank=r) for r in range(n)])
            if (step, p) in skipped:
                for r in range(n):
                    assert np.isnan(ys[r][lo:hi]).all(), f"{yout} step {step} partition {p}"
                continue
            m = max(cs[r].norm(xs[r][lo:hi]) for r in range(n))
            agg = byteps_thc.ThcAggregator(c, hi - lo, n)
            for r in range(n):
                agg.add(cs[r].encode(xs[r][lo:hi], m))
            want = cast(R.decode(c, agg.result(), hi - lo, n, m, total=False))
            if summed:
                want = want * want.dtype.type(n)
            for r in range(n):
                got = ys[r][lo:hi]
                assert got.dtype == want.dtype
                same = got.view(np.uint8) == want.view(np.uint8)
                assert same.all(), (f"{yout} step {step} partition {p} rank {r}: "
                                    f"{np.count_nonzero(got != want)} of {hi - lo} differ")


def _run_local(n, tmp_path, steps, d, part_bytes, extra_env=None, timeout=300, servers=1):
    """`bpslaunch --local n` of worker_pipeline.py under the Supervisor: (exit code, output)."""
    env = dict(os.environ, BYTEPS_PARTITION_BYTES=str(part_bytes), **(extra_env or {}))
    fork = os.environ.get("BYTEPS_THC_FORK_DIR")  # tests/conftest.py: byteps from that build
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [fork and os.path.abspath(fork), str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "byteps_thc.launch", "--local", str(n), "--servers", str(servers),
           "--timeout", "240", "--",
           sys.executable, str(ROOT / "tests" / "cluster" / "scripts" / "worker_pipeline.py"),
           str(tmp_path), str(steps), str(d)]
    run = supervised.run(cmd, env=env, timeout=timeout, name="bpslaunch")
    if run.timed_out:
        pytest.fail("the local cluster hung:\n" + run.output[-4000:])
    return run.code, run.output


@pytest.mark.needs_fork
def test_worker_fails_with_message_on_mismatched_config(tmp_path):
    """Workers that declare different THC settings: the server logs the refusal naming the key and
    stays up until the launcher stops it; every worker fails with the server's message."""
    rc, log = _run_local(2, tmp_path, 1, 300_000, 1024000, {"THC_TEST_MISMATCH": "1"}, timeout=200)
    assert rc != 0, log[-3000:]
    assert "THC key 0: registration refused" in log, log[-3000:]
    assert "THC: the norm round of tensor 'byteps.thc_f32" in log, log[-3000:]
    assert "seed=" in log


@pytest.mark.needs_fork
def test_worker_fails_with_message_on_nan_gradient(tmp_path):
    """A NaN in one worker's THC gradient under thc_nonfinite=error: that worker fails with a
    message naming the tensor and itself."""
    rc, log = _run_local(2, tmp_path, 1, 300_000, 1024000,
                         {"THC_TEST_NAN_RANK": "1", "THC_TEST_NONFINITE": "error"}, timeout=200)
    assert rc != 0, log[-3000:]
    assert "THC: tensor 'byteps.thc_f32_0' (key 0" in log and "non-finite gradient" in log, \
        log[-3000:]


@pytest.mark.needs_fork
def test_worker_pipeline_nan_step_skipped_without_trace(tmp_path):
    """BYTEPS_THC_NONFINITE=propagate (the default): a NaN in one worker's partition at step 1
    makes that partition's result NaN on every worker; the tensor's other partitions are exact,
    and every later step is bit-exact with codecs that never saw step 1 of that partition (no
    residual, no step counter advanced)."""
    part_bytes, steps, d = 1024000, 3, 600_000
    rc, log = _run_local(2, tmp_path, steps, d, part_bytes,
                         {"THC_TEST_NAN_RANK": "1", "THC_TEST_NAN_STEP": "1"})
    assert rc == 0, log[-4000:]
    part = (d // 2) // (part_bytes // 4)
    assert "the agreed norm is NaN" in log and "Skipped steps of this key: 1." in log, log[-3000:]
    for key, yout in ((0, "y"), (4, "w")):
        check_pipeline(tmp_path, 2, steps, key, "x", yout, part_bytes // 4,
                        lambda v: v.astype(np.float32), skipped={(1, part)})


@pytest.mark.needs_fork
@pytest.mark.parametrize("n,servers", [(2, 1), (3, 1), (2, 2)],
                         ids=["2workers", "3workers", "2workers-2servers"])
def test_worker_pipeline_bit_exact(n, servers, tmp_path):
    """Real CPU BytePS workers (bpslaunch --local n): the norm round, THC encode with error feedback
    over 3 steps, the server's integer sums and the decode reproduce the codec bit for bit, for
    float32 and float16 tensors split in several partitions (spread over the servers), out of
    place (the input left as it was) and in place, averaged (the pull's mean as it is) and summed
    (n times it); uncompressed tensors, and a THC one below BYTEPS_MIN_COMPRESS_BYTES, still
    average and sum exactly (worker_pipeline.py checks them)."""
    part_bytes, steps, d = 1024000, 3, 600_000
    rc, log = _run_local(n, tmp_path, steps, d, part_bytes, servers=servers)
    assert rc == 0, log[-4000:]
    assert "THC key 0 registered" in log and "THC key 1 registered" in log
    check_pipeline(tmp_path, n, steps, 0, "x", "y", part_bytes // 4,
                    lambda v: v.astype(np.float32))
    check_pipeline(tmp_path, n, steps, 1, "h", "z", part_bytes // 2,
                    lambda v: v.astype(np.float16))
    check_pipeline(tmp_path, n, steps, 4, "x", "w", part_bytes // 4,
                    lambda v: v.astype(np.float32))
    check_pipeline(tmp_path, n, steps, 5, "x", "s", part_bytes // 4,
                    lambda v: v.astype(np.float32), summed=True)
