"""The CUDA twins (csrc/thc/cuda, byteps_thc.thc.cuda) against the NumPy reference and the CPU core.

GPU tests are skipped where torch sees no CUDA device; the build checks (the extension built with
CUDA imports and answers without a GPU or driver) run wherever the extension has the kernels.
What is pinned (docs/ALGORITHM.md): payload indices equal the reference's except where a rotated
value lies within float rounding of a level boundary (counted and bounded), sums exact, decode
within float tolerance (in fact bit-exact), the rotated error-feedback state (d_pad floats), the
norm (with error feedback: sqrt(sum y^2 / B)), M = 0, NaN and overflow handling.
"""
import dataclasses
import math

import numpy as np
import pytest

from byteps_thc.thc import reference as R
from byteps_thc.thc.config import ThcConfig, next_pow2

torch = pytest.importorskip("torch")

try:
    from byteps_thc import _C
    WITH_CUDA = bool(getattr(_C, "with_cuda", False))
except ImportError:  # extension not built
    _C, WITH_CUDA = None, False

from byteps_thc.thc import cuda as thc_cuda  # noqa: E402

needs_ext = pytest.mark.skipif(not WITH_CUDA, reason="byteps_thc._C built without CUDA")
needs_gpu = pytest.mark.needs_gpu  # a CUDA device and the extension's kernels (conftest.py)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BIG = 1 << 24
SIZES = [1, 1000, (1 << 20) + 5, BIG]


# -- without a GPU: the build ----------------------------------------------------------------------
def test_bad_block_norm_names_the_value():
    """block_scale's max norms checked on the host (CudaCodec before it copies them to the device,
    and after a device check flagged one): the first bad block and its value are named."""
    assert thc_cuda._bad_block_norm(np.array([1.0, 0.0, 2.5])) == ""
    msg = thc_cuda._bad_block_norm(np.array([1.0, 2.0, np.nan, -3.0]))
    assert msg == ("block_scale: the max norm of block 2 must be finite and >= 0, got nan "
                   "(and 1 more)")
    assert "block 0" in thc_cuda._bad_block_norm(np.array([-0.5]))
    assert thc_cuda._bad_block_norm(np.array([-0.5])).endswith("got -0.5")
    assert "block 1 " in thc_cuda._bad_block_norm(torch.tensor([1.0, float("inf")],
                                                                dtype=torch.float64))


def test_block_scale_layouts_blocks_of_at_least_32():
    """block_scale's one-size layout: the core's block, at least 32 (a smaller partition stays
    one block of next_pow2(d), which the kernels cap the block at)."""
    bs = ThcConfig(block_scale=True)
    assert thc_cuda._one_block_size(bs, 10).rotation_block == 32
    assert thc_cuda._one_block_size(bs, 1000).rotation_block == 1024
    assert thc_cuda._one_block_size(dataclasses.replace(bs, rotation_block=256),
                                    40000).rotation_block == 256


def test_tiled_partitions_are_refused_by_name():
    """The kernels rotate in blocks of one size: a partition that the core's default rule tiles
    with a smaller last block is refused with the remedy; a one-size layout passes, its block the
    core's (no GPU needed: this runs before any kernel)."""
    with pytest.raises(ValueError, match="a partition of 40000 values is tiled by blocks of 32768 "
                                         "and a last block of 8192.*give a rotation_block"):
        thc_cuda._one_block_size(ThcConfig(), 40000)
    assert thc_cuda._one_block_size(ThcConfig(), 1 << 20).rotation_block == 1 << 20
    assert thc_cuda._one_block_size(ThcConfig(), 1000).rotation_block == 1024
    assert thc_cuda._one_block_size(ThcConfig(rotation_block=1024), 40000).rotation_block == 1024


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
    cfg = ThcConfig(rotation_block=block or next_pow2(d))
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
    cfg = ThcConfig(bits=3, granularity=16, rotation_block=256)
    code = _C.cuda.code_from_config(_C.core_config(cfg))
    assert (code.bits, code.granularity, code.rotation_block) == (3, 16, 256)
    assert code.clip == pytest.approx(cfg.clip, rel=0, abs=0)
    assert not code.block_scale
    code = _C.cuda.code_from_config(_C.core_config(dataclasses.replace(cfg, block_scale=True)))
    assert code.block_scale
    # one max norm per rotation block: 40000 values in blocks of 256 pad to 157 blocks
    assert _C.cuda.num_blocks(code, 40000) == 157 == R.num_blocks(
        dataclasses.replace(cfg, block_scale=True), 40000)
    with pytest.raises(ValueError, match="block_scale needs rotation blocks of at least 32 "
                                         "coordinates, got rotation_block=16"):
        _C.cuda.Code(2, 3, 2.0, 1, 16, [0, 1, 2, 3], block_scale=True)


# -- helpers -------------------------------------------------------------------------------------
# The kernels rotate in blocks of one size (a partition that the core's default rule tiles is
# refused above), so every test below gives a block: its own, or next_pow2(d), one block.
def _inputs(d, seed, dtype, cfg=None):
    """(x as float32, x as a tensor of dtype, a rotated state r of d_pad floats)."""
    geo = R.geometry(cfg or ThcConfig(rotation_block=next_pow2(d)), d)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(d) * rng.lognormal(0, 1, d)).astype(np.float32)
    xt = torch.from_numpy(x).to(DTYPES[dtype])
    # A state like a step's rounding error: rotated, so about sqrt(B) times the textbook one.
    res = (rng.standard_normal(geo.padded) * 0.05 * math.sqrt(geo.block)).astype(np.float32)
    return xt.float().numpy(), xt, res  # the reference sees exactly what the GPU loads


def _reference_levels(cfg, x, res, m, rank, step):
    """t_j, p_j and u_j of the reference encode (docs/ALGORITHM.md steps 2-5); with block_scale
    m holds M_k of each block (blocks of one size here), each block a partition of d_pad = B."""
    geo = R.geometry(cfg, x.size)
    y = R.rotate(cfg, x, res)
    g, T, B, dp = cfg.granularity, cfg.clip, geo.block, geo.padded
    if cfg.block_scale:
        mk = np.asarray(m, dtype=np.float64)
        c1 = np.repeat(np.where(mk > 0, g / (2.0 * T) * math.sqrt(B) / np.where(mk > 0, mk, 1.0)
                                / math.sqrt(B), 0.0).astype(np.float32), B)
    else:
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
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1),
                    rotation_block=block or next_pow2(d))
    x, xt, res = _inputs(d, d + bits, dtype, cfg)
    rank, step = 5, 3
    enc = thc_cuda.CudaCodec(cfg, d, rank)
    assert enc.residual.shape == (R.geometry(cfg, d).padded,)
    enc.step = step
    enc.residual.copy_(torch.from_numpy(res))
    m = enc.norm(xt.cuda())
    assert m == pytest.approx(R.norm(x, res, cfg), rel=1e-9)
    payload = enc.encode(xt.cuda(), m)
    assert enc.step == step + 1
    ref_payload, ref_res, ref_q = R.encode(cfg, x, m, rank, step, res)
    got_payload = payload.cpu().numpy()
    assert got_payload.size == ref_payload.size
    mism = _compare_indices(cfg, got_payload, ref_q, x, res, m, rank, step)
    if mism == 0:
        assert np.array_equal(got_payload, ref_payload)
        got_res = enc.residual.cpu().numpy()  # y - deq(q): the same float ops, bit for bit
        assert np.array_equal(got_res.view(np.uint32), ref_res.view(np.uint32))


@needs_gpu
@pytest.mark.parametrize("d,block,fused,colmax,chunk", [
    (70001, None, 12, 2, 22), ((1 << 16) + 3, None, 12, 1, 22), (8192, None, 12, 1, 22),
    (20000, None, 12, 3, 22), ((1 << 20) + 5, None, 12, 3, 22),
    ((1 << 20) + 5, 1 << 15, 14, 11, 16),
    ((1 << 18) + 77, 1 << 16, 12, 2, 17), ((1 << 20) + 5, 1 << 17, 14, 11, 22)])
def test_forced_passes(d, block, fused, colmax, chunk):
    """Blocks split into many transform passes (the middle passes of blocks beyond 2^23) and
    tensors into several chunks (the last one partial)."""
    cfg = ThcConfig(rotation_block=block or next_pow2(d))
    x, xt, res = _inputs(d, 7, "float32", cfg)
    enc = thc_cuda.CudaCodec(cfg, d, 1, fused_max_log=fused, column_max_bits=colmax,
                             chunk_log=chunk)
    enc.residual.copy_(torch.from_numpy(res))
    m = enc.norm(xt.cuda())
    assert m == pytest.approx(R.norm(x, res, cfg), rel=1e-9)
    payload = enc.encode(xt.cuda(), m).cpu().numpy()
    ref_payload, ref_res, ref_q = R.encode(cfg, x, m, 1, 0, res)
    if _compare_indices(cfg, payload, ref_q, x, res, m, 1, 0) == 0:
        assert np.array_equal(enc.residual.cpu().numpy().view(np.uint32), ref_res.view(np.uint32))
    sums = R.aggregate(cfg, [ref_payload], d, 3)
    got = enc.decode(torch.from_numpy(sums).cuda(), m, 3).cpu().numpy()
    np.testing.assert_allclose(got, R.decode(cfg, sums, d, 3, m), rtol=1e-6, atol=1e-7 * m)


@needs_gpu
@pytest.mark.parametrize("d", [1000, (1 << 20) + 5])
def test_matches_cpu_core_over_steps(d):
    """Two steps with error feedback: payloads equal the CPU extension's (residuals evolve
    alike)."""
    from byteps_thc import ThcCodec
    cfg = ThcConfig(rotation_block=next_pow2(d))
    gpu, cpu = thc_cuda.CudaCodec(cfg, d, 2), ThcCodec(cfg, d, 2)
    ok = True  # coordinates whose indices agreed in every step so far
    for step in range(2):
        x = np.random.default_rng(step).standard_normal(d).astype(np.float32)
        m = cpu.norm(x)
        # Both rotate in float32, in different orders: each of the log2(B) butterfly stages adds
        # at most 2^-24 of the vector's norm, so each norm is within log2(B) * 2^-24 of the exact.
        bound = 2 * math.log2(cfg.rotation_block) * 2.0 ** -24
        assert gpu.norm(torch.from_numpy(x).cuda()) == pytest.approx(m, rel=bound)
        want = cpu.encode(x, m)
        got = gpu.encode(torch.from_numpy(x).cuda(), m).cpu().numpy()
        n = R.geometry(cfg, d).padded
        same = R.unpack(got, cfg.bits, n) == R.unpack(want, cfg.bits, n)
        assert np.count_nonzero(~same) <= max(2, d // 100000)
        # The state is per coordinate (rotated): where the indices agreed it agrees bit for bit
        # (a differing index only moves its own coordinate's state, by one level).
        g_res, c_res = gpu.residual.cpu().numpy(), np.asarray(cpu.residual)
        assert g_res.shape == c_res.shape == (n,)
        ok = ok & same
        assert np.array_equal(g_res[ok].view(np.uint32), c_res[ok].view(np.uint32))
        np.testing.assert_allclose(g_res, c_res, rtol=1e-4, atol=0.2 * m)


# -- aggregate / decode --------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("d", SIZES[:3])
@pytest.mark.parametrize("bits,granularity,n", [(2, 30, 3), (4, 30, 8), (4, 30, 9), (8, 255, 1),
                                                (2, 70000, 2)])
def test_aggregate_exact(d, bits, granularity, n):
    # blocks of one size: the kernels do not lay out the default tiling's smaller last block
    cfg = ThcConfig(bits=bits, granularity=granularity, rotation_block=next_pow2(d))
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
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1), rotation_block=next_pow2(d))
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
    cfg = ThcConfig(rotation_block=next_pow2(d))
    x, xt, res = _inputs(d, 1, "float32", cfg)
    enc = thc_cuda.CudaCodec(cfg, d)
    enc.residual.copy_(torch.from_numpy(res))
    payload = enc.encode(xt.cuda(), 0.0)
    assert not payload.any()
    got = enc.residual.cpu().numpy()  # the new state is y, bit for bit
    assert np.array_equal(got.view(np.uint32), R.rotate(cfg, x, res).view(np.uint32))
    out = enc.decode(torch.zeros(enc.padded, dtype=torch.uint8, device="cuda"), 0.0, 1)
    assert not out.any()


@needs_gpu
@pytest.mark.parametrize("d", [1000, (1 << 20) + 5])
def test_non_finite_leaves_state(d):
    cfg = ThcConfig(rotation_block=next_pow2(d))
    x, xt, res = _inputs(d, 2, "float32", cfg)
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
@pytest.mark.parametrize("d,block", [(1000, None), (20000, 1024), ((1 << 20) + 5, None)])
def test_overflow_leaves_state(d, block):
    """y = Hu(sign*grad) + r overflowing float32: norm and encode raise, and the state, payload
    and step are unchanged (the norm flags it; the encode after it writes nothing)."""
    cfg = ThcConfig(rotation_block=block or next_pow2(d))
    geo = R.geometry(cfg, d)
    x = np.random.default_rng(3).standard_normal(d).astype(np.float32)
    x[geo.padded - geo.block:][:64] = np.float32(3e38)  # in the last block
    with pytest.raises(ValueError, match="overflow"):
        R.norm(x, R.initial_residual(cfg, d), cfg)
    res = _inputs(d, 3, "float32", cfg)[2]
    enc = thc_cuda.CudaCodec(cfg, d)
    enc.residual.copy_(torch.from_numpy(res))
    xt = torch.from_numpy(x).cuda()
    with pytest.raises(ValueError, match="overflow"):
        enc.norm(xt)
    out = torch.full((enc.payload_bytes,), 7, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="overflow"):
        enc.encode(xt, 1.0, out=out)
    assert enc.step == 0 and bool((out == 7).all())
    np.testing.assert_array_equal(enc.residual.cpu().numpy(), res)
    with pytest.raises(ValueError, match="overflow"):  # k1 = Inf: refused before any write
        enc.encode(torch.from_numpy(np.ones(d, np.float32)).cuda(), 1e300, out=out)
    assert enc.step == 0 and bool((out == 7).all())
    np.testing.assert_array_equal(enc.residual.cpu().numpy(), res)


@needs_gpu
def test_device_max_norm_and_no_sync():
    """max_norm left on the device (norm with sync=False) gives the same payload as a float."""
    cfg = ThcConfig(rotation_block=1 << 16)  # d below: one block
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
    m = max(R.norm(g) for g in grads)  # the reference's M (binary64 sums may differ in order)
    for e, g in zip(encs, grads):
        assert e.norm(torch.from_numpy(g).cuda()) == pytest.approx(R.norm(g), rel=1e-9)
    payloads = [e.encode(torch.from_numpy(g).cuda(), m) for e, g in zip(encs, grads)]
    sums = thc_cuda.aggregate(cfg, payloads, d, n)
    got = encs[0].decode(sums, m, n).cpu().numpy()
    scale = np.abs(want).max()
    assert np.max(np.abs(got - want)) <= 1e-5 * scale


@needs_gpu
def test_public_api_keeps_cuda_tensors_on_the_device():
    """ThcCodec / ThcAggregator given CUDA tensors run the CUDA kernels and return CUDA tensors."""
    from byteps_thc import ThcAggregator, ThcCodec
    cfg = ThcConfig()
    d, n = 5000, 2
    grads = [torch.from_numpy(np.random.default_rng(i).standard_normal(d).astype(np.float32)).cuda()
             for i in range(n)]
    codecs = [ThcCodec(cfg, d, rank=i) for i in range(n)]
    m = max(c.norm(g) for c, g in zip(codecs, grads))
    agg = ThcAggregator(cfg, d, n)
    for c, g in zip(codecs, grads):
        p = c.encode(g, m)
        assert p.is_cuda
        agg.add(p)
    sums = agg.result()
    assert sums.is_cuda
    out = codecs[0].decode(sums, m, n)
    assert out.is_cuda and codecs[0].step == 1
    twin = thc_cuda.CudaCodec(cfg, d, 0)
    twin.norm(grads[0])
    ref = thc_cuda.aggregate(cfg, [twin.encode(grads[0], m),
                                   thc_cuda.CudaCodec(cfg, d, 1).encode(grads[1], m)], d, n)
    assert torch.equal(ref, sums)


# -- block_scale: one max norm per rotation block ----------------------------------------------
@needs_gpu
@pytest.mark.parametrize("d,block,ef,dtype", [
    (300_001, 1 << 14, True, "float32"), (70_001, 1024, False, "bfloat16"),
    ((1 << 20) + 5, 1 << 16, True, "float32"), (5000, 32, True, "float16")])
def test_block_scale_matches_reference(d, block, ef, dtype):
    """CudaCodec with block_scale: the block norms (a NumPy array), the encode with host M_k (one
    of them 0), the decode with M_k on the device, against reference.py's block functions under
    the rules of the one-norm tests above."""
    cfg = ThcConfig(rotation_block=block, block_scale=True, error_feedback=ef)
    x, xt, res = _inputs(d, d + 1, dtype, cfg)
    res = res if ef else None
    nb = R.num_blocks(cfg, d)
    enc = thc_cuda.CudaCodec(cfg, d, 5)
    assert enc.blocks == nb
    if ef:
        enc.residual.copy_(torch.from_numpy(res))
    norms = enc.norm(xt.cuda())
    assert isinstance(norms, np.ndarray) and norms.shape == (nb,)
    want_norms = R.block_norms(x, res, cfg)
    np.testing.assert_allclose(norms, want_norms, rtol=1e-9)
    m = want_norms * np.random.default_rng(d).uniform(1.0, 1.5, nb)
    m[nb // 2] = 0.0
    payload = enc.encode(xt.cuda(), m).cpu().numpy()
    assert enc.step == 1
    want_p, want_r, want_q = R.encode(cfg, x, m, 5, 0, res)
    if _compare_indices(cfg, payload, want_q, x, res, m, 5, 0) == 0:
        assert np.array_equal(payload, want_p)
        if ef:
            got_r = enc.residual.cpu().numpy()
            assert np.array_equal(got_r.view(np.uint32), want_r.view(np.uint32))
    sums = R.aggregate(cfg, [want_p] * 3, d, 3)
    got = enc.decode(torch.from_numpy(sums).cuda(), torch.from_numpy(m).cuda(), 3).cpu().numpy()
    want = R.decode(cfg, sums, d, 3, m)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * m.max())
    assert np.count_nonzero(got.view(np.uint32) == want.view(np.uint32)) >= 0.999 * d


@needs_gpu
def test_block_scale_refusals_name_the_value():
    """A wrong number of M_k, one number, or a bad M_k (on the host: before anything runs; on the
    device: found by the kernels' check) raise ValueError naming the block and its value; the
    step and the residual are unchanged."""
    cfg = ThcConfig(rotation_block=1024, block_scale=True)
    d = 5000  # 5 blocks
    enc = thc_cuda.CudaCodec(cfg, d)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(d).astype(np.float32)).cuda()
    enc.norm(x)
    with pytest.raises(ValueError, match=r"one max norm per rotation block \(5\), got shape "
                                         r"\(4,\)"):
        enc.encode(x, np.ones(4))
    with pytest.raises(ValueError, match=r"\(5\), got a number"):
        enc.encode(x, 1.0)
    m = np.ones(5)
    m[3] = np.nan
    with pytest.raises(ValueError, match="the max norm of block 3 must be finite and >= 0, "
                                         "got nan"):
        enc.encode(x, m)
    dev = torch.ones(5, dtype=torch.float64, device="cuda")
    dev[2] = -1.0
    with pytest.raises(ValueError, match="the max norm of block 2 must be finite and >= 0, "
                                         "got -1.0"):
        enc.encode(x, dev)
    assert enc.step == 0 and not enc.residual.any()
    sums = torch.zeros(enc.padded, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="block 2 must be finite"):
        enc.decode(sums, dev, 1)


# -- without a GPU: the kernels' own code under a CPU emulation ------------------------------------
# csrc/thc/cuda/emulate.h runs tile.cuh's kernels with one std::thread per CUDA thread and a barrier
# for __syncthreads; launch.cu (planning, passes, chunks) and the bindings are compiled unchanged.
# "Device pointers" are then host pointers. Bit-exact against the reference: payload, residual,
# decode (fp32 and the bf16/fp16 cast).
def _emulation_module():
    import concurrent.futures
    import hashlib
    import importlib.util
    import shutil
    import subprocess
    import sysconfig
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    cuda_dir = root / "csrc" / "thc" / "cuda"
    cuda_inc = None
    for home in (Path("/usr/local/cuda"),):
        if (home / "include" / "cuda_runtime.h").exists():
            cuda_inc, cuda_lib = home / "include", home / "lib64"
    cxx = shutil.which("g++") or shutil.which("c++")
    try:
        import pybind11
    except ImportError:
        pybind11 = None
    if cuda_inc is None or cxx is None or pybind11 is None:
        pytest.skip("needs g++, pybind11 and the CUDA headers")
    srcs = [cuda_dir / f for f in (
        "rotate.cu", "encode.cu", "decode.cu", "hadamard.cu", "launch.cu", "emulate.cc")]
    srcs.append(root / "csrc" / "python" / "binding_cuda.cc")
    srcs.append(root / "csrc" / "thc" / "config.cc")  # thc::StatusText, for status_text()
    # the codec's build description: the kernels as C++ get the core's flags (csrc/build_facts.py)
    facts_py = root / "csrc" / "build_facts.py"
    spec = importlib.util.spec_from_file_location("build_facts", facts_py)
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    h = hashlib.sha256()
    common = sorted((root / "csrc" / "common").glob("*.h"))  # what common.cuh and thc.h include
    for p in sorted(cuda_dir.glob("*")) + srcs + common + [facts_py]:
        if p.is_file():
            h.update(p.read_bytes())
    out = root / "build" / "thc_cuda_emu" / h.hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    lib = out / f"_thc_cuda_emu{suffix}"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        flags = [*facts.CODEC, "-fPIC", "-pthread", "-DTHC_CUDA_EMULATE",
                 "-Wno-attributes", f"-I{root / 'csrc'}", f"-I{cuda_inc}",
                 f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]

        def compile_one(src):
            obj = out / (src.stem + ".o")
            subprocess.run([cxx, *flags, "-x", "c++", "-c", str(src), "-o", str(obj)], check=True,
                           capture_output=True, text=True)
            return str(obj)
        try:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                objs = list(pool.map(compile_one, srcs))
            subprocess.run([cxx, "-shared", "-pthread", *objs, "-o", str(lib) + ".tmp",
                            f"-L{cuda_lib}", "-lcudart", f"-Wl,-rpath,{cuda_lib}"], check=True,
                           capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            pytest.fail(f"emulation build failed: {e.stderr[-3000:]}")
        Path(str(lib) + ".tmp").rename(lib)
    spec = importlib.util.spec_from_file_location("_thc_cuda_emu", lib)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cuda


@pytest.fixture(scope="module")
def emu():
    return _emulation_module()


def _aligned_workspace(k, code, d):
    ws = np.zeros(max(1, k.workspace_floats(code, d)) + 4, np.float32)
    ptr = ws.ctypes.data
    return ws, ptr + (-ptr) % 16


EMU_CASES = [
    dict(d=1), dict(d=3, block=2), dict(d=5, block=4, bits=3), dict(d=1000), dict(d=1000, bits=8),
    dict(d=1000, bits=2, ef=False), dict(d=1000, bits=1), dict(d=5000, block=1024, bits=5),
    dict(d=9000), dict(d=9000, dtype="bfloat16"), dict(d=3000, dtype="float16"), dict(d=20000),
    dict(d=1000, m=0.0), dict(d=1000, m=0.0, ef=False),
    dict(d=20000, m=0.0, kw=dict(fused_max_log=12)),
    dict(d=40001, kw=dict(fused_max_log=12, column_max_bits=2)),
    dict(d=40001, ef=False, dtype="float16", kw=dict(fused_max_log=12, column_max_bits=2)),
    dict(d=(1 << 16) + 77, block=1 << 15, kw=dict(chunk_log=16)),
    dict(d=(1 << 16) + 77, block=1 << 15, m=0.0, dtype="bfloat16", kw=dict(chunk_log=16)),
    dict(d=(1 << 16) + 5, block=1 << 15, bits=8, kw=dict(chunk_log=15, column_max_bits=1)),
]


def _emu_code(k, cfg, **kw):
    return k.code_from_config(_C.core_config(cfg), **kw)


def _emu_grad(k, xt, dtype):
    """(array whose buffer the kernels read, dtype code)."""
    xin = xt.numpy() if dtype == "float32" else xt.view(torch.int16).numpy()
    return xin, {"float32": k.FLOAT32, "float16": k.FLOAT16, "bfloat16": k.BFLOAT16}[dtype]


def _emu_norm(k, code, xin, dt, r, d, wsp):
    """(norm, status) of the emulated norm launch; the status word starts non-zero (cleared)."""
    out = np.full(1, np.nan, np.float64)
    status = np.full(1, 0x70, np.int32)
    k.norm(code, xin.ctypes.data, dt, r.ctypes.data, d, out.ctypes.data, wsp, status.ctypes.data, 0)
    return float(out[0]), int(status[0])


@pytest.mark.parametrize("case", EMU_CASES,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_emulated_kernels_bit_exact(emu, case):
    k = emu
    d, bits, block = case["d"], case.get("bits", 4), case.get("block")
    ef, kw, dtype = case.get("ef", True), case.get("kw", {}), case.get("dtype", "float32")
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1),
                    rotation_block=block or next_pow2(d), error_feedback=ef)
    code = _emu_code(k, cfg, **kw)
    x, xt, res = _inputs(d, d, dtype, cfg)
    res = res if ef else None
    geo = R.geometry(cfg, d)
    ws, wsp = _aligned_workspace(k, code, d)
    xin, dt = _emu_grad(k, xt, dtype)
    if ef:  # the norm with error feedback runs the tile kernels: sqrt(sum y^2 / B)
        got_norm, st = _emu_norm(k, code, xin, dt, res, d, wsp)
        assert st == 0
        assert got_norm == pytest.approx(R.norm(x, res, cfg), rel=1e-12)
    m = case.get("m", R.norm(x, res, cfg))
    payload = np.full(geo.payload_bytes, 0xAB, np.uint8)
    r = res.copy() if ef else None
    status = np.zeros(1, np.int32)
    k.encode(code, xin.ctypes.data, dt, r.ctypes.data if ef else 0, d, 3, 2, m, 0,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    assert status[0] == 0
    want_p, want_r, _ = R.encode(cfg, x, m, 3, 2, res)
    assert np.array_equal(payload, want_p)
    if ef:
        assert want_r.size == geo.padded
        assert np.array_equal(r.view(np.uint32), want_r.view(np.uint32))
    n = 3
    sums = R.aggregate(cfg, [want_p] * n, d, n)
    out = np.zeros(d, np.float32)
    cast = np.zeros(d, np.uint16)
    k.decode(code, sums.ctypes.data, cfg.lane_bits(n), n, d, m, 0, out.ctypes.data,
             cast.ctypes.data, k.BFLOAT16, wsp, 0, 0)
    want = R.decode(cfg, sums, d, n, m)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    want_cast = torch.from_numpy(want).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(cast, want_cast)
    # the server's published stream, as a worker pulls it: ceil(log2(n*g + 1)) bits a sum
    w = R.sum_bits(cfg, n)
    assert k.sum_bits(code, n) == w
    packed = R.pack_sums(sums, w)
    out_p = np.zeros(d, np.float32)
    k.decode(code, packed.ctypes.data, 0, n, d, m, 0, out_p.ctypes.data, 0, k.FLOAT32, wsp, 0, 0,
             sum_bits=w)
    assert np.array_equal(out_p.view(np.uint32), want.view(np.uint32))


# block_scale: one max norm per rotation block. Blocks of one size (the last one padded when d is
# not a multiple of the block: the CPU core's geometry for a given rotation_block), many blocks to
# a 2^12 tile, two to a 2^14 tile, one tile of a block, blocks of several passes and chunks.
BLOCK_CASES = [
    dict(d=10), dict(d=1000, block=32), dict(d=1000, block=32, ef=False),
    dict(d=5000, block=256, bits=3), dict(d=9000, block=1024, ef=False),
    dict(d=10000, block=4096, dtype="bfloat16"), dict(d=3000, block=512, dtype="float16"),
    dict(d=20000, block=8192), dict(d=20000, block=8192, ef=False, bits=8),
    dict(d=40001, block=1 << 15, kw=dict(fused_max_log=12, column_max_bits=2)),
    dict(d=40001, block=1 << 15, ef=False, dtype="float16",
         kw=dict(fused_max_log=12, column_max_bits=2)),
    dict(d=(1 << 16) + 77, block=1 << 15, kw=dict(chunk_log=16)),
    dict(d=(1 << 16) + 5, block=1 << 15, bits=2, ef=False, kw=dict(chunk_log=15)),
]


def _block_case(k, case):
    """(cfg, code, x as float32, grad buffer, dtype code, residual or None) of a block_scale case;
    the input's blocks differ in scale by decades (a bucket's layers), its last block is partial."""
    d, bits, block = case["d"], case.get("bits", 4), case.get("block")
    ef, dtype = case.get("ef", True), case.get("dtype", "float32")
    cfg = ThcConfig(bits=bits, granularity=max(30, (1 << bits) - 1), rotation_block=block,
                    error_feedback=ef, block_scale=True)
    code = _emu_code(k, cfg, **case.get("kw", {}))
    geo = R.geometry(cfg, d)
    rng = np.random.default_rng(d + bits)
    blk = np.arange(d) // geo.block
    x = (rng.standard_normal(d) * 10.0 ** ((blk % 4) - 2.0)).astype(np.float32)
    xt = torch.from_numpy(x).to(DTYPES[dtype])
    res = (rng.standard_normal(geo.padded) * 0.01 * math.sqrt(geo.block)).astype(np.float32)
    xin, dt = _emu_grad(k, xt, dtype)
    return cfg, code, xt.float().numpy(), xin, dt, res if ef else None


def _emu_block_norms(k, code, xin, dt, r, d, wsp, count):
    out = np.full(count, np.nan, np.float64)
    status = np.full(1, 0x70, np.int32)
    k.norm(code, xin.ctypes.data, dt, 0 if r is None else r.ctypes.data, d, out.ctypes.data, wsp,
           status.ctypes.data, 0, norm_count=count)
    return out, int(status[0])


@pytest.mark.parametrize("case", BLOCK_CASES,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_emulated_block_scale_bit_exact(emu, case):
    """block_scale through the kernels' own code: the norm of each block (to 1e-12), and, with
    one M_k per block (one of them 0), payload, rotated state, decode and its bf16 cast, and the
    decode of the published stream, bit for bit against reference.py's block functions."""
    k = emu
    cfg, code, x, xin, dt, res = _block_case(k, case)
    d = x.size
    geo = R.geometry(cfg, d)
    nb = R.num_blocks(cfg, d)
    assert k.num_blocks(code, d) == nb == geo.padded // geo.block
    ws, wsp = _aligned_workspace(k, code, d)
    norms, st = _emu_block_norms(k, code, xin, dt, res, d, wsp, nb)
    assert st == 0
    want_norms = R.block_norms(x, res, cfg)
    np.testing.assert_allclose(norms, want_norms, rtol=1e-12, atol=0)
    # the norm round's max over workers: at least each block's own norm; one block's is 0 (its
    # indices are 0, its state keeps y, it decodes to +0) where there are several
    m = want_norms * np.random.default_rng(nb).uniform(1.0, 1.5, nb)
    if nb > 1:
        m[nb // 2] = 0.0
    m_dev = np.ascontiguousarray(m, np.float64)
    payload = np.full(geo.payload_bytes, 0xAB, np.uint8)
    r = None if res is None else res.copy()
    status = np.zeros(1, np.int32)
    k.encode(code, xin.ctypes.data, dt, 0 if r is None else r.ctypes.data, d, 3, 2, 0.0,
             m_dev.ctypes.data, payload.ctypes.data, wsp, status.ctypes.data, 0,
             max_norm_count=nb)
    assert status[0] == 0
    want_p, want_r, _ = R.encode(cfg, x, m, 3, 2, res)
    assert np.array_equal(payload, want_p)
    if res is not None:
        assert np.array_equal(r.view(np.uint32), want_r.view(np.uint32))
    n = 3
    sums = R.aggregate(cfg, [want_p] * n, d, n)
    out = np.full(d, np.nan, np.float32)
    cast = np.zeros(d, np.uint16)
    k.decode(code, sums.ctypes.data, cfg.lane_bits(n), n, d, 0.0, m_dev.ctypes.data,
             out.ctypes.data, cast.ctypes.data, k.BFLOAT16, wsp, status.ctypes.data, 0,
             max_norm_count=nb)
    assert status[0] == 0
    want = R.decode(cfg, sums, d, n, m)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    if nb > 1:  # the block of M_k = 0: +0 (not a signed zero)
        lo = (nb // 2) * geo.block
        assert not out[lo:lo + geo.block].view(np.uint32).any()
    want_cast = torch.from_numpy(want).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(cast, want_cast)
    w = R.sum_bits(cfg, n)
    packed = R.pack_sums(sums, w)  # held: the kernels read it through a raw pointer
    out_p = np.zeros(d, np.float32)
    k.decode(code, packed.ctypes.data, 0, n, d, 0.0, m_dev.ctypes.data,
             out_p.ctypes.data, 0, k.FLOAT32, wsp, 0, 0, sum_bits=w, max_norm_count=nb)
    assert np.array_equal(out_p.view(np.uint32), want.view(np.uint32))


def test_emulated_block_scale_of_one_block_is_the_one_norm_encode(emu):
    """A partition of one block: block_scale with M_0 = M (one scale segment, the same kernel)
    gives the one-norm encode's payload and state, both the reference's bit for bit."""
    k = emu
    d = 3000
    one = ThcConfig(rotation_block=4096)
    bs = dataclasses.replace(one, block_scale=True)
    x, xt, res = _inputs(d, 11, "float32", one)
    m = R.norm(x, res, one)
    ws, wsp = _aligned_workspace(k, _emu_code(k, one), d)
    outs = []
    for cfg in (one, bs):
        code = _emu_code(k, cfg)
        payload = np.zeros(R.geometry(cfg, d).payload_bytes, np.uint8)
        r = res.copy()
        m_dev = np.array([m], np.float64)
        status = np.zeros(1, np.int32)
        k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 1, 4, m, m_dev.ctypes.data,
                 payload.ctypes.data, wsp, status.ctypes.data, 0,
                 max_norm_count=1 if cfg.block_scale else 0)
        assert status[0] == 0
        outs.append((payload, r))
    want_p, want_r, _ = R.encode(one, x, m, 1, 4, res)
    for payload, r in outs:
        assert np.array_equal(payload, want_p)
        assert np.array_equal(r.view(np.uint32), want_r.view(np.uint32))


@pytest.mark.parametrize("d,block,kw", [(1000, 256, {}), (20000, 1024, {}),
                                        (40001, 1 << 15, dict(fused_max_log=12,
                                                              column_max_bits=2))])
def test_emulated_block_scale_refusals(emu, d, block, kw):
    """block_scale's max norms: a wrong count (or none on the device) is refused by the launcher,
    naming both lengths; a non-finite or negative M_k anywhere flags the status word and leaves
    payload, state and output untouched (the check before the tile kernels); a huge M_k with
    error feedback (k1 = Inf) flags an overflow and writes nothing; without error feedback that
    scale is unused and the payload is the reference's. The norm's count is checked alike."""
    k = emu
    cfg = ThcConfig(rotation_block=block, block_scale=True)
    code = _emu_code(k, cfg, **kw)
    geo = R.geometry(cfg, d)
    nb = R.num_blocks(cfg, d)
    x = np.random.default_rng(d).standard_normal(d).astype(np.float32)
    r = np.ones(geo.padded, np.float32)
    payload = np.full(geo.payload_bytes, 7, np.uint8)
    ws, wsp = _aligned_workspace(k, code, d)
    status = np.zeros(1, np.int32)
    good = np.full(nb, 50.0, np.float64)

    def encode(m, count, ef=True, c=code):
        k.encode(c, x.ctypes.data, k.FLOAT32, r.ctypes.data if ef else 0, d, 0, 0, 0.0,
                 0 if m is None else m.ctypes.data, payload.ctypes.data, wsp,
                 status.ctypes.data, 0, max_norm_count=count)

    blocks = f"d={d} in rotation blocks of {geo.block} has {nb} blocks"
    with pytest.raises(ValueError, match=f"block_scale: max_norm of {nb - 1} values, but {blocks}"
                                         r" \(one each\)"):
        encode(good, nb - 1)
    with pytest.raises(ValueError, match=f"block_scale: max_norm must be a device array of one "
                                         rf"per rotation block \({blocks}\)"):
        encode(None, nb)
    out = np.full(d, 3.0, np.float32)
    sums = np.zeros(geo.padded, np.uint8)
    with pytest.raises(ValueError, match=f"max_norm of {nb + 1} values, but {blocks}"):
        k.decode(code, sums.ctypes.data, 8, 1, d, 0.0, good.ctypes.data, out.ctypes.data, 0,
                 k.FLOAT32, wsp, status.ctypes.data, 0, max_norm_count=nb + 1)
    norms = np.zeros(nb, np.float64)
    with pytest.raises(ValueError, match=f"block_scale: norm of 1 values, but {blocks}"):
        k.norm(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, norms.ctypes.data, wsp,
               status.ctypes.data, 0, norm_count=1)
    one = _emu_code(k, dataclasses.replace(cfg, block_scale=False), **kw)
    with pytest.raises(ValueError, match=f"max_norm of {nb} values, but block_scale is off"):
        encode(good, nb, c=one)
    assert (payload == 7).all() and (r == 1).all() and status[0] == 0

    for bad in (float("nan"), float("inf"), -1.0):
        m = good.copy()
        m[nb - 1] = bad  # the last block only: every other tile would be fine on its own
        status[0] = 0
        encode(m, nb)
        assert status[0] == k.STATUS_NON_FINITE_NORM, bad
        assert (payload == 7).all() and (r == 1).all()
        status[0] = 0
        k.decode(code, sums.ctypes.data, 8, 1, d, 0.0, m.ctypes.data, out.ctypes.data, 0,
                 k.FLOAT32, wsp, status.ctypes.data, 0, max_norm_count=nb)
        assert status[0] == k.STATUS_NON_FINITE_NORM and (out == 3.0).all()
    m = good.copy()
    m[0] = 1e300
    with pytest.raises(ValueError, match="overflow"):
        R.encode(cfg, x, m, 0, 0, R.initial_residual(cfg, d))
    status[0] = 0
    encode(m, nb)
    assert status[0] == k.STATUS_OVERFLOW and (payload == 7).all() and (r == 1).all()
    status[0] = 0
    encode(m, nb, ef=False)
    assert status[0] == 0
    nef = dataclasses.replace(cfg, error_feedback=False)
    assert np.array_equal(payload, R.encode(nef, x, m, 0, 0)[0])


def test_emulated_block_scale_nan_input(emu):
    """A NaN gradient under block_scale: the norm flags it as the input (without error feedback
    too, where the block norms are the tile kernel without a transform)."""
    k = emu
    d = 5000
    x = np.random.default_rng(3).standard_normal(d).astype(np.float32)
    x[4321] = np.nan
    for ef in (True, False):
        cfg = ThcConfig(rotation_block=1024, block_scale=True, error_feedback=ef)
        code = _emu_code(k, cfg)
        r = np.zeros(R.geometry(cfg, d).padded, np.float32) if ef else None
        _, st = _emu_block_norms(k, code, x, k.FLOAT32, r, d, 0, R.num_blocks(cfg, d))
        assert st & k.STATUS_NON_FINITE_INPUT
        assert ef or st == k.STATUS_NON_FINITE_INPUT


def test_emulated_decode_refuses_a_sum_width_the_workers_do_not_make(emu):
    cfg = ThcConfig()  # g = 30: 2 workers' sums need 6 bits
    code = _emu_code(emu, cfg)
    packed = np.zeros(1024, np.uint8)
    out = np.zeros(1000, np.float32)
    with pytest.raises(ValueError, match="sum_bits=7 but 2 workers' sums need 6"):
        emu.decode(code, packed.ctypes.data, 0, 2, 1000, 1.0, 0, out.ctypes.data, 0, emu.FLOAT32,
                   0, 0, 0, sum_bits=7)


@pytest.mark.parametrize("d,kw", [(1000, {}), (40000, {}), (40000, dict(chunk_log=15))])
def test_emulated_bad_norm_and_status(emu, d, kw):
    """A non-finite M, or a status word already set, leaves payload and residual untouched."""
    k = emu
    cfg = ThcConfig(rotation_block=next_pow2(d))
    code = _emu_code(k, cfg, **kw)
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    r = np.ones(R.geometry(cfg, d).padded, np.float32)
    payload = np.full(R.geometry(cfg, d).payload_bytes, 7, np.uint8)
    ws, wsp = _aligned_workspace(k, code, d)
    status = np.zeros(1, np.int32)
    for bad_m in (float("nan"), float("inf"), -1.0):
        status[0] = 0
        k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, bad_m, 0,
                 payload.ctypes.data, wsp, status.ctypes.data, 0)
        assert status[0] == k.STATUS_NON_FINITE_NORM
        assert (payload == 7).all() and (r == 1).all()
    for preset in (k.STATUS_NON_FINITE_INPUT, k.STATUS_OVERFLOW):
        status[0] = preset
        k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, 1.0, 0,
                 payload.ctypes.data, wsp, status.ctypes.data, 0)
        assert status[0] == preset
        assert (payload == 7).all() and (r == 1).all()
    m_dev = np.array([R.norm(x, r, cfg)], np.float64)  # M read through a "device" pointer
    status[0] = 0
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, 0.0, m_dev.ctypes.data,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    want_p, want_r, _ = R.encode(cfg, x, float(m_dev[0]), 0, 0, np.ones(r.size, np.float32))
    assert status[0] == 0 and np.array_equal(payload, want_p)
    assert np.array_equal(r.view(np.uint32), want_r.view(np.uint32))


def _huge_head(cfg, d, at=0, seed=5):
    """A gradient whose 64 coordinates from `at` are near FLT_MAX: the transform of their block
    overflows float32 (the reference refuses it), everything else is ordinary."""
    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    x[at:at + 64] = np.float32(3e38)
    with pytest.raises(ValueError, match="overflow"):
        R.rotate(cfg, x, None)
    return x


# (d, block, planning): several tiles of whole blocks, one tile; a block of several passes.
OVERFLOW_CASES = [(20000, 1024, {}), (1000, None, {}),
                  (40001, None, dict(fused_max_log=12, column_max_bits=2))]


@pytest.mark.parametrize("d,block,kw", OVERFLOW_CASES)
def test_emulated_overflow_with_error_feedback(emu, d, block, kw):
    """y = Hu(sign*grad) + r overflows: the norm flags it (and not as a NaN input); an encode on
    that status word writes nothing; an encode on its own flags it too and keeps the old state of
    every tile that overflowed (the others: updated as the reference does, or, once the flag is
    set, skipped)."""
    k = emu
    cfg = ThcConfig(rotation_block=block or next_pow2(d))
    code = _emu_code(k, cfg, **kw)
    geo = R.geometry(cfg, d)
    at = geo.padded - geo.block  # the last rotation block
    x = _huge_head(cfg, d, at)
    r0 = _inputs(d, 9, "float32", cfg)[2]
    ws, wsp = _aligned_workspace(k, code, d)
    _, st = _emu_norm(k, code, x, k.FLOAT32, r0, d, wsp)
    assert st == k.STATUS_OVERFLOW
    # The encode that follows the norm on the same status word: nothing changes.
    r = r0.copy()
    payload = np.full(geo.payload_bytes, 7, np.uint8)
    status = np.array([st], np.int32)
    m = 1e30
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, m, 0,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    assert status[0] == st and (payload == 7).all() and np.array_equal(r, r0)
    # An encode on its own (status clear): flagged; the tile that overflowed keeps its state.
    status[0] = 0
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, m, 0,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    assert status[0] == k.STATUS_OVERFLOW
    tile = 1 << 12 if geo.block <= (1 << 12) else geo.block  # a fused tile, or the whole block
    bad = at // tile * tile
    assert np.array_equal(r[bad:].view(np.uint32), r0[bad:].view(np.uint32))
    if bad > 0:  # the tiles before it ran first here: as the reference encodes them
        xz = x.copy()
        xz[at:] = 0
        want_p, want_r, _ = R.encode(cfg, xz, m, 0, 0, r0)
        assert np.array_equal(r[:bad].view(np.uint32), want_r[:bad].view(np.uint32))
        assert not np.array_equal(r[:bad], r0[:bad])
        nb = bad * cfg.bits // 8
        assert np.array_equal(payload[:nb], want_p[:nb])


def test_emulated_overflow_without_error_feedback(emu):
    k = emu
    d = 1000
    cfg = ThcConfig(error_feedback=False)
    code = _emu_code(k, cfg)
    x = _huge_head(cfg, d)
    payload = np.zeros(R.geometry(cfg, d).payload_bytes, np.uint8)
    status = np.zeros(1, np.int32)
    k.encode(code, x.ctypes.data, k.FLOAT32, 0, d, 0, 0, R.norm(x), 0, payload.ctypes.data, 0,
             status.ctypes.data, 0)
    assert status[0] == k.STATUS_OVERFLOW


def test_emulated_huge_max_norm(emu):
    """M so large that k1 = 2T/g * M / sqrt(d_pad) * sqrt(B) is Inf: with error feedback every
    new r_j would be non-finite, so the encode is refused and writes nothing (the reference
    raises); without error feedback that scale is not used and the payload is the reference's."""
    k = emu
    d, m = 3000, 1e300
    x = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    cfg = ThcConfig(rotation_block=next_pow2(d))
    with pytest.raises(ValueError, match="overflow"):
        R.encode(cfg, x, m, 0, 0, R.initial_residual(cfg, d))
    code = _emu_code(k, cfg)
    r = np.full(R.geometry(cfg, d).padded, 0.5, np.float32)
    payload = np.full(R.geometry(cfg, d).payload_bytes, 7, np.uint8)
    status = np.zeros(1, np.int32)
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, m, 0, payload.ctypes.data,
             0, status.ctypes.data, 0)
    assert status[0] == k.STATUS_OVERFLOW and (payload == 7).all() and (r == 0.5).all()
    cfg = ThcConfig(error_feedback=False)
    status[0] = 0
    k.encode(code, x.ctypes.data, k.FLOAT32, 0, d, 0, 0, m, 0, payload.ctypes.data, 0,
             status.ctypes.data, 0)
    assert status[0] == 0 and np.array_equal(payload, R.encode(cfg, x, m, 0, 0)[0])


@pytest.mark.parametrize("d,kw", [(1000, {}), (40001, dict(fused_max_log=12, column_max_bits=2))])
def test_emulated_nan_input(emu, d, kw):
    """A NaN gradient: the norm flags it as the input (the overflow bit that its NaN y also raises
    is byteps_thc.thc.cuda's to hide); an encode on that word writes nothing."""
    k = emu
    cfg = ThcConfig(rotation_block=next_pow2(d))
    code = _emu_code(k, cfg, **kw)
    x = np.random.default_rng(2).standard_normal(d).astype(np.float32)
    x[d // 3] = np.nan
    r0 = _inputs(d, 4, "float32", cfg)[2]
    ws, wsp = _aligned_workspace(k, code, d)
    _, st = _emu_norm(k, code, x, k.FLOAT32, r0, d, wsp)
    assert st & k.STATUS_NON_FINITE_INPUT
    r = r0.copy()
    payload = np.full(R.geometry(cfg, d).payload_bytes, 7, np.uint8)
    status = np.array([st], np.int32)
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, 1.0, 0,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    assert (payload == 7).all() and np.array_equal(r, r0)
    status[0] = 0  # an encode on its own also finds it
    k.encode(code, x.ctypes.data, k.FLOAT32, r.ctypes.data, d, 0, 0, 1.0, 0,
             payload.ctypes.data, wsp, status.ctypes.data, 0)
    assert status[0] & k.STATUS_NON_FINITE_INPUT


def test_status_text_names_the_cause(emu):
    """The status word's flags in the core's words: a NaN gradient is named as the cause (the
    rotation it makes non-finite is not), an overflow alone as an overflow, 0 as nothing. The
    extension's own words where it is built with CUDA."""
    for k in (emu, _C.cuda) if WITH_CUDA else (emu,):
        both = k.status_text(k.STATUS_NON_FINITE_INPUT | k.STATUS_OVERFLOW)
        assert both.startswith("gradient: NaN or Inf") and "overflow" not in both
        assert k.status_text(k.STATUS_OVERFLOW).startswith(
            "rotation: the Hadamard rotation overflowed")
        assert "max_norm" in k.status_text(k.STATUS_NON_FINITE_NORM)
        assert k.status_text(0) == ""
