"""block_scale in the C++ core (byteps_thc._C) against the NumPy reference, bit for bit, on every
ISA: payloads and error-feedback residuals over several steps (the norm's rotation reused, and
not), with blocks of different scales and a block of M_k = 0; the decode from lanes and from the
packed reply, mean and total; one thread and several; the refusals."""
import dataclasses

import numpy as np
import pytest

from byteps_thc import ThcCodec, ThcConfig
from byteps_thc.thc import reference as R

_C = pytest.importorskip("byteps_thc._C")
from test_kernels import ISAS, restore_isa  # noqa: E402,F401 (the ISAs; restore_isa is autouse)


def bits_of(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _grad(rng, cfg, d):
    """Normals whose blocks differ in scale by decades (10^-4 .. 10^2)."""
    sizes = R.block_sizes(R.geometry(cfg, d))
    scale = np.repeat(10.0 ** rng.integers(-4, 3, sizes.size), sizes)[:d]
    return (rng.standard_normal(d) * scale).astype(np.float32)


CASES = [  # (d, rotation_block, bits, threads)
    (5000, 1024, 4, 1),
    (5000, 1024, 4, 3),
    (40, 32, 3, 1),
    (100, None, 2, 1),
    ((1 << 16) * 3 + 100, 1 << 16, 8, 2),
    (589824, None, 4, 2),   # tiled: 2^19 + 2^16
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d,block,bits,threads", CASES)
@pytest.mark.parametrize("ef", [True, False])
def test_encode_and_decode_equal_the_reference(isa, d, block, bits, threads, ef):
    assert _C.force_isa(isa)
    if d > 100000 and isa != ISAS[-1] and not ef:
        pytest.skip("the large partitions once per ISA suffice")
    cfg = ThcConfig(bits=bits, granularity=max(30, 2 * ((1 << bits) - 1)), rotation_block=block,
                    block_scale=True, error_feedback=ef)
    rng = np.random.default_rng(d + bits)
    enc = _C.Encoder(_C.core_config(cfg), d, 1, ef)
    enc.threads = threads
    nb = R.num_blocks(cfg, d)
    assert enc.blocks == nb
    res = R.initial_residual(cfg, d) if ef else None
    for step in range(3):
        x = _grad(rng, cfg, d)
        want_norms = R.block_norms(x, res, cfg)
        # the agreed M_k: above this rank's own (another rank's larger), one block's 0 at step 1
        m = want_norms * rng.uniform(1.0, 1.5, nb)
        if step == 1:
            x[:min(d, int(R.block_sizes(R.geometry(cfg, d))[0]))] = 0
            want_norms = R.block_norms(x, res, cfg)
            m = want_norms * 1.25
            if ef:
                m[0] = 0.0  # the residual of block 0 is kept, not sent
        if step != 2:  # step 2 encodes without the norm's rotation
            np.testing.assert_allclose(enc.block_norms(x), want_norms, rtol=1e-6, atol=1e-30)
        p_want, res_new, _ = R.encode(cfg, x, m, 1, step, res)
        payload = enc.encode(x, m)
        assert np.array_equal(payload, p_want), step
        if ef:
            assert np.array_equal(bits_of(enc.residual), bits_of(res_new)), step
        res = res_new
        # a second worker's payload, the sums, and every decode
        other, _, _ = R.encode(cfg, _grad(rng, cfg, d), m, 0, step, None if not ef else
                               R.initial_residual(cfg, d))
        sums = R.aggregate(cfg, [payload, other], d, 2)
        got = _C.decode(_C.core_config(cfg), d, sums, 2, m, None, threads)
        assert np.array_equal(bits_of(got), bits_of(R.decode(cfg, sums, d, 2, m))), step
        packed = R.publish(cfg, sums, d, 2)
        for total in (False, True):
            got = _C.decode_published(_C.core_config(cfg), d, packed, 2, m, total, threads)
            want = R.decode_published(cfg, packed, d, 2, m, total)
            assert np.array_equal(bits_of(got), bits_of(want)), (step, total)


@pytest.mark.parametrize("isa", ISAS)
def test_one_block_equals_the_default_mode(isa):
    # a partition of one block: block_scale's payload, state and decode are the default's
    assert _C.force_isa(isa)
    d = 3000
    base = ThcConfig()
    bs = dataclasses.replace(base, block_scale=True)
    x = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    a, b = ThcCodec(base, d, rank=2), ThcCodec(bs, d, rank=2)
    for _ in range(3):
        m = a.norm(x)
        mb = b.norm(x)
        assert mb.shape == (1,) and mb[0] == pytest.approx(m, rel=1e-12)
        assert np.array_equal(a.encode(x, m), b.encode(x, np.array([m])))
        assert np.array_equal(bits_of(a.residual), bits_of(b.residual))


def test_refusals_keep_the_state():
    cfg = ThcConfig(rotation_block=1024, block_scale=True)
    d = 5000
    codec = ThcCodec(cfg, d, rank=0)
    x = np.random.default_rng(2).standard_normal(d).astype(np.float32)
    m = codec.norm(x)
    assert m.shape == (5,) and codec.blocks == 5
    for bad, match in ((m[:4], "has 4 elements, expected 5"),
                       (float(m.max()), "one max norm per rotation block \\(5\\)"),
                       (np.where(np.arange(5) == 2, np.nan, m), "block 2 must be finite"),
                       (-m, "block 0 must be finite and >= 0")):
        with pytest.raises(ValueError, match=match):
            codec.encode(x, bad)
        with pytest.raises(ValueError, match=match):
            codec.decode(np.zeros(codec.padded, np.uint8), bad, 2)
    assert codec.step == 0 and not codec.residual.any()
    x[3] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        codec.norm(x)
    with pytest.raises(ValueError, match="NaN or Inf"):
        codec.encode(x, m)
    assert codec.step == 0 and not codec.residual.any()
    with pytest.raises(ValueError, match="block_scale is off"):
        ThcCodec(ThcConfig(), d).encode(x, m)
    c = _C.core_config(cfg)
    c.rotation_block = 16
    assert "block_scale needs rotation blocks of at least 32" in _C.validate(c)
