"""The CUDA twins (csrc/thc/cuda via byteps_thc.cuda) against the NumPy reference and the CPU core.

GPU tests are skipped where torch sees no CUDA device; the build checks (the extension built with
CUDA imports and answers without a GPU or driver) run wherever the extension has the kernels.
What is pinned (docs/ALGORITHM.md): payload indices equal the reference's except where a rotated
value lies within float rounding of a level boundary (counted and bounded), sums exact, decode
within float tolerance (in fact bit-exact), the residual, the norm, M = 0 and NaN handling.
"""
import math

import numpy as np
import pytest

from byteps_thc import reference as R
from byteps_thc.config import ThcConfig

torch = pytest.importorskip("torch")

try:
    from byteps_thc import _C
    WITH_CUDA = bool(getattr(_C, "with_cuda", False))
except ImportError:  # extension not built
    _C, WITH_CUDA = None, False

from byteps_thc import cuda as thc_cuda  # noqa: E402

needs_ext = pytest.mark.skipif(not WITH_CUDA, reason="byteps_thc._C built without CUDA")
needs_gpu = pytest.mark.skipif(not (WITH_CUDA and torch.cuda.is_available()),
                               reason="no CUDA device (or extension built without CUDA)")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BIG = 1 << 24
SIZES = [1, 1000, (1 << 20) + 5, BIG]


# -- without a GPU: the build ----------------------------------------------------------------------
@needs_ext
def test_extension_imports_without_device():
    k = _C.cuda
    assert isinstance(k.device_count(), int) and k.device_count() >= 0
    assert thc_cuda.built_with_cuda()
    assert thc_cuda.available() == (k.device_count() > 0)


@needs_ext
@pytest.mark.parametrize("d,block", [(1, None), (1000, None), (5, 4), ((1 << 20) + 5, None),
                                     ((1 << 20) + 5, 1024), (BIG, None), (3 * 4096 + 1, 4096)])
def test_geometry_matches_reference(d, block):
    cfg = ThcConfig(rotation_block=block)
    code = thc_cuda.device_code(cfg)
    geo = R.geometry(cfg, d)
    assert _C.cuda.geometry(code, d) == (geo.d, geo.block, geo.padded, geo.payload_bytes)
    chunk = min(max(1 << 22, geo.block), geo.padded)
    assert _C.cuda.workspace_floats(code, d) == (0 if geo.block <= (1 << 14) else chunk)
    for n in (1, 8, 9, 2184, 2185):
        assert _C.cuda.lane_bits(code, n) == cfg.lane_bits(n)


@needs_ext
def test_bad_code_is_refused():
    k = _C.cuda
    with pytest.raises(ValueError, match="table"):
        k.Code(2, 3, 2.0, 1, 0, [0, 2, 1, 3])
    with pytest.raises(ValueError, match="levels"):
        k.Code(2, 3, 2.0, 1, 0, [0, 1, 3])
    with pytest.raises(ValueError, match="power of two"):
        k.Code(2, 3, 2.0, 1, 3, [0, 1, 2, 3])
    code = thc_cuda.device_code(ThcConfig())
    with pytest.raises(ValueError, match="grad and payload"):  # checked before any CUDA call
        k.encode(code, 0, 0, 0, 10, 0, 0, 1.0, 0, 0, 0, 0, 0)


@needs_ext
def test_core_config_converts():
    from byteps_thc import codec
    cfg = ThcConfig(bits=3, granularity=16, rotation_block=256)
    code = _C.cuda.code_from_config(codec._core_config(cfg))
    assert (code.bits, code.granularity, code.rotation_block) == (3, 16, 256)
    assert code.clip == pytest.approx(cfg.clip, rel=0, abs=0)


# -- helpers -------------------------------------------------------------------------------------
def _inputs(d, seed, dtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(d) * rng.lognormal(0, 1, d)).astype(np.float32)
    xt = torch.from_numpy(x).to(DTYPES[dtype])
    res = (rng.standard_normal(d) * 0.05).astype(np.float32)
    return xt.float().numpy(), xt, res  # the reference sees exactly what the GPU loads


def _reference_levels(cfg, x, res, m, rank, step):
    """t_j, p_j and u_j of the reference encode (docs/ALGORITHM.md steps 3-5)."""
    geo = R.geometry(cfg, x.size)
    xp = R._padded_input(cfg, x, res, geo)
    y = R.fwht(R.apply_signs(xp, R.sign_bits(cfg.seed, geo.padded)), geo.block)
    g, T, B, dp = cfg.granularity, cfg.clip, geo.block, geo.padded
    c1 = np.float32(g / (2.0 * T) * math.sqrt(dp) / m / math.sqrt(B))
    t = np.minimum(np.maximum(y * c1 + np.float32(g / 2.0), np.float32(0)), np.float32(g))
    tbl, lvl, ig = R._tables(cfg)
    i = np.minimum(lvl[t.astype(np.int64)], tbl.size - 2)
    p = (t - tbl[i].astype(np.float32)) * ig[i]
    return t, p, R.uniforms(cfg.seed, rank, step, dp), tbl


def _compare_indices(cfg, got_payload, ref_q, x, res, m, rank, step):
    """Indices equal except within float rounding of a boundary; returns the mismatch count."""
    n = ref_q.size
    got = R.unpack(got_payload, cfg.bits, n)
    bad = np.nonzero(got != ref_q)[0]
    if bad.size:
        t, p, u, tbl = _reference_levels(cfg, x, res, m, rank, step)
        near_round = np.abs(p[bad] - u[bad]) <= 1e-5
        near_level = np.min(np.abs(t[bad, None] - tbl[None, :].astype(np.float32)), axis=1) <= 1e-4
        assert np.all(np.abs(got[bad].astype(int) - ref_q[bad].astype(int)) <= 1), bad[:10]
        assert np.all(near_round | near_level), bad[~(near_round | near_level)][:10]
        assert bad.size <= max(2, n // 100000), f"{bad.size} of {n} indices differ"
    return int(bad.size)


# -- encode ------------------------------------------------------------------------------------
ENCODE_CASES = ([(d, b, "float32", None) for d in SIZES for b in (2, 4, 8)]
                + [(d, 4, dt, None) for d in SIZES for dt in ("float16", "bfloat16")]
                + [(d, b, dt, None) for d in (1000, (1 << 20) + 5) for b in (2, 8)
                   for dt in ("float16", "bfloat16")]
                + [((1 << 20) + 5, 4, "float32", 1024), (70001, 4, "float32", 16384),
                   (BIG, 4, "float32", 1 << 20), (BIG + 3, 4, "bfloat16", 1 << 17),
                   (40000, 3, "float32", 8192), (5, 4, "float32", 4)])


@needs_gpu
@pytest.mark.parametrize("d,bits,dtype,block", ENCODE_CASES)
def test_encode_matches_reference(d, bits, dtype, block):
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1), rotation_block=block)
    x, xt, res = _inputs(d, d + bits, dtype)
    rank, step = 5, 3
    enc = thc_cuda.CudaCodec(cfg, d, rank)
    enc.step = step
    enc.residual.copy_(torch.from_numpy(res))
    m = enc.norm(xt.cuda())
    assert m == pytest.approx(R.norm(x, res), rel=1e-9)
    payload = enc.encode(xt.cuda(), m)
    assert enc.step == step + 1
    ref_payload, ref_res, ref_q = R.encode(cfg, x, m, rank, step, res)
    got_payload = payload.cpu().numpy()
    assert got_payload.size == ref_payload.size
    mism = _compare_indices(cfg, got_payload, ref_q, x, res, m, rank, step)
    if mism == 0:
        assert np.array_equal(got_payload, ref_payload)
        got_res = enc.residual.cpu().numpy()
        np.testing.assert_allclose(got_res, ref_res, rtol=1e-5, atol=1e-6 * max(m, 1e-30))


@needs_gpu
@pytest.mark.parametrize("d,block,fused,colmax,chunk", [
    (70001, None, 12, 2, 22), ((1 << 16) + 3, None, 12, 1, 22), (8192, None, 12, 1, 22),
    (20000, None, 12, 3, 22), ((1 << 20) + 5, None, 12, 3, 22), ((1 << 20) + 5, 1 << 15, 14, 11, 16),
    ((1 << 18) + 77, 1 << 16, 12, 2, 17), ((1 << 20) + 5, 1 << 17, 14, 11, 22)])
def test_forced_passes(d, block, fused, colmax, chunk):
    """Blocks split into many transform passes (the middle passes of blocks beyond 2^23) and
    tensors into several chunks (the last one partial)."""
    cfg = ThcConfig(rotation_block=block)
    x, xt, res = _inputs(d, 7, "float32")
    enc = thc_cuda.CudaCodec(cfg, d, 1, fused_max_log=fused, column_max_bits=colmax,
                             chunk_log=chunk)
    enc.residual.copy_(torch.from_numpy(res))
    m = enc.norm(xt.cuda())
    payload = enc.encode(xt.cuda(), m).cpu().numpy()
    ref_payload, ref_res, ref_q = R.encode(cfg, x, m, 1, 0, res)
    if _compare_indices(cfg, payload, ref_q, x, res, m, 1, 0) == 0:
        np.testing.assert_allclose(enc.residual.cpu().numpy(), ref_res, rtol=1e-5, atol=1e-6 * m)
    sums = R.aggregate(cfg, [ref_payload], d, 3)
    got = enc.decode(torch.from_numpy(sums).cuda(), m, 3).cpu().numpy()
    np.testing.assert_allclose(got, R.decode(cfg, sums, d, 3, m), rtol=1e-6, atol=1e-7 * m)


@needs_gpu
@pytest.mark.parametrize("d", [1000, (1 << 20) + 5])
def test_matches_cpu_core_over_steps(d):
    """Two steps with error feedback: payloads equal the CPU extension's (residuals evolve alike)."""
    from byteps_thc import ThcCodec
    cfg = ThcConfig()
    gpu, cpu = thc_cuda.CudaCodec(cfg, d, 2), ThcCodec(cfg, d, 2)
    for step in range(2):
        x = np.random.default_rng(step).standard_normal(d).astype(np.float32)
        m = cpu.norm(x)
        assert gpu.norm(torch.from_numpy(x).cuda()) == pytest.approx(m, rel=1e-9)
        want = cpu.encode(x, m)
        got = gpu.encode(torch.from_numpy(x).cuda(), m).cpu().numpy()
        diff = np.count_nonzero(R.unpack(got, cfg.bits, d) != R.unpack(want, cfg.bits, d))
        assert diff <= max(2, d // 100000)
        np.testing.assert_allclose(gpu.residual.cpu().numpy(), cpu.residual, rtol=1e-4,
                                   atol=1e-5 * m)


# -- aggregate / decode --------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("d", SIZES[:3])
@pytest.mark.parametrize("bits,granularity,n", [(2, 30, 3), (4, 30, 8), (4, 30, 9), (8, 255, 1),
                                                (2, 70000, 2)])
def test_aggregate_exact(d, bits, granularity, n):
    cfg = ThcConfig(bits=bits, granularity=granularity)
    nbytes = R.geometry(cfg, d).payload_bytes
    rng = np.random.default_rng(d + n)
    payloads = [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(n)]
    want = R.aggregate(cfg, payloads, d, n)
    stacked = torch.from_numpy(np.stack(payloads)).cuda()
    got = thc_cuda.aggregate(cfg, stacked, d, n)
    assert got.dtype == {8: torch.uint8, 16: torch.uint16, 32: torch.uint32}[cfg.lane_bits(n)]
    assert np.array_equal(got.cpu().numpy(), want)
    agg = thc_cuda.CudaAggregator(cfg, d, n)
    for p in payloads:
        agg.add(torch.from_numpy(p).cuda())
    assert np.array_equal(agg.result().cpu().numpy(), want)
    with pytest.raises(ValueError):
        agg.add(torch.from_numpy(payloads[0]).cuda())


@needs_gpu
@pytest.mark.parametrize("d", SIZES)
@pytest.mark.parametrize("bits,n", [(2, 1), (4, 4), (8, 9)])
def test_decode_matches_reference(d, bits, n):
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1))
    geo = R.geometry(cfg, d)
    rng = np.random.default_rng(d * bits + n)
    sums = rng.integers(0, n * cfg.granularity + 1, geo.padded).astype(R.lane_dtype(cfg, n))
    m = 3.75
    want = R.decode(cfg, sums, d, n, m)
    dec = thc_cuda.CudaCodec(cfg, d)
    st = torch.from_numpy(sums).cuda()
    got = dec.decode(st, m, n).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * m)
    exact = np.count_nonzero(got.view(np.uint32) == want.view(np.uint32))
    assert exact >= 0.999 * d  # the same float operations in the same order: bit-exact
    for dt in (torch.float16, torch.bfloat16):
        cast = dec.decode(st, m, n, out_dtype=dt)
        assert torch.equal(cast, torch.from_numpy(got).cuda().to(dt))


# -- special cases -------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("d", [1000, (1 << 20) + 5])
def test_max_norm_zero(d):
    cfg = ThcConfig()
    x, xt, res = _inputs(d, 1, "float32")
    enc = thc_cuda.CudaCodec(cfg, d)
    enc.residual.copy_(torch.from_numpy(res))
    payload = enc.encode(xt.cuda(), 0.0)
    assert not payload.any()
    np.testing.assert_array_equal(enc.residual.cpu().numpy(), x + res)
    out = enc.decode(torch.zeros(enc.padded, dtype=torch.uint8, device="cuda"), 0.0, 1)
    assert not out.any()


@needs_gpu
@pytest.mark.parametrize("d", [1000, (1 << 20) + 5])
def test_non_finite_leaves_state(d):
    cfg = ThcConfig()
    x, xt, res = _inputs(d, 2, "float32")
    x[d // 2] = np.nan
    enc = thc_cuda.CudaCodec(cfg, d)
    enc.residual.copy_(torch.from_numpy(res))
    with pytest.raises(ValueError, match="NaN"):
        enc.norm(torch.from_numpy(x).cuda())
    out = torch.full((enc.payload_bytes,), 7, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="NaN"):
        enc.encode(torch.from_numpy(x).cuda(), 1.0, out=out)
    assert enc.step == 0 and bool((out == 7).all())
    np.testing.assert_array_equal(enc.residual.cpu().numpy(), res)
    x[d // 2] = 1.0
    with pytest.raises(ValueError, match="max_norm"):
        enc.encode(torch.from_numpy(x).cuda(), float("inf"), out=out)
    assert enc.step == 0 and bool((out == 7).all())


@needs_gpu
def test_device_max_norm_and_no_sync():
    """max_norm left on the device (norm with sync=False) gives the same payload as a float."""
    cfg = ThcConfig()
    d = 50000
    x = torch.randn(d, device="cuda")
    a, b = thc_cuda.CudaCodec(cfg, d), thc_cuda.CudaCodec(cfg, d)
    m_dev = a.norm(x, sync=False)
    pa = a.encode(x, m_dev, check=False)
    pb = b.encode(x, float(m_dev.item()))
    assert a.status() == 0
    assert torch.equal(pa, pb)
    assert torch.equal(a.residual, b.residual)


@needs_gpu
def test_round_homomorphic():
    """n workers on the GPU: decode(sum of encodes) equals the reference round."""
    cfg = ThcConfig(error_feedback=False)
    d, n = 30000, 4
    grads = [np.random.default_rng(i).standard_normal(d).astype(np.float32) for i in range(n)]
    want, _ = R.simulate_round(cfg, grads)
    encs = [thc_cuda.CudaCodec(cfg, d, i) for i in range(n)]
    m = max(e.norm(torch.from_numpy(g).cuda()) for e, g in zip(encs, grads))
    payloads = [e.encode(torch.from_numpy(g).cuda(), m) for e, g in zip(encs, grads)]
    sums = thc_cuda.aggregate(cfg, payloads, d, n)
    got = encs[0].decode(sums, m, n).cpu().numpy()
    scale = np.abs(want).max()
    assert np.max(np.abs(got - want)) <= 1e-5 * scale
