"""The LHC C++ core (csrc/lhc, in byteps_thc._C) against the NumPy reference, bit for bit.

Pinned on every ISA this CPU has (portable, avx2, avx512, forced in turn): the keys and the
fingerprint, the scale, stochastic rounding, the buckets and signs, whole payloads and residuals
over several steps (no top-k, exact and sampled top-k, error feedback), the aggregated payload,
the decoded values, on overload the same unresolved set, round count and partial values, and
the values the exact fallback resends.
"""
import numpy as np
import pytest

from byteps_thc.lhc import reference as R
from byteps_thc.lhc.config import LhcConfig, LhcDecodeError

_C = pytest.importorskip("byteps_thc._C")
if not hasattr(_C, "LhcEncoder"):
    pytest.skip("byteps_thc._C was built without the LHC core", allow_module_level=True)


def _available():
    orig = _C.lhc_active_isa()
    have = [i for i in ("portable", "avx2", "avx512") if _C.lhc_force_isa(i)]
    _C.lhc_force_isa(orig)
    return have


ISAS = _available()


@pytest.fixture(params=ISAS)
def isa(request):
    orig = _C.lhc_active_isa()
    assert _C.lhc_force_isa(request.param)
    assert _C.lhc_active_isa() == request.param
    yield request.param
    _C.lhc_force_isa(orig)


def test_isas_and_errors():
    assert "portable" in ISAS and _C.lhc_active_isa() in ISAS
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        _C.lhc_force_isa("sse9")


@pytest.mark.parametrize("seed", [0, 42, (1 << 64) - 1])
def test_keys_and_fingerprint(seed):
    for key in (0, 1, 12345, (1 << 64) - 1):
        ps = R.partition_seed(seed, key)
        assert _C.lhc_partition_seed(seed, key) == ps
        assert _C.lhc_hash_keys(ps) == R.hash_keys(ps)
        for rank, step in [(0, 0), (3, 7), ((1 << 24) - 1, (1 << 40) - 1)]:
            assert _C.lhc_round_key(ps, rank, step) == R.round_key(ps, rank, step)
            assert _C.lhc_sample_key(ps, rank, step) == R.sample_key(ps, rank, step)
        for d, m in [(1, 3), (1000, 2382), (1 << 32, 999)]:
            assert _C.lhc_fingerprint(d, m, ps) == R.fingerprint(d, m, ps)


def test_scale_exponent():
    rng = np.random.default_rng(0)
    vals = [0.0, 1.0, 3.0, 1.4e-45, 1e-30, 3.4e38, 8355967.5 / 2 ** 23]
    vals += [float(np.float32(v)) for v in rng.lognormal(0, 20, 300)]
    for n in (1, 2, 3, 257, 1000, (1 << 24) - 1):
        for v in vals:
            assert _C.lhc_scale_exponent(v, n) == R.scale_exponent(v, n), (v, n)


def test_quantize():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 0x7F800000, 20_000, dtype=np.uint32)  # finite, subnormals included
    bits |= rng.integers(0, 2, bits.size, dtype=np.uint32) << np.uint32(31)
    v = bits.view(np.float32)
    u = rng.integers(0, 1 << 63, v.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    for e in (-100, -1, 0, 5, 29, 60, 150, 179):
        mx = float(np.max(np.abs(v)))
        vv = v if mx * 2.0 ** e < 2 ** 30 else (v / np.float32(2.0 ** 90)).astype(np.float32)
        keep = np.abs(vv.astype(np.float64)) * 2.0 ** e < 2 ** 30
        vv, uu = vv[keep], u[keep]
        np.testing.assert_array_equal(_C.lhc_quantize(vv, e, uu), R.quantize(vv, e, uu))


def test_buckets(isa):
    rng = np.random.default_rng(2)
    for n, sub in [(0, 1), (1, 1), (7, 5), (100, 333), (1031, 100_000), (4096, (1 << 32) // 3 - 1)]:
        idx = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        b, neg = _C.lhc_buckets(99, idx, sub)
        rb, rneg = R.buckets(99, idx, sub)
        np.testing.assert_array_equal(b.reshape(-1, 3), rb)
        np.testing.assert_array_equal(neg, (rneg * np.array([1, 2, 4])).sum(axis=1))


def _inputs(d, seed, density):
    rng = np.random.default_rng(seed)
    x = np.zeros(d, np.float32)
    k = max(1, int(density * d))
    i = rng.choice(d, k, replace=False)
    x[i] = rng.standard_normal(k).astype(np.float32) * np.float32(rng.lognormal(0, 2))
    x[i[: k // 10]] = -0.0 if k > 20 else x[i[: k // 10]]  # negative zeros are zeros
    return x


CASES = [  # (d, capacity, topk, method, ef, density, n)
    (1, 1, None, "exact", True, 1.0, 1),
    (3, 3, None, "exact", False, 1.0, 2),
    (63, 40, None, "exact", False, 0.5, 3),
    (64, 40, 0.25, "exact", True, 1.0, 2),
    (65, 200, 0.5, "sampled", True, 1.0, 2),
    (1000, 300, 0.05, "exact", True, 1.0, 3),
    (10_007, 2000, None, "exact", True, 0.05, 4),
    (100_003, 3000, 0.01, "exact", True, 1.0, 2),
    (100_003, 4000, 0.01, "sampled", True, 1.0, 2),
    (100_003, 500, 0.003, "exact", False, 1.0, 2),
]


@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0]}-{c[2]}-{c[3]}-n{c[6]}" for c in CASES])
def test_payloads_sums_and_decode_bit_exact(isa, case):
    d, cap, topk, method, ef, density, n = case
    cfg = LhcConfig(capacity=cap, topk=topk, topk_method=method, error_feedback=ef, seed=d)
    key = 7
    m = cfg.m_buckets(d)
    ps = R.partition_seed(cfg.seed, key)
    keep_res = ef and topk is not None
    encs = [_C.LhcEncoder(d, m, ps, r, topk or 0.0, method == "sampled", ef) for r in range(n)]
    res = [np.zeros(d, np.float32) if keep_res else None for _ in range(n)]
    for step in range(3):
        xs = [_inputs(d, 100 * step + w, density) for w in range(n)]
        mx = [R.max_abs(x, r) for x, r in zip(xs, res)]
        assert [e.max_abs(x) for e, x in zip(encs, xs)] == mx
        top = max(mx)
        pays = []
        for w in range(n):
            want, res[w] = R.encode(cfg, xs[w], top, n, m, w, step, res[w], key)
            got = encs[w].encode(xs[w], top, n)
            np.testing.assert_array_equal(got, want)
            if keep_res:
                np.testing.assert_array_equal(encs[w].residual.view(np.uint32),
                                              res[w].view(np.uint32))
            else:
                assert encs[w].residual is None
            pays.append(got)
        agg = _C.LhcAggregator(d, m, ps, n)
        for p in pays:
            agg.add(p)
        total = R.aggregate(pays, d, m, ps, n)
        np.testing.assert_array_equal(agg.result(), total)
        out, unresolved, rounds, union = _C.lhc_decode(d, m, ps, total, top, n)
        assert unresolved is None
        want = R.decode(cfg, total, d, m, top, n, key)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        assert union == int(np.count_nonzero(
            np.unpackbits(total[R.HEADER_BYTES:R.HEADER_BYTES + 8 * -(-d // 64)])))


@pytest.mark.parametrize("load", [0.78, 0.83, 0.95])
def test_peeling_rounds_and_unresolved_match(isa, load):
    d, m, n = 400_000, 6000, 2
    cfg = LhcConfig(capacity=1, seed=int(load * 100))
    ps = R.partition_seed(cfg.seed)
    rng = np.random.default_rng(int(load * 100))
    idx = rng.choice(d, int(load * m), replace=False)
    xs = [np.zeros(d, np.float32) for _ in range(n)]
    for w, part in enumerate(np.array_split(idx, n)):
        xs[w][part] = rng.standard_normal(part.size)
    xs[1][idx[:50]] = -xs[0][idx[:50]]  # some entries cancel
    top = max(R.max_abs(x) for x in xs)
    pays = [R.encode(cfg, x, top, n, m, w)[0] for w, x in enumerate(xs)]
    total = R.aggregate(pays, d, m, ps, n)
    out, unresolved, rounds, union = _C.lhc_decode(d, m, ps, total, top, n)
    geo = R.geometry(d, m)
    bits = np.unpackbits(total[R.HEADER_BYTES:R.HEADER_BYTES + geo.bitmap_bytes],
                         bitorder="little")
    u = np.flatnonzero(bits).astype(np.uint32)
    _, ok, want_rounds, _ = R.peel(ps, geo, u, total[R.HEADER_BYTES + geo.bitmap_bytes:].view(
        np.uint32))
    assert rounds == want_rounds and union == u.size
    if ok.all():
        assert unresolved is None
        np.testing.assert_array_equal(out, R.decode(cfg, total, d, m, top, n))
    else:
        np.testing.assert_array_equal(unresolved, u[~ok])
        with pytest.raises(LhcDecodeError) as err:
            R.decode(cfg, total, d, m, top, n)
        np.testing.assert_array_equal(out.view(np.uint32), err.value.partial.view(np.uint32))


def test_core_errors():
    d, m = 100, 48
    ps = R.partition_seed(42)
    enc = _C.LhcEncoder(d, m, ps, 0, 0.1, False, True)
    x = np.zeros(d, np.float32)
    big = float(np.float32(3e38))
    x[3] = big
    enc.encode(x, big, 1)
    with pytest.raises(ValueError, match="residual overflowed"):
        x2 = np.zeros(d, np.float32)
        x2[:20] = big
        enc.encode(x2, big, 1)
        enc.encode(x2, big, 1)
    with pytest.raises(ValueError, match="multiple of 3"):
        _C.LhcEncoder(d, 47, ps, 0, 0.0, False, False)
    with pytest.raises(ValueError, match="size=0"):
        _C.LhcAggregator(0, 48, ps, 1)
    with pytest.raises(ValueError, match="num_workers=0"):
        _C.LhcAggregator(d, 48, ps, 0)
    agg = _C.LhcAggregator(d, m, ps, 2)
    p1 = _C.LhcEncoder(d, m, ps, 0, 0.0, False, False).encode(np.ones(d, np.float32), 1.0, 2)
    p2 = _C.LhcEncoder(d, m, ps, 1, 0.0, False, False).encode(np.ones(d, np.float32), 2.0, 2)
    agg.add(p1)
    with pytest.raises(ValueError, match="scale"):
        agg.add(p2)
    assert agg.count == 1


@pytest.mark.parametrize("topk", [0.001, 0.1, 0.5, 1.0])
def test_exact_topk_with_many_ties(isa, topk):
    # few distinct magnitudes: the k-th largest sits inside a large tie, broken by index
    d, n = 5003, 1
    cfg = LhcConfig(capacity=d, topk=topk, seed=5)
    m = cfg.m_buckets(d)
    ps = R.partition_seed(cfg.seed)
    rng = np.random.default_rng(int(topk * 1000))
    x = rng.choice(np.array([-2, -1, 0, 0, 1, 2, 2.0 ** -140], np.float32), d)
    enc = _C.LhcEncoder(d, m, ps, 0, topk, False, True)
    want, res = R.encode(cfg, x, 2.0, n, m, residual=np.zeros(d, np.float32))
    np.testing.assert_array_equal(enc.encode(x, 2.0, n), want)
    np.testing.assert_array_equal(enc.residual, res)


def test_fallback_values_are_the_last_encodes_q(isa):
    d, m, n = 5000, 300, 2
    cfg = LhcConfig(capacity=1, seed=8)
    ps = R.partition_seed(cfg.seed)
    x = _inputs(d, 3, 0.1)
    enc = _C.LhcEncoder(d, m, ps, 1, 0.0, False, False)
    probe = np.arange(d, dtype=np.uint32)
    assert not enc.values_at(probe).any()  # nothing encoded yet
    top = R.max_abs(x)
    enc.encode(x, top, n)
    _, _, idx, q = R.encode(cfg, x, top, n, m, rank=1, with_values=True)
    want = np.zeros(d, np.int64)
    want[idx] = q
    np.testing.assert_array_equal(enc.values_at(probe), want)


def test_corrupted_sums_never_decode_to_a_wrong_value():
    # one flipped bit anywhere in the aggregated payload: a clear error, or the right answer
    # where the flip is harmless (the reserved field; a bitmap bit set for an index not in the
    # union, which then decodes to its true value 0); never a crash or a wrong value
    d, n = 3000, 2
    cfg = LhcConfig(capacity=300, seed=12)
    m = cfg.m_buckets(d)
    ps = R.partition_seed(cfg.seed)
    xs = [_inputs(d, 40 + w, 0.04) for w in range(n)]
    top = max(R.max_abs(x) for x in xs)
    total = R.aggregate([R.encode(cfg, x, top, n, m, w)[0] for w, x in enumerate(xs)], d, m, ps, n)
    want, none, _, _ = _C.lhc_decode(d, m, ps, total, top, n)
    assert none is None
    bitmap = range(R.HEADER_BYTES, R.HEADER_BYTES + 8 * -(-d // 64))
    rng = np.random.default_rng(0)
    errors = 0
    for pos in rng.choice(total.size, 300, replace=False):
        bad = total.copy()
        bit = np.uint8(1 << int(rng.integers(0, 8)))
        bad[pos] ^= bit
        try:
            out, unresolved, _, _ = _C.lhc_decode(d, m, ps, bad, top, n)
        except ValueError:
            errors += 1
            continue
        if unresolved is not None:
            errors += 1
            continue
        np.testing.assert_array_equal(out, want, err_msg=f"byte {pos} flipped")
        assert pos in (6, 7) or (pos in bitmap and bad[pos] & bit), f"byte {pos} passed"
    assert errors >= 250
