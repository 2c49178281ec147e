"""The public LHC API (LhcConfig, LhcCodec, LhcAggregator, LhcDecodeError): shape, errors, state.

Every test runs on both backends of byteps_thc.lhc.codec: the C++ core (when _C is built with
it) and the NumPy reference it falls back to; test_lhc_kernels.py holds the core to the
reference bit for bit.
"""
import numpy as np
import pytest

from byteps_thc import LhcAggregator, LhcCodec, LhcConfig, LhcDecodeError
from byteps_thc.lhc import codec as lhc_codec
from byteps_thc.lhc import reference as R
from byteps_thc.lhc.config import PEELING_THRESHOLD, buckets_for

CORE = lhc_codec._CORE  # the core module, or None (before any test patches it)
BACKENDS = ["reference"] + (["core"] if lhc_codec.backend() == "core" else [])


@pytest.fixture(autouse=True, params=BACKENDS)
def backend(request, monkeypatch):
    if request.param == "reference":
        monkeypatch.setattr(lhc_codec, "_CORE", None)
    assert lhc_codec.backend() == request.param
    return request.param


def sparse(d, nnz, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    x = np.zeros(d, np.float32)
    x[rng.choice(d, nnz, replace=False)] = rng.standard_normal(nnz) * scale
    return x


def round_trip(cfg, xs, step_codecs=None, key=0):
    n, d = len(xs), xs[0].size
    codecs = step_codecs or [LhcCodec(cfg, d, rank=r, key=key) for r in range(n)]
    m = max(c.max_abs(x) for c, x in zip(codecs, xs))
    agg = LhcAggregator(cfg, d, num_workers=n, key=key)
    for c, x in zip(codecs, xs):
        agg.add(c.encode(x, m, num_workers=n))
    return codecs, agg.result(), m


def test_issue_example_is_exact_to_the_fixed_point():
    cfg = LhcConfig(capacity=3000, topk=None, seed=42, error_feedback=True)
    xs = [sparse(100_000, 1000, s) for s in range(3)]
    codecs, total, m = round_trip(cfg, xs)
    mean = codecs[1].decode(total, m, num_workers=3)
    assert mean.dtype == np.float32 and mean.shape == (100_000,)
    exact = sum(x.astype(np.float64) for x in xs) / 3
    e = R.scale_exponent(m, 3)
    assert (np.abs(mean - exact) <= 2.0 ** -e + np.abs(exact) * 2.0 ** -24).all()
    # every rank decodes the same bits, and decode is repeatable
    np.testing.assert_array_equal(codecs[0].decode(total, m, 3), mean)
    np.testing.assert_array_equal(codecs[1].decode(total, m, 3), mean)


@pytest.mark.skipif(lhc_codec.backend() != "core", reason="byteps_thc._C has no LHC core")
def test_the_core_and_the_reference_backends_give_the_same_bytes(backend, monkeypatch):
    cfg = LhcConfig(capacity=300, topk=0.02, error_feedback=True, seed=9)
    d, n = 20_000, 2
    out = {}
    for which in ("core", "reference"):
        monkeypatch.setattr(lhc_codec, "_CORE", None if which == "reference" else CORE)
        codecs = [LhcCodec(cfg, d, rank=r, key=3) for r in range(n)]
        rng = np.random.default_rng(0)
        got = []
        for step in range(3):
            xs = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
            _, total, m = round_trip(cfg, xs, codecs, key=3)
            got.append((total, codecs[0].decode(total, m, n), codecs[1].residual))
        out[which] = got
    for (t1, o1, r1), (t2, o2, r2) in zip(out["core"], out["reference"]):
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(o1.view(np.uint32), o2.view(np.uint32))
        np.testing.assert_array_equal(r1, r2)


def test_sizing_has_the_documented_margin():
    for cap in (1, 10, 1000, 10**5, 10**7):
        m = buckets_for(cap)
        assert m % 3 == 0 and cap / m <= 0.75 + 1e-12 and m >= cap / 0.818
        s = m // 3
        assert cap * cap / (2 * s ** 3) <= 1e-3  # pairs sharing all three buckets
    assert LhcConfig(capacity=10**6).m_buckets(1000) == buckets_for(1000)  # at most d nonzeros
    assert buckets_for(10**6) == 3 * -(-10**6 * 4 // 9)
    assert PEELING_THRESHOLD == 0.8185


def test_aggregator_copies_and_payloads_are_not_modified():
    cfg = LhcConfig(capacity=500)
    xs = [sparse(5000, 200, s) for s in range(2)]
    codecs = [LhcCodec(cfg, 5000, rank=r) for r in range(2)]
    m = max(c.max_abs(x) for c, x in zip(codecs, xs))
    pays = [c.encode(x, m, 2) for c, x in zip(codecs, xs)]
    keep = [p.copy() for p in pays]
    agg = LhcAggregator(cfg, 5000, 2)
    for p in pays:
        agg.add(p)
    assert agg.count == 2
    total = agg.result()
    for p, k in zip(pays, keep):
        np.testing.assert_array_equal(p, k)
    total[:] = 0  # the result is a copy
    np.testing.assert_array_equal(agg.result()[R.HEADER_BYTES:], R.aggregate(
        keep, 5000, cfg.m_buckets(5000), R.partition_seed(42), 2)[R.HEADER_BYTES:])
    with pytest.raises(ValueError, match="3 payloads summed for num_workers=2"):
        agg.add(pays[0])
    agg.reset()
    assert agg.count == 0


def test_topk_with_error_feedback_conserves_the_input():
    cfg = LhcConfig(capacity=200, topk=0.01, error_feedback=True)
    d = 10_000
    codec = LhcCodec(cfg, d)
    rng = np.random.default_rng(0)
    sent = np.zeros(d, np.float64)
    total_in = np.zeros(d, np.float64)
    for step in range(5):
        x = rng.standard_normal(d).astype(np.float32)
        total_in += x
        m = codec.max_abs(x)
        assert m == pytest.approx(float(np.max(np.abs(x + codec.residual))))
        agg = LhcAggregator(cfg, d, 1)
        agg.add(codec.encode(x, m, 1))
        out = codec.decode(agg.result(), m, 1)
        assert int((out != 0).sum()) <= cfg.keep(d) == 100
        sent += out
    assert codec.step == 5
    # what was sent plus what is held back is what came in (up to fixed-point rounding)
    np.testing.assert_allclose(sent + codec.residual, total_in, atol=1e-5)
    codec.reset_residual()
    assert not codec.residual.any()
    assert LhcCodec(LhcConfig(capacity=10), 100).residual is None  # no top-k: nothing held back


def test_overload_raises_decode_error_with_the_unresolved_indices():
    cfg = LhcConfig(capacity=100, seed=3)
    m_b = cfg.m_buckets(50_000)
    xs = [sparse(50_000, int(0.45 * m_b), s) for s in range(2)]  # union ~ 0.9 m
    codecs, total, m = round_trip(cfg, xs)
    with pytest.raises(LhcDecodeError) as err:
        codecs[0].decode(total, m, 2)
    other = pytest.raises(LhcDecodeError, codecs[1].decode, total, m, 2)
    np.testing.assert_array_equal(err.value.unresolved, other.value.unresolved)
    support = set(np.flatnonzero(xs[0]).tolist()) | set(np.flatnonzero(xs[1]).tolist())
    assert len(err.value.unresolved) > 0 and set(err.value.unresolved.tolist()) <= support
    assert err.value.union == len(support)
    assert "unresolved" in str(err.value) and "raise capacity" in str(err.value)


def test_fingerprint_covers_seed_key_and_size():
    cfg = LhcConfig(capacity=100)
    x = sparse(1000, 50, 0)
    c = LhcCodec(cfg, 1000)
    p = c.encode(x, c.max_abs(x), 1)
    for other in (LhcAggregator(LhcConfig(capacity=100, seed=43), 1000, 1),
                  LhcAggregator(cfg, 1000, 1, key=1)):
        with pytest.raises(ValueError, match="fingerprint"):
            other.add(p)
    with pytest.raises(ValueError, match="bytes"):
        LhcAggregator(cfg, 1001 + 64, 1).add(p)
    with pytest.raises(ValueError, match="fingerprint"):
        LhcCodec(cfg, 1000, key=5).decode(p, c.max_abs(x), 1)
    assert LhcConfig(seed=1).fingerprint() != LhcConfig(seed=2).fingerprint()
    assert LhcConfig(topk=0.1).fingerprint() == LhcConfig().fingerprint()  # per worker


def test_decode_checks_count_and_scale():
    cfg = LhcConfig(capacity=100)
    codecs, total, m = round_trip(cfg, [sparse(1000, 30, s) for s in range(2)])
    with pytest.raises(ValueError, match="hold 2 payloads, but num_workers=3"):
        codecs[0].decode(total, m, 3)
    with pytest.raises(ValueError, match="scale"):
        codecs[0].decode(total, 4 * m, 2)


def test_kwargs_round_trip():
    for cfg in (LhcConfig(), LhcConfig(capacity=7, topk=0.01, topk_method="sampled", seed=3,
                                       error_feedback=False)):
        kw = cfg.to_kwargs()
        assert all(isinstance(v, str) for v in kw.values()) and kw["compressor_type"] == "lhc"
        assert LhcConfig.from_kwargs(kw) == cfg
    with pytest.raises(ValueError, match="is not 'lhc'"):
        LhcConfig.from_kwargs({"compressor_type": "thc"})


@pytest.mark.parametrize("kwargs,match", [
    (dict(capacity=0), "capacity=0"), (dict(capacity=1.5), "capacity=1.5"),
    (dict(topk=0.0), "topk=0.0"), (dict(topk=1.5), "topk=1.5"), (dict(topk=-0.1), "topk"),
    (dict(seed=-1), "seed"), (dict(error_feedback=1), "error_feedback"),
    (dict(topk_method="best"), "topk_method"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LhcConfig(**kwargs)


def test_input_errors_name_the_bad_value():
    cfg = LhcConfig(capacity=10)
    c = LhcCodec(cfg, 100)
    good = np.zeros(100, np.float32)
    bad = good.copy()
    bad[7] = np.nan
    for x, match in [(bad, "NaN or Inf .*index 7"), (np.zeros(99, np.float32), "99 elements"),
                     (np.zeros(100, np.int32), "dtype int32"),
                     (np.zeros((10, 10), np.float32), "1-D")]:
        with pytest.raises(ValueError, match=match):
            c.max_abs(x)
        with pytest.raises(ValueError, match=match):
            c.encode(x, 1.0, 1)
    for m, match in [(float("nan"), "max_abs"), (-1.0, "max_abs"), ("x", "max_abs")]:
        with pytest.raises(ValueError, match=match):
            c.encode(good, m, 1)
    with pytest.raises(ValueError, match="num_workers=0"):
        c.encode(good, 1.0, 0)
    x = good.copy()
    x[3] = 2.0
    with pytest.raises(ValueError, match="below this worker's max"):
        c.encode(x, 1.0, 1)
    assert c.step == 0  # nothing changed
    with pytest.raises(ValueError, match="uint8"):
        c.decode(np.zeros(c.payload_bytes, np.int8), 1.0, 1)
    with pytest.raises(ValueError, match="bytes"):
        c.decode(np.zeros(c.payload_bytes + 1, np.uint8), 1.0, 1)
    with pytest.raises(ValueError, match="not an LHC"):
        c.decode(np.zeros(c.payload_bytes, np.uint8), 1.0, 1)
    with pytest.raises(ValueError, match="size=0"):
        LhcCodec(cfg, 0)
    with pytest.raises(ValueError, match="must be an LhcConfig"):
        LhcCodec(object(), 10)
    # float64 and float16 inputs are converted
    assert c.max_abs(x.astype(np.float64)) == 2.0 and c.max_abs(x.astype(np.float16)) == 2.0


def test_zero_input_and_corrupted_sums():
    cfg = LhcConfig(capacity=50)
    codecs, total, m = round_trip(cfg, [np.zeros(300, np.float32)] * 2)
    assert m == 0.0 and not codecs[0].decode(total, m, 2).any()
    codecs, total, m = round_trip(cfg, [sparse(300, 20, s) for s in range(2)])
    bad = total.copy()
    bad[R.HEADER_BYTES + 40 + 4] ^= 0x5  # one sketch byte: peeling then leaves a nonzero bucket
    with pytest.raises((ValueError, LhcDecodeError)):
        codecs[0].decode(bad, m, 2)
    bad = total.copy()
    bad[R.HEADER_BYTES + 40 - 1] |= 0x80  # a bitmap bit past d = 300
    with pytest.raises(ValueError, match="past size=300"):
        codecs[0].decode(bad, m, 2)


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    cfg = LhcConfig(capacity=100)
    x = sparse(1000, 40, 1)
    c = LhcCodec(cfg, 1000)
    m = c.max_abs(torch.from_numpy(x))
    assert m == c.max_abs(x)
    p = c.encode(torch.from_numpy(x), torch.tensor(m), 1)
    agg = LhcAggregator(cfg, 1000, 1)
    agg.add(torch.from_numpy(p))
    assert np.abs(c.decode(agg.result(), m, 1) - x).max() <= 2.0 ** -R.scale_exponent(m, 1)


def test_exact_fallback_gives_what_a_larger_sketch_gives():
    # q depends on the seed, key, rank, step and scale, not on m: an overloaded sketch finished by
    # the fallback round must give the bits of a sketch large enough to peel
    d, n = 30_000, 3
    small, big = LhcConfig(capacity=200, seed=4), LhcConfig(capacity=20_000, seed=4)
    xs = [sparse(d, 400, 50 + w) for w in range(n)]
    xs[1][np.flatnonzero(xs[0])[:30]] = -xs[0][np.flatnonzero(xs[0])[:30]]  # some cancel
    codecs, total, m = round_trip(small, xs, key=2)
    with pytest.raises(LhcDecodeError) as err:
        codecs[0].decode(total, m, n)
    e = err.value
    assert e.partial.shape == (d,) and not e.partial[e.unresolved].any()
    summed = np.sum([c.fallback_values(e.unresolved) for c in codecs], axis=0, dtype=np.int32)
    done = [c.complete(e, summed, m, n) for c in codecs]
    bc, btotal, bm = round_trip(big, xs, key=2)
    want = bc[0].decode(btotal, bm, n)
    for got in done:
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="summed must be"):
        codecs[0].complete(e, summed[:-1], m, n)
    with pytest.raises(ValueError, match="unresolved must be"):
        codecs[0].fallback_values(np.array([d]))
