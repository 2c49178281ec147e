"""A scale per rotation block (ThcConfig.block_scale; docs/ALGORITHM.md, "A scale per rotation
block"): the NumPy reference against the mathematics, and the configuration's rules."""
import dataclasses

import numpy as np
import pytest

from byteps_thc import ThcConfig
from byteps_thc.thc import reference as R

BS = ThcConfig(block_scale=True, rotation_block=1 << 12, error_feedback=False)


def _grad(seed, d, scales):
    """Standard normals of d values, block k (of 2^12) scaled by scales[k % len(scales)]."""
    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    s = np.repeat(np.asarray(scales, np.float32), 1 << 12)
    return x * np.resize(s, d)


def test_config_rules_and_fingerprint():
    assert ThcConfig(block_scale=True).fingerprint() != ThcConfig().fingerprint()
    assert ThcConfig(block_scale=True).fingerprint() == ThcConfig(block_scale=True).fingerprint()
    with pytest.raises(ValueError, match="block_scale=True needs rotation blocks of at least 32"):
        ThcConfig(block_scale=True, rotation_block=16)
    with pytest.raises(ValueError, match="block_scale='yes'"):
        ThcConfig(block_scale="yes")
    for call in (ThcConfig(block_scale=True).to_kwargs, ThcConfig(block_scale=True).to_env):
        with pytest.raises(ValueError, match="block_scale=True .* BytePS's thc compressor, "
                                             "which keeps one norm per partition"):
            call()
    assert "block_scale" not in str(ThcConfig().to_kwargs())  # the wire of the default as it was
    assert "block_scale=on" in ThcConfig(block_scale=True).describe()


@pytest.mark.parametrize("d,block,expect", [
    (10000, 1 << 12, [4096, 4096, 4096]),                      # a given B: ceil(d / B) blocks
    (589824, None, [1 << 19, 1 << 16]),                         # tiled: 2^19 + 2^16 (BERT)
    (100, None, [128]),                                         # one block
    ((1 << 16) + 40, 1 << 16, [1 << 16, 1 << 16])])
def test_blocks_follow_the_geometry(d, block, expect):
    cfg = ThcConfig(block_scale=True, rotation_block=block)
    assert R.block_sizes(R.geometry(cfg, d)).tolist() == expect
    assert R.num_blocks(cfg, d) == len(expect)


def test_block_norms_are_the_blocks_norms():
    x = _grad(0, 10000, [1.0, 1e-3, 30.0])
    got = R.block_norms(x, None, BS)
    x64 = np.concatenate([x.astype(np.float64), np.zeros(3 * 4096 - 10000)])
    want = np.sqrt((x64.reshape(3, 4096) ** 2).sum(axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # with error feedback (a zero residual) the rotation's sqrt(sum y^2 / B) is the same norm
    ef = dataclasses.replace(BS, error_feedback=True)
    got_ef = R.block_norms(x, np.zeros(3 * 4096, np.float32), ef)
    np.testing.assert_allclose(got_ef, want, rtol=1e-6)


@pytest.mark.parametrize("ef", [False, True])
def test_one_block_is_the_partition_bit_for_bit(ef):
    d, base = 3000, ThcConfig(error_feedback=ef)    # one tiled block of 4096
    bs = dataclasses.replace(base, block_scale=True)
    x = _grad(1, d, [1.0])
    res = np.random.default_rng(2).standard_normal(4096).astype(np.float32) if ef else None
    m = 77.25
    p0, r0, _ = R.encode(base, x, m, rank=1, step=3, residual=res)
    p1, r1, _ = R.encode(bs, x, np.array([m]), rank=1, step=3, residual=res)
    np.testing.assert_array_equal(p0, p1)
    if ef:
        np.testing.assert_array_equal(r0.view(np.uint32), r1.view(np.uint32))
    sums = R.aggregate(base, [p0, p0], d, 2)
    for total in (False, True):
        np.testing.assert_array_equal(R.decode(base, sums, d, 2, m, total).view(np.uint32),
                                      R.decode(bs, sums, d, 2, np.array([m]), total)
                                      .view(np.uint32))


def test_a_block_is_quantised_on_its_own_scale():
    # scaling block 1 by 2^-20 (exact in float32 through the transform) with its M_k leaves
    # every index where it was: each block sees only its own scale
    x = _grad(3, 3 * 4096, [1.0])
    y = x.copy()
    y[4096:8192] *= np.float32(2.0 ** -20)
    m = R.block_norms(x, None, BS)
    my = m * np.array([1.0, 2.0 ** -20, 1.0])
    _, _, qx = R.encode(BS, x, m, rank=0, step=0)
    _, _, qy = R.encode(BS, y, my, rank=0, step=0)
    np.testing.assert_array_equal(qx, qy)


def test_each_block_has_the_error_of_its_own_partition():
    # z = y / M_k of a block of standard normals is N(0, 1) per coordinate, so the block's
    # NMSE, one worker without error feedback, is the table's expected error per coordinate
    # (rounding + clipping, spec section 2); with one scale the small blocks' is far larger
    scales = [1.0, 1e-3, 1e-2, 3.0]
    x = _grad(4, 4 * 4096, scales)
    e = BS.expected_error()["total"]
    one = dataclasses.replace(BS, block_scale=False)
    for cfg, m in ((BS, R.block_norms(x, None, BS)), (one, R.norm(x))):
        p, _, _ = R.encode(cfg, x, m, rank=0, step=0)
        est = R.decode(cfg, R.aggregate(cfg, [p], x.size, 1), x.size, 1, m)
        err = ((est - x).astype(np.float64).reshape(4, 4096) ** 2).sum(axis=1)
        nmse = err / (x.astype(np.float64).reshape(4, 4096) ** 2).sum(axis=1)
        if cfg.block_scale:
            assert np.all(np.abs(nmse - e) < 0.15 * e), (nmse, e)
        else:
            assert nmse[1] > 1000 * e and nmse[2] > 10 * e, nmse


def test_zero_block_is_zero_and_keeps_its_rotation():
    ef = dataclasses.replace(BS, error_feedback=True)
    x = _grad(5, 3 * 4096, [1.0])
    x[4096:8192] = 0
    res = np.zeros(3 * 4096, np.float32)
    res[4096:8192] = np.float32(0.5)   # a residual the zero M_1 cannot send
    m = np.array([80.0, 0.0, 80.0])
    payload, new_res, q = R.encode(ef, x, m, rank=0, step=0, residual=res)
    assert not q[4096:8192].any()
    y = R.rotate(ef, x, res)
    np.testing.assert_array_equal(new_res[4096:8192], y[4096:8192])
    out = R.decode(ef, R.aggregate(ef, [payload], x.size, 1), x.size, 1, m)
    assert not out[4096:8192].view(np.uint32).any()    # +0.0, no sign bit
    assert np.abs(out[:4096]).max() > 0


def test_bad_max_norms_are_refused():
    x = _grad(6, 10000, [1.0])
    for bad, match in ((np.ones(2), r"one max norm per rotation block \(3\)"),
                       (5.0, "one max norm per rotation block"),
                       (np.array([1.0, np.nan, 1.0]), "finite and >= 0"),
                       (np.array([1.0, -1.0, 1.0]), "finite and >= 0")):
        with pytest.raises(ValueError, match=match):
            R.encode(BS, x, bad, rank=0, step=0)
    with pytest.raises(ValueError, match="block_scale is off"):
        R.encode(ThcConfig(), x, np.ones(1), rank=0, step=0)


def test_round_is_homomorphic_and_unbiased_per_block():
    # the mean of many independent rounds' estimates converges to the mean input, block by
    # block (unbiased rounding; no clipping: inputs well inside T after the rotation)
    cfg = dataclasses.replace(BS, overflow_prob=1e-9)
    grads = [_grad(10 + w, 2 * 4096, [1.0, 1e-4]) for w in range(2)]
    mean = (grads[0].astype(np.float64) + grads[1]) / 2
    acc = np.zeros(mean.size)
    reps = 40
    for s in range(reps):
        est, _ = R.simulate_round(cfg, grads, step=s)
        acc += est
    acc /= reps
    for k in range(2):
        sl = slice(k * 4096, (k + 1) * 4096)
        rel = ((acc[sl] - mean[sl]) ** 2).sum() / (mean[sl] ** 2).sum()
        # one round's NMSE against the mean input is at most e / n * (mean of ||x_i||^2 /
        # ||mean||^2) ~ e (independent workers: ||mean||^2 ~ ||x||^2 / 2); averaged over reps
        e = cfg.expected_error()["total"]
        assert rel < 3 * e / reps, (k, rel)


def test_bytepss_compression_does_not_take_it():
    from byteps_thc import codecs
    assert "block_scale" not in codecs.THC.params
    with pytest.raises(TypeError, match=r"unknown THC parameters \['block_scale'\]"):
        codecs.THC.config(block_scale=True)
    with pytest.raises(ValueError, match="keeps one norm per partition"):
        codecs.THC.kwargs(ThcConfig(block_scale=True), {})
