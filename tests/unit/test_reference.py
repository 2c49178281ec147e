"""The NumPy reference against the mathematics: the figures every kernel is then held to."""
import math

import numpy as np
import pytest

from byteps_thc import ThcConfig
from byteps_thc.thc import reference as R


def test_hadamard_is_its_own_inverse_up_to_B():
    rng = np.random.default_rng(0)
    for block in (1, 2, 8, 1024):
        x = rng.standard_normal(4 * block).astype(np.float32)
        y = R.fwht(R.fwht(x, block), block) / block
        np.testing.assert_allclose(y, x, atol=1e-5 * math.log2(2 * block))


def test_hadamard_matches_the_matrix():
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(R.fwht(x, 16), h @ x, rtol=1e-5, atol=1e-5)


def test_random_streams_are_fixed_and_balanced():
    # pinned values: the definition must never drift (payloads are compared across builds)
    assert R.splitmix64(0) == 0xE220A8397B1DCDAF
    assert int(R.hash32(np.uint32(1))) == int(R.hash32(np.array([1], np.uint32))[0])
    s = R.sign_bits(42, 1 << 16)
    assert abs(s.mean() - 0.5) < 4 * 0.5 / math.sqrt(s.size)
    u = R.uniforms(42, 0, 0, 1 << 16)
    assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / u.size)
    assert not np.array_equal(u, R.uniforms(42, 1, 0, 1 << 16))
    assert not np.array_equal(u, R.uniforms(42, 0, 1, 1 << 16))


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8])
def test_pack_round_trip(bits):
    idx = np.random.default_rng(bits).integers(0, 1 << bits, 1001).astype(np.uint8)
    p = R.pack(idx, bits)
    assert p.size == -(-1001 * bits // 8)
    np.testing.assert_array_equal(R.unpack(p, bits, 1001), idx)


def test_geometry():
    c = ThcConfig()
    assert R.geometry(c, 1) == R.Geometry(1, 1, 1, 1)
    assert R.geometry(c, 1000).padded == 1024
    c2 = ThcConfig(rotation_block=1024)  # a given block: blocks of one size, the last padded
    g = R.geometry(c2, (1 << 20) + 5)
    assert (g.block, g.padded, g.payload_bytes, g.tail_block) == \
        (1024, (1 << 20) + 1024, ((1 << 20) + 1024) // 2, 0)
    g = R.geometry(ThcConfig(rotation_block=1 << 32), 589824)  # one block
    assert (g.block, g.padded, g.tail_block) == (1 << 20, 1 << 20, 0)
    g = R.geometry(c, (1 << 20) + 5)  # the default: 2^20, then the 5 in a block of 8
    assert (g.block, g.padded, g.payload_bytes, g.tail_block) == \
        (1 << 20, (1 << 20) + 8, ((1 << 20) + 8) // 2, 8)
    assert g.segments() == [(0, 1 << 20, 1 << 20), (1 << 20, 8, 8)]
    assert R.tiled_size(1024 + 600, 1024) == 2048  # the rest rounds up to the block itself
    assert R.tiled_size(1000, 16) == 1008  # blocks below 32 are not tiled


def _tiling_by_hand(d, block):
    """d_pad of the tiling written out: whole blocks, then the rest padded to a power of two."""
    full = (d // block) * block
    rest = d - full
    if rest == 0:
        return full
    last = 1
    while last < rest:
        last *= 2
    return full + (block if last >= block or block < 32 else last)


@pytest.mark.parametrize("d", [16385, 24577, 40000, 100003, 589824, 1024000, 2359296,
                               (1 << 20) + 5, 3 * (1 << 18) + 1, 50_000_001])
def test_default_block_is_the_largest_within_five_percent(d):
    geo = R.geometry(ThcConfig(), d)
    assert geo.padded == _tiling_by_hand(d, geo.block)
    top = 1 << (d - 1).bit_length()
    cands = [1 << k for k in range(14, top.bit_length())]
    fits = [b for b in cands if 20 * _tiling_by_hand(d, b) <= 21 * d]
    if fits:
        assert geo.block == max(fits) and geo.padded <= 1.05 * d
    else:  # none fits: the least padding
        assert geo.padded == min(_tiling_by_hand(d, b) for b in cands)


def test_default_tiling_of_bert_and_resnet_partitions():
    """589,824 (BERT-base's 768x768) = 2^19 + 2^16: no padding; a BytePS partition of 1,024,000
    floats is one block of 2^20 (1.024x); small partitions are one block."""
    g = R.geometry(ThcConfig(), 589824)
    assert (g.block, g.tail_block, g.padded) == (1 << 19, 1 << 16, 589824)
    assert g.segments() == [(0, 1 << 19, 1 << 19), (1 << 19, 1 << 16, 1 << 16)]
    g = R.geometry(ThcConfig(), 1024000)
    assert (g.block, g.tail_block, g.padded) == (1 << 20, 0, 1 << 20)
    assert R.geometry(ThcConfig(), 9000).padded == 16384


# spec §4: NMSE, d = 2^20, 1024-wide blocks, b=4, g=30, p=1/32, no EF; +-5%
SPEC_NMSE = {"normal": [0.0204, 0.0102, 0.0051, 0.0025],
             "lognormal": [0.0210, 0.0108, 0.0057, 0.0032]}


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_nmse_matches_the_spec(dist):
    cfg = ThcConfig(rotation_block=1024, error_feedback=False)
    d = 1 << 20
    for n, expected in zip((1, 2, 4, 8), SPEC_NMSE[dist]):
        rng = np.random.default_rng(100 + n)
        gs = [(rng.standard_normal(d) if dist == "normal"
               else rng.lognormal(0, 1, d)).astype(np.float32)
              for _ in range(n)]
        mean = np.mean(np.stack(gs).astype(np.float64), axis=0)
        est, _ = R.simulate_round(cfg, gs)
        nmse = np.sum((est - mean) ** 2) / np.mean([np.sum(g.astype(np.float64) ** 2) for g in gs])
        assert nmse == pytest.approx(expected, rel=0.05), (n, nmse)


def _one_round_nmse(cfg, d, n, dist, seed):
    rng = np.random.default_rng(seed)
    draw = {"normal": lambda: rng.standard_normal(d),
            "lognormal": lambda: rng.lognormal(0, 1, d),
            "student3": lambda: rng.standard_t(3, d),
            "sparse": lambda: rng.standard_normal(d) * (rng.random(d) < 0.01)}[dist]
    gs = [draw().astype(np.float32) for _ in range(n)]
    mean = np.mean(np.stack(gs).astype(np.float64), axis=0)
    est, _ = R.simulate_round(cfg, gs)
    return np.sum((est - mean) ** 2) / np.mean([np.sum(g.astype(np.float64) ** 2) for g in gs])


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_nmse_of_a_tiled_partition_matches_the_spec(dist):
    """The spec's figures hold for a partition tiled by blocks of two sizes: BERT-base's
    589,824 = 2^19 + 2^16 under the default rule, no padding (each block scaled by its own
    sqrt(B), so a scaled coordinate has the same distribution in either size). At most 5% above
    the figure; lognormal inputs gain a little from the larger blocks (their mean, which
    a block's first coordinate carries, is clipped less often), so up to 10% below it."""
    cfg = ThcConfig(error_feedback=False)
    d = 589824
    assert R.geometry(cfg, d).tail_block == 1 << 16
    for n, expected in zip((1, 2, 4, 8), SPEC_NMSE[dist]):
        nmse = _one_round_nmse(cfg, d, n, dist, 200 + n)
        assert 0.90 * expected <= nmse <= 1.05 * expected, (n, nmse)


@pytest.mark.parametrize("dist", ["normal", "lognormal", "student3", "sparse"])
def test_tiling_keeps_the_error_of_equal_blocks(dist):
    """A partition whose last block is an eighth of the others (73,728 = 2^16 + 2^13 under the
    default rule) has at most the NMSE of the spec's layout, 72 equal blocks of 1024, + 10% (n = 2,
    three seeds), on four input distributions."""
    d = 9 * (1 << 13)
    tiled = ThcConfig(error_feedback=False)
    equal = ThcConfig(error_feedback=False, rotation_block=1024)
    assert R.geometry(tiled, d).tail_block == 1 << 13 and R.geometry(equal, d).padded == d
    a = np.mean([_one_round_nmse(tiled, d, 2, dist, s) for s in range(3)])
    b = np.mean([_one_round_nmse(equal, d, 2, dist, s) for s in range(3)])
    assert a <= 1.10 * b, (a, b)
    assert a >= 0.5 * b, (a, b)  # the same order (heavy tails gain from the larger blocks)


def _clipped_target(cfg, x, m):
    """The value THC is unbiased for: the input with its rotated coordinates clipped to [-T, T]."""
    geo = R.geometry(cfg, x.size)
    neg = R.sign_bits(cfg.seed, geo.padded)
    v = np.zeros(geo.padded)
    v[: x.size] = x
    v = np.where(neg == 1, -v, v)
    hb = geo.block
    y = R.fwht(v.astype(np.float32), hb).astype(np.float64) / math.sqrt(hb)
    scale = math.sqrt(geo.padded) / m
    yc = np.clip(y * scale, -cfg.clip, cfg.clip) / scale
    back = R.fwht(yc.astype(np.float32), hb).astype(np.float64) / math.sqrt(hb)
    return np.where(neg == 1, -back, back)[: x.size]


def test_unbiased_including_clipping():
    """Mean of K independent encodes -> the clipped input, within a bound from the variance."""
    cfg = ThcConfig(error_feedback=False)
    d, K = 1024, 1500
    rng = np.random.default_rng(7)
    # half Gaussian noise, half a vector whose rotation is a spike (so clipping is active)
    spike = np.zeros(d, np.float32)
    spike[3] = 40.0
    neg = R.sign_bits(cfg.seed, d)
    x = (rng.standard_normal(d).astype(np.float32)
         + R.apply_signs(R.fwht(spike, d) / np.float32(math.sqrt(d)), neg))
    m = R.norm(x)
    target = _clipped_target(cfg, x, m)
    assert np.max(np.abs(target - x)) > 0.5  # clipping really happened
    acc = np.zeros(d)
    for step in range(K):
        p, _, _ = R.encode(cfg, x, m, 0, step)
        acc += R.decode(cfg, R.aggregate(cfg, [p], d, 1), d, 1, m)
    avg = acc / K
    # per-coordinate variance of one decode <= s^2 * maxgap^2 / 4 (rotation spreads it evenly)
    s = (2 * cfg.clip / cfg.granularity) * m / math.sqrt(d)
    maxgap = max(b - a for a, b in zip(cfg.table, cfg.table[1:]))
    sigma = s * maxgap / 2 / math.sqrt(K)
    z = (avg - target) / sigma
    assert np.max(np.abs(z)) < 5.5
    assert np.mean(z ** 2) < 1.2  # a bias of even 0.3 sigma per coordinate would fail this


def test_homomorphism():
    """decode(sum of encodes) == mean of per-worker decodes; the sums are exact integers."""
    cfg = ThcConfig()
    d, n = 3000, 5
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(d).astype(np.float32) * (i + 1) for i in range(n)]
    m = max(R.norm(x) for x in xs)
    encs = [R.encode(cfg, x, m, i, 0) for i, x in enumerate(xs)]
    sums = R.aggregate(cfg, [e[0] for e in encs], d, n)
    tbl = np.array(cfg.table)
    np.testing.assert_array_equal(sums.astype(np.int64), np.sum([tbl[e[2]] for e in encs], axis=0))
    joint = R.decode(cfg, sums, d, n, m)
    singles = np.mean([R.decode(cfg, R.aggregate(cfg, [e[0]], d, 1), d, 1, m) for e in encs],
                      axis=0)
    np.testing.assert_allclose(joint, singles, rtol=0, atol=1e-5 * m / math.sqrt(d) * 30)


def test_error_feedback_carries_the_error():
    cfg = ThcConfig()
    x = np.random.default_rng(4).standard_normal(500).astype(np.float32)
    res = R.initial_residual(cfg, 500)
    m = R.norm(x, res, cfg)
    assert m == pytest.approx(R.norm(x), rel=1e-6)  # a zero state adds nothing
    p, res, _ = R.encode(cfg, x, m, 0, 0, res)
    own = R.decode(cfg, R.aggregate(cfg, [p], 500, 1), 500, 1, m)
    np.testing.assert_allclose(own + R.unrotate_residual(cfg, res, 500), x, atol=1e-5)


@pytest.mark.parametrize("block,d", [(None, 1000), (64, 1000), (None, 20000)])
def test_error_feedback_telescopes_over_steps(block, d):
    """What error feedback promises: after T steps, everything sent plus the state equals
    everything given, sum_t decode(own_t) + residual_T = sum_t x_t (the rotated state unrotated;
    padding included: d = 1000 is not a multiple of the block; 20000 = 2^14 + a block of 2^12);
    and the norm with a state is
    ||x + textbook residual||, the residual of the padding coordinates included."""
    cfg = ThcConfig(rotation_block=block)
    steps = 6
    rng = np.random.default_rng(8)
    res = R.initial_residual(cfg, d)
    sent = np.zeros(d, np.float64)
    given = np.zeros(d, np.float64)
    for step in range(steps):
        x = rng.standard_normal(d).astype(np.float32)
        m = R.norm(x, res, cfg)
        dp = R.geometry(cfg, d).padded
        textbook = np.pad(x, (0, dp - d)).astype(np.float64) + R.unrotate_residual(cfg, res, dp)
        assert m == pytest.approx(float(np.linalg.norm(textbook)), rel=1e-5)
        p, res, _ = R.encode(cfg, x, m * 0.7, 0, step, res)  # 0.7: some clipping
        sent += R.decode(cfg, R.aggregate(cfg, [p], d, 1), d, 1, m * 0.7)
        given += x
    left = R.unrotate_residual(cfg, res, d)
    np.testing.assert_allclose(sent + left, given, atol=2e-4)
    assert np.abs(left).max() > 0.01  # the state holds something: the check is not vacuous


def test_zero_norm_and_bad_input():
    cfg = ThcConfig()
    x = np.zeros(10, np.float32)
    p, res, q = R.encode(cfg, x, 0.0, 0, 0, R.initial_residual(cfg, 10))
    assert not q.any() and not res.any()
    assert not R.decode(cfg, R.aggregate(cfg, [p], 10, 1), 10, 1, 0.0).any()
    with pytest.raises(ValueError, match="NaN or Inf"):
        R.encode(cfg, np.array([1.0, np.nan], np.float32), 1.0, 0, 0)
    with pytest.raises(ValueError, match="max_norm=inf"):
        R.encode(cfg, np.ones(4, np.float32), math.inf, 0, 0)
    with pytest.raises(ValueError, match="expected 8"):
        R.aggregate(cfg, [np.zeros(7, np.uint8)], 16, 1)


def test_round_sends_the_sums_in_the_bits_they_need():
    """n = 2, g = 30: sums up to 60 travel in 6 bits (not an 8-bit lane); the reply decodes to
    what the lanes decode to."""
    cfg = ThcConfig()
    d, n = 3000, 2
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
    m = max(R.norm(x) for x in xs)
    sums = R.aggregate(cfg, [R.encode(cfg, x, m, i, 0)[0] for i, x in enumerate(xs)], d, n)
    reply = R.publish(cfg, sums, d, n)
    assert R.sum_bits(cfg, n) == 6 and reply.size == R.geometry(cfg, d).padded * 6 // 8
    np.testing.assert_array_equal(R.decode_published(cfg, reply, d, n, m),
                                  R.decode(cfg, sums, d, n, m))
