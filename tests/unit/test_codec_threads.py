"""One partition's codec on several threads (ThcCodec(..., threads=T), _C's `threads`).

The chunks of a partition (whole rotation blocks) are split over the threads, or, for a
partition of one large block, that block's transform (its sub-blocks, then its top pass by
offsets); what they share (the norm's binary64 sum, the first error, the residual's bound, the
non-finite check) is combined in order or by an exact maximum. So
norms, payloads, residuals and decodes equal the NumPy reference's, bit for bit, at every
thread count and on every ISA, and errors are the ones a single thread reports.
"""
import numpy as np
import pytest

from byteps_thc.thc import reference as R
from byteps_thc.thc.codec import ThcCodec
from byteps_thc.thc.config import ThcConfig

_C = pytest.importorskip("byteps_thc._C")

# the ISAs this host can force (found once), the fixture that restores the ISA after each test,
# and the float32 bit view
from test_kernels import ISAS, bits_of, restore_isa  # noqa: E402, F401

THREADS = (2, 3, 8)


def _inputs(d, steps, seed):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(d) * (1 + s)).astype(np.float32) for s in range(steps)]
    for x in xs:
        x[5] = 30.0  # something the clip cuts
    return xs


# (d, rotation block): 1024-blocks in chunks of 2048 (the tail chunk partial); a tiled partition
# (2^17 blocks and a 2^14 tail, so two runs); blocks of 2^16 (one chunk per block); one block
# split inside: 2^17, and a BytePS partition of 1,024,000 floats padded to one block of 2^20.
GEOMETRIES = [((1 << 18) + 1000, 1024), ((1 << 19) + 3 * (1 << 14) - 7, None),
              (5 * (1 << 16), 1 << 16), (1 << 17, None), (1024000, None)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d,block", GEOMETRIES)
@pytest.mark.parametrize("ef", [False, True])
def test_threads_equal_the_reference(isa, d, block, ef):
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=block, error_feedback=ef)
    rank, n = 3, 2
    xs = _inputs(d, 2, seed=d % 1000 + ef)
    expect = []
    res = R.initial_residual(cfg, d) if ef else None
    for step, x in enumerate(xs):
        m = R.norm(x, res, cfg)
        payload, res, _ = R.encode(cfg, x, m * 0.9, rank, step, res)
        expect.append((m, payload, None if res is None else res.copy()))
    other = R.encode(cfg, xs[0][::-1].copy(), expect[0][0], rank + 1, 0,
                     R.initial_residual(cfg, d) if ef else None)[0]
    sums = R.aggregate(cfg, [expect[-1][1], other], d, n)
    want_dec = R.decode(cfg, sums, d, n, expect[-1][0])
    packed = R.publish(cfg, sums, d, n)
    want_total = R.decode_published(cfg, packed, d, n, expect[-1][0], total=True)
    for t in THREADS:
        codec = ThcCodec(cfg, d, rank=rank, threads=t)
        assert codec.threads == t
        for step, x in enumerate(xs):
            m, want, want_res = expect[step]
            # norm() then encode() of the same x reuses the rotation: the prepared path
            assert codec.norm(x) == pytest.approx(m, rel=1e-6)
            assert np.array_equal(codec.encode(x, m * 0.9), want), (t, step)
            if ef:
                assert np.array_equal(bits_of(codec.residual), bits_of(want_res)), (t, step)
        got = codec.decode(sums, expect[-1][0], n)
        assert np.array_equal(bits_of(got), bits_of(want_dec)), t
        got = _C.decode_published(_C.core_config(cfg), d, packed, n, expect[-1][0], total=True,
                                  threads=t)
        assert np.array_equal(bits_of(got), bits_of(want_total)), t


@pytest.mark.parametrize("isa", ISAS)
def test_threads_without_norm_first_and_the_norms_bits(isa):
    """encode() without the norm() of that step (the unprepared path) equals the reference, and
    the norm's bits do not depend on the thread count (the chunks' sums are added in order)."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=1024, error_feedback=True)
    d = (1 << 18) + 77
    x = _inputs(d, 1, seed=9)[0]
    res = R.initial_residual(cfg, d)
    m = R.norm(x, res, cfg)
    want, want_res, _ = R.encode(cfg, x, m, 0, 0, res)
    norms = set()
    for t in (1,) + THREADS:
        codec = ThcCodec(cfg, d, threads=t)
        assert np.array_equal(codec.encode(x, m), want), t
        assert np.array_equal(bits_of(codec.residual), bits_of(want_res)), t
        norms.add(ThcCodec(cfg, d, threads=t).norm(x))
    assert len(norms) == 1 and norms.pop() == pytest.approx(m, rel=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("block", [1024, None])
def test_threads_report_the_first_failing_chunk(isa, ef, block):
    """A NaN late in the partition and an overflow early: every thread count reports the early
    chunk's error (as one thread does) and changes nothing; the same within one block."""
    assert _C.force_isa(isa)
    cfg = ThcConfig(rotation_block=block, error_feedback=ef)
    d = 1 << 18
    x = _inputs(d, 1, seed=2)[0]
    bad = x.copy()
    bad[d - 10] = np.nan
    bad[100:1124] = 3e38  # a block whose transform overflows float32
    for t in (1,) + THREADS:
        codec = ThcCodec(cfg, d, threads=t)
        # one block: its NaN is seen first, wherever it is (the source's check precedes the
        # overflow's)
        with pytest.raises(ValueError, match="overflowed float32" if block else "NaN or Inf"):
            codec.encode(bad, 1.0)
        assert codec.step == 0
        if ef:
            assert not codec.residual.any()
        late = x.copy()
        late[d - 10] = np.inf
        with pytest.raises(ValueError, match="NaN or Inf"):
            codec.encode(late, 1.0)
        assert codec.step == 0


@pytest.mark.parametrize("bad", [0, -1, _C.MAX_THREADS + 1, 1.5, True])
def test_bad_thread_counts_are_refused_by_value(bad):
    cfg = ThcConfig()
    with pytest.raises(ValueError, match="threads="):
        ThcCodec(cfg, 1000, threads=bad)
    codec = ThcCodec(cfg, 1000)
    with pytest.raises(ValueError, match="threads="):
        codec.threads = bad
    assert codec.threads == 1
    if isinstance(bad, int) and not isinstance(bad, bool):
        with pytest.raises(ValueError, match=f"threads must be in 1..{_C.MAX_THREADS}"):
            _C.decode(_C.core_config(cfg), 1000, np.zeros(1024, np.uint8), 1, 1.0, None, bad)
