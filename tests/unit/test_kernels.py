"""The C++ codec core (byteps_thc._C) against the NumPy reference, bit for bit, on every ISA.

What is pinned (docs/ALGORITHM.md): the random streams and keys; the transform (bit-exact
against the stage-by-stage reference, and close to a naive matrix product); payloads and
error-feedback residuals over several steps (so the residual is exercised) for b = 2, 4, 8,
sizes 1, 3, 1000, 2^10, 2^20 + 5, blockwise and whole-partition rotation; sums exact in 8, 16
and 32-bit lanes; decode bit-exact; the large-granularity (binary search) path; errors.
Each ISA the CPU has (portable, avx2, avx512) is forced in turn.
"""
import math
import re
import types

import numpy as np
import pytest

from byteps_thc.thc import reference as R
from byteps_thc.thc.config import ThcConfig

_C = pytest.importorskip("byteps_thc._C")

ALL_ISAS = ("portable", "avx2", "avx512")


def _available():
    orig = _C.active_isa()
    have = [i for i in ALL_ISAS if _C.force_isa(i)]
    _C.force_isa(orig)
    return have


ISAS = _available()


@pytest.fixture(autouse=True)
def restore_isa():
    orig = _C.active_isa()
    yield
    _C.force_isa(orig)


def core(cfg):
    return _C.core_config(cfg)


def bits_of(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_best_isa_is_active_and_portable_always_there():
    assert "portable" in ISAS
    assert _C.active_isa() in ISAS
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        _C.force_isa("sse9")


# -- random streams ------------------------------------------------------------------------------
@pytest.mark.parametrize("x", [0, 1, 42, 0x5448435F524E4421, (1 << 64) - 1])
def test_splitmix64_and_keys(x):
    assert _C.splitmix64(x) == R.splitmix64(x)
    assert _C.sign_key(x) == R.sign_key(x)
    for rank, step in [(0, 0), (3, 7), ((1 << 24) - 1, (1 << 40) - 1)]:
        assert _C.round_key(x, rank, step) == R.round_key(x, rank, step)


def test_hash32():
    xs = np.array([0, 1, 2, 0xDEADBEEF, 0xFFFFFFFF, 12345678], dtype=np.uint32)
    assert [_C.hash32(int(v)) for v in xs] == [int(v) for v in R.hash32(xs)]


# -- transform -----------------------------------------------------------------------------------
def naive_hadamard(x, block):
    out = np.empty(x.size, dtype=np.float64)
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(block)] for i in range(block)])
    for s in range(0, x.size, block):
        out[s:s + block] = h @ x[s:s + block].astype(np.float64)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_fwht_against_naive_matrix(isa, block):
    assert _C.force_isa(isa)
    x = np.random.default_rng(block).standard_normal(4 * block).astype(np.float32)
    got = _C.fwht(x, block)
    np.testing.assert_allclose(got, naive_hadamard(x, block), rtol=1e-5,
                               atol=1e-4 * math.sqrt(block))
    assert np.array_equal(bits_of(got), bits_of(R.fwht(x, block)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,block", [(1 << 10, 1 << 10), (1 << 12, 1 << 11), (1 << 14, 1 << 14),
                                     (1 << 16, 1 << 13), (1 << 17, 1 << 17), (1 << 20, 1 << 20),
                                     (1 << 20, 1 << 10), (3 << 12, 1 << 12)])
def test_fwht_bit_exact_with_reference(isa, n, block):
    assert _C.force_isa(isa)
    x = np.random.default_rng(n + block).standard_normal(n).astype(np.float32)
    x[::17] = -0.0
    assert np.array_equal(bits_of(_C.fwht(x, block)), bits_of(R.fwht(x, block)))


@pytest.mark.parametrize("isa", ISAS)
def test_fwht_twice_is_block_times_identity(isa):
    assert _C.force_isa(isa)
    x = np.random.default_rng(1).integers(-8, 8, 1 << 12).astype(np.float32)
    assert np.array_equal(_C.fwht(_C.fwht(x, 256), 256), x * 256)  # small integers: exact


def test_fwht_bad_block():
    x = np.zeros(12, dtype=np.float32)
    with pytest.raises(ValueError, match="block must be a power of two, got 3"):
        _C.fwht(x, 3)
    with pytest.raises(ValueError, match="length 12 is not a multiple of block 8"):
        _C.fwht(x, 8)
    with pytest.raises(ValueError, match="x must have dtype float32, got float64"):
        _C.fwht(np.zeros(8), 8)


# -- encode --------------------------------------------------------------------------------------
BITS_G = {2: 6, 4: 30, 8: 255}
SIZES = [1, 3, 1000, 1 << 10, 40000, (1 << 20) + 5]  # 40000, 2^20+5: tiled (a smaller last block)


def _inputs(d, steps, seed):
    rng = np.random.default_rng(seed)
    xs = []
    for s in range(steps):
        x = (rng.standard_normal(d) * (1 + s)).astype(np.float32)
        x[::11] = -0.0
        if d > 3:
            x[1] = 40.0  # something the clip cuts
        xs.append(x)
    return xs


@pytest.mark.parametrize("d", SIZES)
@pytest.mark.parametrize("bits", sorted(BITS_G))
@pytest.mark.parametrize("block", [None, 1024])
@pytest.mark.parametrize("ef", [False, True])
def test_encode_bit_exact_every_isa(d, bits, block, ef):
    cfg = ThcConfig(bits=bits, granularity=BITS_G[bits], rotation_block=block, error_feedback=ef)
    steps = 2 if d > 100000 else 3
    rank = 5
    xs = _inputs(d, steps, seed=d * 7 + bits)
    # The reference's sequence, once.
    expect = []
    res = R.initial_residual(cfg, d) if ef else None
    norms = []
    for step, x in enumerate(xs):
        m = R.norm(x, res, cfg)
        norms.append(m)
        payload, res, _ = R.encode(cfg, x, m * 0.8, rank, step, res)  # 0.8: some clipping
        expect.append((payload, None if res is None else res.copy()))
    for isa in ISAS:
        assert _C.force_isa(isa)
        enc = _C.Encoder(core(cfg), d, rank, ef)
        for step, x in enumerate(xs):
            assert enc.step == step
            assert enc.norm(x) == pytest.approx(norms[step], rel=1e-6)
            payload = enc.encode(x, norms[step] * 0.8)
            want, want_res = expect[step]
            assert payload.dtype == np.uint8 and payload.size == want.size
            assert np.array_equal(payload, want), f"{isa}: payload differs at step {step}"
            if ef:
                assert np.array_equal(bits_of(enc.residual), bits_of(want_res)), \
                    f"{isa}: residual differs at step {step}"
            else:
                assert enc.residual is None


def _encodes_match_reference(enc, cfg, x, res, rank, steps=2):
    """`steps` encodes of x at the reference's norm: each payload and residual (to the bit) the
    reference's."""
    for step in range(steps):
        m = R.norm(x, res, cfg)
        want, res, _ = R.encode(cfg, x, m, rank, step, res)
        assert np.array_equal(enc.encode(x, m), want)
        assert np.array_equal(bits_of(enc.residual), bits_of(res))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits,g", [(1, 1), (3, 7), (5, 100), (8, 510), (2, 1000)])
def test_encode_other_tables(isa, bits, g):
    assert _C.force_isa(isa)
    cfg = ThcConfig(bits=bits, granularity=g, rotation_block=256)
    d = 5000
    x = np.random.default_rng(g).standard_normal(d).astype(np.float32)
    res = R.initial_residual(cfg, d)
    _encodes_match_reference(_C.Encoder(core(cfg), d, 1, True), cfg, x, res, rank=1)


@pytest.mark.parametrize("isa", ISAS)
def test_encode_large_granularity_binary_search(isa):
    """g >= 2^16 has no level table: the kernels binary-search the table instead."""
    assert _C.force_isa(isa)
    g = 100000
    table = [0, 21000, 39000, 50000, 61000, 79000, 86000, g]
    cfg = types.SimpleNamespace(bits=3, granularity=g, clip=2.5, seed=9, rotation_block=512,
                                table=table, lane_bits=lambda n: 32)
    c = _C.Config()
    c.bits, c.granularity, c.clip, c.seed, c.rotation_block, c.table = 3, g, 2.5, 9, 512, table
    assert _C.validate(c) == ""
    d = 3000
    x = np.random.default_rng(3).standard_normal(d).astype(np.float32)
    res = np.zeros(512 * 6, dtype=np.float32)  # d_pad: 3000 padded to blocks of 512
    _encodes_match_reference(_C.Encoder(c, d, 2, True), cfg, x, res, rank=2)


def _ef_encoder(isa, block, d, rank):
    """The default configuration with rotation blocks `block`, under ISA `isa`: it, an Encoder of
    d values with error feedback for `rank`, and the reference's initial residual."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=block)
    return cfg, _C.Encoder(core(cfg), d, rank, True), R.initial_residual(cfg, d)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [None, 1024, 64])
def test_encode_reuses_the_norms_rotation_only_for_that_gradient(isa, block):
    """With error feedback norm(x) rotates x and encode(x) of the same step quantises that
    rotation. Encode of another array, of the same array changed in place, of another step, or
    after a failed encode rotates again: every payload and state equals the reference's."""
    d = 5000
    cfg, enc, res = _ef_encoder(isa, block, d, rank=2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(d).astype(np.float32)
    cases = ["same", "other array", "changed in place", "stale step", "after a failure"]
    for step, case in enumerate(cases):
        m = enc.norm(x)
        assert m == pytest.approx(R.norm(x, res, cfg), rel=1e-6)
        if case == "other array":
            x = rng.standard_normal(d).astype(np.float32)
        elif case == "changed in place":
            x *= np.float32(0.5)
        elif case == "stale step":
            enc.step = step  # the same value: still a new call of set_step, the cache is dropped
        elif case == "after a failure":
            bad = x.copy()
            bad[7] = np.nan
            with pytest.raises(ValueError, match="NaN or Inf"):
                enc.encode(bad, m)
        want, res, _ = R.encode(cfg, x, m, 2, step, res)
        assert np.array_equal(enc.encode(x, m), want), case
        assert np.array_equal(bits_of(enc.residual), bits_of(res)), case


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [64, 1024])
def test_norm_of_values_whose_squares_overflow_float32(isa, block):
    """The norm sums squares in binary32 runs and redoes a run in binary64 when its sum is not
    finite (|y| above ~1.8e19). With error feedback that run holds y + r already: the redo must
    not add r twice (visible when r is as large as y: a first step clipped almost everything).
    Norm and the encode that reuses its rotation equal the reference's."""
    d = 3000
    cfg, enc, res = _ef_encoder(isa, block, d, rank=0)
    rng = np.random.default_rng(6)
    big = (rng.standard_normal(d) * 1e19).astype(np.float32)
    small_m = R.norm(big, res, cfg) * 1e-3
    _, res, _ = R.encode(cfg, big, small_m, 0, 0, res)
    enc.encode(big, small_m)
    assert np.array_equal(bits_of(enc.residual), bits_of(res)) and np.abs(res).max() > 1e19
    m = enc.norm(big)
    assert m == pytest.approx(R.norm(big, res, cfg), rel=1e-6)
    want, res, _ = R.encode(cfg, big, m, 0, 1, res)
    assert np.array_equal(enc.encode(big, m), want)
    assert np.array_equal(bits_of(enc.residual), bits_of(res))


@pytest.mark.parametrize("isa", ISAS)
def test_growing_residual_is_caught_the_step_it_overflows(isa):
    """With error feedback the encoder proves the new residual finite from bounds instead of
    reading it. Here the state grows every step (huge inputs, all clipped: e ~ y) until y = Hu(v)
    + r overflows float32: every step before equals the reference bit for bit, and the step that
    overflows is an error, on the same step as the reference, that changes nothing. Then an
    encode after a zero max_norm (the state's bound unknown) is checked and still exact."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=256)
    d = 4096
    x = np.full(d, 2.5e35, np.float32)
    x[::3] = -2.5e35
    enc = _C.Encoder(core(cfg), d, 1, True)
    res = R.initial_residual(cfg, d)
    for step in range(40):
        try:
            want, res_next, _ = R.encode(cfg, x, 1.0, 1, step, res)
        except ValueError as e:
            assert "overflowed" in str(e)
            with pytest.raises(ValueError, match="overflowed float32"):
                enc.encode(x, 1.0)
            assert enc.step == step and np.array_equal(bits_of(enc.residual), bits_of(res))
            break
        assert np.array_equal(enc.encode(x, 1.0), want), step
        res = res_next
        assert np.array_equal(bits_of(enc.residual), bits_of(res)), step
    else:
        raise AssertionError("the state never overflowed: the test proves nothing")
    assert step >= 2  # some steps succeeded first, with a state far from zero
    y = np.random.default_rng(5).standard_normal(d).astype(np.float32)
    enc.reset_residual()
    res = R.initial_residual(cfg, d)
    _, res, _ = R.encode(cfg, y, 0.0, 1, enc.step, res)
    enc.encode(y, 0.0)
    want, res, _ = R.encode(cfg, y, 3.0, 1, enc.step, res)
    assert np.array_equal(enc.encode(y, 3.0), want)
    assert np.array_equal(bits_of(enc.residual), bits_of(res))


@pytest.mark.parametrize("isa", ISAS)
def test_encode_zero_norm(isa):
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=64)
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    enc = _C.Encoder(core(cfg), 100, 0, True)
    p = enc.encode(x, 0.0)
    assert p.size == 64 and not p.any() and enc.step == 1
    # The state becomes y, the rotated x: the textbook residual x, unrotated.
    assert np.allclose(R.unrotate_residual(cfg, enc.residual, 100), x, atol=1e-6)
    want, want_res, _ = R.encode(cfg, x, 0.0, 0, 0, R.initial_residual(cfg, 100))
    assert np.array_equal(p, want) and np.array_equal(bits_of(want_res), bits_of(enc.residual))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_encode_non_finite_changes_nothing(isa, bad):
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=1024)
    d = 5000
    enc = _C.Encoder(core(cfg), d, 0, True)
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    enc.encode(x, 100.0)
    res, step = enc.residual, enc.step
    for pos in (0, 2047, d - 1):
        y = x.copy()
        y[pos] = bad
        with pytest.raises(ValueError, match="encode of x.*: NaN or Inf.*; nothing was changed"):
            enc.encode(y, 100.0)
        with pytest.raises(ValueError, match="NaN or Inf"):
            enc.norm(y)
        assert enc.step == step and np.array_equal(bits_of(enc.residual), bits_of(res))
    with pytest.raises(ValueError, match="max_norm must be finite"):
        enc.encode(x, bad)
    with pytest.raises(ValueError, match="max_norm must be >= 0, got -1"):
        enc.encode(x, -1.0)
    assert enc.step == step


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("block,pos", [(64, 0), (1024, 0), (1024, 2500), (None, 0)])
def test_encode_overflow_inside_the_transform(isa, ef, block, pos):
    """Finite inputs whose Hadamard sums overflow float32 are an error (as NaN/Inf inputs are) and
    change nothing, on the fused pipeline (the first chunk, the partial last chunk, the whole
    partition) and the kernel-by-kernel path (64-wide blocks); the reference agrees."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=block, error_feedback=ef)
    d = 3000
    enc = _C.Encoder(core(cfg), d, 0, ef)
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    enc.encode(x, 100.0)
    res, step = enc.residual, enc.step
    big = x.copy()
    big[pos:pos + 64] = 3e38
    with pytest.raises(ValueError, match="overflowed float32"):
        R.encode(cfg, big, 1e30, 0, step, res)
    with pytest.raises(ValueError, match="encode of x.*: the Hadamard rotation overflowed "
                                         "float32.*nothing was changed"):
        enc.encode(big, 1e30)
    assert enc.step == step
    if ef:  # the norm rotates too, and says so
        with pytest.raises(ValueError, match="norm of x \\+ residual: "
                                             "the Hadamard rotation overflowed float32"):
            enc.norm(big)
        with pytest.raises(ValueError, match="overflowed float32"):
            R.norm(big, res, cfg)
        assert enc.step == step
    if ef:
        assert np.array_equal(bits_of(enc.residual), bits_of(res))
    # A max_norm so large that the error's scale k1 is Inf: only error feedback uses it.
    if ef:
        with pytest.raises(ValueError, match="overflowed float32"):
            enc.encode(x, 1e300)
        assert enc.step == step


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("block", [64, 1024])
def test_encode_near_overflow_bound_still_bit_exact(isa, ef, block):
    """Inputs large enough that the up-front overflow bound cannot clear them (B * max|x| above
    FLT_MAX) but whose sums stay finite: the checked path gives the reference's bits."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=block, error_feedback=ef)
    d = 3000
    x = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    x[5] = 3.4e38 / 63  # B * max|x| > FLT_MAX for B >= 64; the first transform's sums stay finite
    res = R.initial_residual(cfg, d) if ef else None
    m = R.norm(x, res, cfg)
    enc = _C.Encoder(core(cfg), d, 3, ef)
    try:
        want, want_res, _ = R.encode(cfg, x, m, 3, 0, res)
    except ValueError:  # the new residual (y - level value) may overflow: then both say so
        assert ef
        with pytest.raises(ValueError, match="overflowed float32"):
            enc.encode(x, m)
        return
    assert np.array_equal(enc.encode(x, m), want)
    if ef:
        assert np.array_equal(bits_of(enc.residual), bits_of(want_res))


def test_encoder_argument_checks():
    c = core(ThcConfig())
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        _C.Encoder(c, 0, 0, True)
    with pytest.raises(ValueError, match=f"rank must be at most {(1 << 24) - 1}, got {1 << 24}"):
        _C.Encoder(c, 10, 1 << 24, True)
    _C.Encoder(c, 10, (1 << 24) - 1, True)  # the largest rank a round key holds (24 bits)
    enc = _C.Encoder(c, 10, 0, True)
    with pytest.raises(ValueError, match=f"step must be at most {(1 << 40) - 1}"):
        enc.step = 1 << 40
    enc.step = (1 << 40) - 1
    assert enc.step == (1 << 40) - 1
    enc.step = 0
    with pytest.raises(ValueError, match="x has 9 elements, expected 10"):
        enc.encode(np.zeros(9, np.float32), 1.0)
    with pytest.raises(ValueError, match="x must have dtype float32, got int32"):
        enc.encode(np.zeros(10, np.int32), 1.0)
    with pytest.raises(ValueError, match="x must be 1-D"):
        enc.encode(np.zeros((2, 5), np.float32), 1.0)
    with pytest.raises(ValueError, match="x must be contiguous"):
        enc.encode(np.zeros(20, np.float32)[::2], 1.0)
    with pytest.raises(ValueError, match="out has 3 elements, expected 8"):
        enc.encode(np.zeros(10, np.float32), 1.0, np.zeros(3, np.uint8))
    enc.step = 77
    assert enc.step == 77


# -- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,message", [
    ("bits", 0, "bits must be in 1..8, got 0"),
    ("bits", 9, "bits must be in 1..8, got 9"),
    ("granularity", 10, "granularity must be in 15..16777215 for bits=4, got 10"),
    ("granularity", 1 << 24, "granularity must be in 15..16777215 for bits=4, got 16777216"),
    ("clip", float("nan"), "clip must be finite and > 0, got nan"),
    ("clip", 0.0, "clip must be finite and > 0, got 0"),
    ("rotation_block", 1000,
     r"rotation_block must be 0 \(the default per partition\) or a power of two, got 1000"),
    ("table", list(range(15)), "table must have 2\\^bits = 16 entries, got 15"),
    ("table", [1] + list(range(1, 16)), "table\\[0\\] must be 0, got 1"),
    ("table", [0, 2, 2] + list(range(3, 16)), "strictly increasing, but table\\[2\\] = 2"),
    ("table", list(range(16)), "table\\[15\\] must equal granularity 30, got 15"),
])
def test_validate_names_field_and_value(field, value, message):
    c = core(ThcConfig())
    assert _C.validate(c) == ""
    setattr(c, field, value)
    assert re.search(message, _C.validate(c)), _C.validate(c)
    with pytest.raises(ValueError, match="invalid THC configuration: .*" + message):
        _C.Encoder(c, 10, 0, False)


@pytest.mark.parametrize("d,block", [(1, None), (3, None), (1000, None), (5, 4), (1000, 1024),
                                     ((1 << 20) + 5, None), ((1 << 20) + 5, 1024),
                                     (3 * 4096 + 1, 4096), (40000, None), (589824, None),
                                     (1100, 64), (1000, 16), (24577, None), (1 << 30, 1 << 32)])
def test_geometry(d, block):
    cfg = ThcConfig(rotation_block=block)
    g = R.geometry(cfg, d)
    assert _C.geometry(core(cfg), d) == {"d": g.d, "block": g.block, "padded": g.padded,
                                          "payload_bytes": g.payload_bytes,
                                          "tail_block": g.tail_block}


@pytest.mark.parametrize("n", [1, 8, 9, 2184, 2185, 143165576, 143165577])
def test_lane_bits(n):
    cfg = ThcConfig()
    if n * cfg.granularity > 0xFFFFFFFF:
        assert _C.lane_bits(core(cfg), n) == 0
    else:
        assert _C.lane_bits(core(cfg), n) == cfg.lane_bits(n)


# -- aggregate -----------------------------------------------------------------------------------
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits,g,n,lane", [(4, 30, 3, 8), (4, 30, 8, 8), (4, 30, 9, 16),
                                           (4, 300, 5, 16), (2, 6, 40, 8), (8, 255, 4, 16),
                                           (3, 7, 20, 8), (4, 30, 3000, 32), (8, 255, 300, 32),
                                           (1, 1, 2, 8), (5, 100, 3, 16)])
@pytest.mark.parametrize("d", [1, 1000, 4099])
def test_aggregate_exact(isa, bits, g, n, lane, d):
    assert _C.force_isa(isa)
    cfg = ThcConfig(bits=bits, granularity=g, rotation_block=1024)
    geo = R.geometry(cfg, d)
    rng = np.random.default_rng(d + n)
    adds = min(n, 6)
    payloads = [rng.integers(0, 256, geo.payload_bytes, dtype=np.uint8) for _ in range(adds)]
    agg = _C.Aggregator(core(cfg), d, n)
    assert agg.lane_bits == lane
    for i, p in enumerate(payloads):
        agg.add(p)
        assert agg.count == i + 1
    got = agg.result()
    want = R.aggregate(cfg, payloads, d, n)
    assert got.dtype == want.dtype and got.dtype.itemsize * 8 == lane
    assert np.array_equal(got, want)
    if adds < n:  # the lane is sized for n; fill it to the brim with the top level
        top = np.full(geo.payload_bytes, 0xFF, dtype=np.uint8)
        agg.reset()
        for _ in range(n):
            agg.add(top)
        assert int(agg.result()[: d].min()) == n * g


def test_aggregate_errors():
    cfg = ThcConfig()
    agg = _C.Aggregator(core(cfg), 1000, 2)
    with pytest.raises(ValueError, match="payload has 499 bytes, "
                                         "expected 512 \\(d=1000, padded=1024, bits=4\\)"):
        agg.add(np.zeros(499, np.uint8))
    agg.add(np.zeros(512, np.uint8))
    agg.add(np.zeros(512, np.uint8))
    with pytest.raises(ValueError, match="already added 2 payloads, num_workers=2"):
        agg.add(np.zeros(512, np.uint8))
    assert agg.count == 2
    agg.reset()
    assert agg.count == 0 and not agg.result().any()
    with pytest.raises(ValueError, match="payload must have dtype uint8, got int8"):
        agg.add(np.zeros(512, np.int8))
    with pytest.raises(ValueError, match="overflows a 32-bit sum lane"):
        _C.Aggregator(core(cfg), 10, 143165577)
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        _C.Aggregator(core(cfg), 10, 0)


# -- decode --------------------------------------------------------------------------------------
def _random_sums(cfg, d, n):
    """What n workers' payloads of a d-vector can sum to: every padded lane in [0, n * G], in the
    lane type of n workers (seeded by d and n)."""
    rng = np.random.default_rng(d + n)
    return rng.integers(0, n * cfg.granularity + 1,
                        R.geometry(cfg, d).padded).astype(R.lane_dtype(cfg, n))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d,block", [(1, None), (3, None), (1000, None), (1000, 256),
                                     ((1 << 20) + 5, 1024), ((1 << 17) + 5, None), (40000, None),
                                     (1100, 64)])
@pytest.mark.parametrize("n,g", [(4, 30), (9, 30), (3000, 30)])
def test_decode_bit_exact(isa, d, block, n, g):
    assert _C.force_isa(isa)
    cfg = ThcConfig(granularity=g, rotation_block=block)
    sums = _random_sums(cfg, d, n)
    for m in (3.5, 1e-3):
        got = _C.decode(core(cfg), d, sums, n, m)
        want = R.decode(cfg, sums, d, n, m)
        assert got.shape == (d,) and got.dtype == np.float32
        assert np.array_equal(bits_of(got), bits_of(want))
    assert not _C.decode(core(cfg), d, sums, n, 0.0).any()


def test_decode_errors():
    cfg = ThcConfig()
    c = core(cfg)
    s8 = np.zeros(1024, np.uint8)
    with pytest.raises(ValueError, match="sums have 8-bit lanes, "
                                         "but num_workers=9 and granularity=30 need 16-bit"):
        _C.decode(c, 1000, s8, 9, 1.0)
    with pytest.raises(ValueError, match="sums have 1000 elements, expected the padded size 1024"):
        _C.decode(c, 1000, np.zeros(1000, np.uint8), 2, 1.0)
    with pytest.raises(ValueError, match="sums must have dtype uint8, uint16 or uint32, got int64"):
        _C.decode(c, 1000, np.zeros(1024, np.int64), 2, 1.0)
    with pytest.raises(ValueError, match="max_norm must be finite, got nan"):
        _C.decode(c, 1000, s8, 2, float("nan"))
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        _C.decode(c, 1000, s8, 0, 1.0)


# -- a whole round through the core, homomorphism ------------------------------------------------
@pytest.mark.parametrize("isa", ISAS)
def test_round_matches_reference_simulation(isa):
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=1024)
    d, n = 10000, 4
    rng = np.random.default_rng(11)
    grads = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
    want, _ = R.simulate_round(cfg, grads, residuals=[R.initial_residual(cfg, d)] * n)
    encs = [_C.Encoder(core(cfg), d, r, True) for r in range(n)]
    m = max(e.norm(g) for e, g in zip(encs, grads))
    agg = _C.Aggregator(core(cfg), d, n)
    for e, g in zip(encs, grads):
        agg.add(e.encode(g, m))
    got = _C.decode(core(cfg), d, agg.result(), n, m)
    assert np.array_equal(bits_of(got), bits_of(want))


def test_core_limits_and_status_texts():
    """The limits come from the round key's layout (rank << 40 ^ step, docs/ALGORITHM.md) and the
    32-bit index space; every status code has its own text, and 0 (ok) none."""
    assert (_C.MAX_SIZE, _C.MAX_RANK, _C.MAX_STEP) == (1 << 32, (1 << 24) - 1, (1 << 40) - 1)
    assert (_C.MAX_GRANULARITY, _C.MAX_ROTATION_BLOCK, _C.MAX_WORKERS) == \
        ((1 << 24) - 1, 1 << 32, (1 << 32) - 1)
    assert (_C.MAX_RANK << 40) | _C.MAX_STEP == (1 << 64) - 1  # rank and step fill the key's input
    assert _C.status_text(0) == ""
    texts = [_C.status_text(code) for code in (1, 2, 3)]
    assert len(set(texts)) == 3 and all(texts)
    assert "NaN or Inf" in texts[0] and "overflowed float32" in texts[2]


def test_core_config_is_the_one_conversion():
    cfg = ThcConfig(bits=3, rotation_block=256, seed=11)
    c = _C.core_config(cfg)
    assert (c.bits, c.granularity, c.clip, c.seed, c.rotation_block) == \
        (3, cfg.granularity, float(cfg.clip), 11, 256)
    assert list(c.table) == [int(v) for v in cfg.table]
    assert _C.core_config(ThcConfig()).rotation_block == 0  # None: the whole partition
    bad = types.SimpleNamespace(bits=2, granularity=3, clip=2.0, seed=1, rotation_block=None,
                                table=[0, 2, 1, 3])
    with pytest.raises(ValueError, match="invalid THC configuration: table must be strictly"):
        _C.core_config(bad)


# -- the way down: packed sums -------------------------------------------------------------------
@pytest.mark.parametrize("n,g,width", [(1, 15, 4), (2, 30, 6), (3, 30, 7), (9, 30, 9),
                                       (2, 126, 8), (2184, 30, 16), (2185, 30, 17),
                                       (143165576, 30, 32)])
def test_sum_bits_is_the_width_of_n_times_g(n, g, width):
    cfg = ThcConfig(granularity=g)
    assert _C.sum_bits(core(cfg), n) == width == R.sum_bits(cfg, n)
    assert (n * g) < (1 << width) and (n * g) >= (1 << (width - 1))


@pytest.mark.parametrize("n,g", [(2, 30), (3, 30), (9, 30), (2185, 30), (1, 255), (600, 7),
                                 (500, 30), (1000, 30)])
@pytest.mark.parametrize("count", [1, 7, 8, 33, 1000])
def test_publish_equals_reference_and_round_trips(n, g, count):
    cfg = ThcConfig(bits=3 if g == 7 else 4, granularity=g)
    rng = np.random.default_rng(n * 1000 + count)
    lanes = rng.integers(0, n * g + 1, count).astype(R.lane_dtype(cfg, n))
    lanes[0] = n * g  # the largest sum uses every bit
    w = R.sum_bits(cfg, n)
    got = _C.publish(core(cfg), n, lanes)
    want = R.pack_sums(lanes, w)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    assert got.size == -(-count * w // 8)
    np.testing.assert_array_equal(R.unpack_sums(got, w, count), lanes.astype(np.uint64))
    # by hand: bit k of sum j is bit j*w + k of the stream
    j, k = count - 1, w - 1
    bit = (int(got[(j * w + k) // 8]) >> ((j * w + k) % 8)) & 1
    assert bit == (int(lanes[j]) >> k) & 1


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d,block", [(1000, None), (40000, None), ((1 << 17) + 5, None),
                                     (1100, 64), (5000, 1024)])
# widths 6, 7 (byte lanes), 8 (the stream is the lanes), 9, 14 (the widest a byte shuffle
# unpacks), 15, 16, 17 (one sum at a time)
@pytest.mark.parametrize("n,g", [(2, 30), (3, 30), (8, 30), (9, 30), (500, 30), (1000, 30),
                                 (2000, 30), (3000, 30)])
def test_decode_published_bit_exact(isa, d, block, n, g):
    assert _C.force_isa(isa)
    cfg = ThcConfig(granularity=g, rotation_block=block)
    sums = _random_sums(cfg, d, n)
    packed = R.publish(cfg, sums, d, n)
    for m in (3.5, 1e-3):
        got = _C.decode_published(core(cfg), d, packed, n, m)
        want = R.decode(cfg, sums, d, n, m)
        assert np.array_equal(bits_of(got), bits_of(want))


def test_publish_and_decode_published_errors():
    cfg = ThcConfig()
    c = core(cfg)
    with pytest.raises(ValueError, match="sums have 8-bit lanes, narrower than the 9 bits"):
        _C.publish(c, 9, np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="packed sums of 10 bytes, expected 768 "
                                         r"\(1024 sums of 6 bits\)"):
        _C.decode_published(c, 1000, np.zeros(10, np.uint8), 2, 1.0)
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        _C.sum_bits(c, 0)
    with pytest.raises(ValueError, match="overflows a 32-bit sum"):
        _C.sum_bits(c, 143165577)
    with pytest.raises(ValueError, match="does not fit 6 bits"):
        R.pack_sums(np.array([64]), 6)
