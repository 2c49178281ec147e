"""The public codec API: byteps_thc.ThcCodec / ThcAggregator on top of the C++ core.

Pinned: equality with the NumPy reference through the public classes, the accuracy figures of
the spec (one round, n workers), homomorphism, input conversion (NumPy and torch CPU tensors,
float16/bfloat16/float64 converted, other dtypes refused by name), and that every bad input is
a ValueError saying what was wrong, with nothing changed.
"""
import threading

import numpy as np
import pytest

from byteps_thc import ThcAggregator, ThcCodec, ThcConfig
from byteps_thc.thc import reference as R

pytest.importorskip("byteps_thc._C")

from test_kernels import bits_of  # the float32 bit view


def run_round(cfg, grads, codecs=None):
    n, d = len(grads), grads[0].size
    codecs = codecs or [ThcCodec(cfg, size=d, rank=r) for r in range(n)]
    m = max(c.norm(g) for c, g in zip(codecs, grads))
    agg = ThcAggregator(cfg, size=d, num_workers=n)
    for c, g in zip(codecs, grads):
        agg.add(c.encode(g, m))
    return codecs[0].decode(agg.result(), m, num_workers=n), codecs, m


@pytest.mark.parametrize("ef", [False, True])
def test_public_round_equals_reference(ef):
    cfg = ThcConfig(rotation_block=1024, error_feedback=ef)
    d, n = 3000, 3
    rng = np.random.default_rng(0)
    codecs = [ThcCodec(cfg, size=d, rank=r) for r in range(n)]
    res = [R.initial_residual(cfg, d) if ef else None for _ in range(n)]
    for step in range(3):
        grads = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
        want, res = R.simulate_round(cfg, grads, step=step, residuals=res)
        got, _, _ = run_round(cfg, grads, codecs)
        assert np.array_equal(bits_of(got), bits_of(want))
        for c, r in zip(codecs, res):
            assert c.step == step + 1
            if ef:
                assert np.array_equal(bits_of(c.residual), bits_of(r))
            else:
                assert c.residual is None


@pytest.mark.parametrize("n,expect", [(1, 0.0204), (2, 0.0102), (4, 0.0051), (8, 0.0025)])
def test_accuracy_matches_spec(n, expect):
    """Spec §4: NMSE of one round, standard normal inputs, 1024-wide blocks, no EF."""
    cfg = ThcConfig(rotation_block=1024, error_feedback=False)
    d = 1 << 18
    rng = np.random.default_rng(n)
    grads = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
    est, _, _ = run_round(cfg, grads)
    mean = np.mean(grads, axis=0)
    nmse = np.sum((est - mean) ** 2) / np.mean([np.sum(g.astype(np.float64) ** 2) for g in grads])
    assert nmse == pytest.approx(expect, rel=0.08)


def test_homomorphism_sum_of_encodes_is_mean_of_decodes():
    cfg = ThcConfig(rotation_block=256, error_feedback=False)
    d, n = 4000, 4
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
    codecs = [ThcCodec(cfg, size=d, rank=r) for r in range(n)]
    m = max(c.norm(g) for c, g in zip(codecs, grads))
    payloads = [c.encode(g, m) for c, g in zip(codecs, grads)]
    agg = ThcAggregator(cfg, size=d, num_workers=n)
    singles = []
    for p in payloads:
        agg.add(p)
        one = ThcAggregator(cfg, size=d, num_workers=1)
        one.add(p)
        singles.append(one.result().astype(np.int64))
    assert np.array_equal(agg.result().astype(np.int64), sum(singles))  # exact, integers
    together = codecs[0].decode(agg.result(), m, num_workers=n)
    apart = np.mean([codecs[0].decode(s.astype(np.uint8), m, num_workers=1) for s in singles],
                    axis=0)
    np.testing.assert_allclose(together, apart, rtol=1e-4, atol=1e-5 * float(np.abs(apart).max()))


def test_unbiased_over_steps():
    cfg = ThcConfig(rotation_block=512, error_feedback=False)
    d = 512
    x = np.random.default_rng(2).standard_normal(d).astype(np.float32) * 0.3
    c = ThcCodec(cfg, size=d)
    m = c.norm(x) * 2  # nothing clipped
    acc = np.zeros(d)
    steps = 400
    for _ in range(steps):
        agg = ThcAggregator(cfg, size=d, num_workers=1)
        agg.add(c.encode(x, m))
        acc += c.decode(agg.result(), m, num_workers=1)
    err = np.abs(acc / steps - x)
    assert err.mean() < 0.05 * np.abs(x).mean() + 1e-3


# -- inputs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_numpy_dtypes_converted(dtype):
    cfg = ThcConfig(rotation_block=128)
    x = np.random.default_rng(0).standard_normal(300).astype(dtype)
    a, b = ThcCodec(cfg, size=300), ThcCodec(cfg, size=300)
    assert np.array_equal(a.encode(x, 20.0), b.encode(x.astype(np.float32), 20.0))


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "complex64", "uint8"])
def test_other_dtypes_refused_by_name(dtype):
    c = ThcCodec(ThcConfig(), size=10)
    with pytest.raises(ValueError, match=f"x has dtype {dtype}; expected float32"):
        c.encode(np.zeros(10, dtype=dtype), 1.0)
    with pytest.raises(ValueError, match=f"x has dtype {dtype}"):
        c.norm(np.zeros(10, dtype=dtype))


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    cfg = ThcConfig(rotation_block=128)
    x = torch.randn(300, generator=torch.Generator().manual_seed(0))
    ref = ThcCodec(cfg, size=300).encode(x.numpy(), 20.0)
    for t in (x, x.double(), x.clone().requires_grad_(True)):
        assert np.array_equal(ThcCodec(cfg, size=300).encode(t, torch.tensor(20.0)), ref)
    for t in (x.half(), x.bfloat16()):
        want = ThcCodec(cfg, size=300).encode(t.float().numpy(), 20.0)
        assert np.array_equal(ThcCodec(cfg, size=300).encode(t, 20.0), want)
    with pytest.raises(ValueError, match="x has dtype int64; expected float32"):
        ThcCodec(cfg, size=300).encode(torch.zeros(300, dtype=torch.int64), 1.0)
    # payloads and sums as tensors too
    c = ThcCodec(cfg, size=300)
    p = c.encode(x, 20.0)
    agg = ThcAggregator(cfg, size=300, num_workers=1)
    agg.add(torch.from_numpy(p))
    out = c.decode(torch.from_numpy(agg.result()), 20.0, num_workers=1)
    assert out.dtype == np.float32 and out.shape == (300,)


def test_torch_cuda_tensor_without_cuda_build():
    torch = pytest.importorskip("torch")
    from byteps_thc import _C
    if _C.with_cuda or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device and an extension built without CUDA")
    c = ThcCodec(ThcConfig(), size=10)
    with pytest.raises(ValueError, match="CUDA tensor"):
        c.encode(torch.zeros(10, device="cuda"), 1.0)


def test_zero_max_norm():
    cfg = ThcConfig(rotation_block=64)
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    c = ThcCodec(cfg, size=100)
    p = c.encode(x, 0.0)
    assert not p.any() and c.step == 1
    np.testing.assert_allclose(R.unrotate_residual(cfg, c.residual, 100), x, atol=1e-6)  # all kept
    agg = ThcAggregator(cfg, size=100, num_workers=2)
    agg.add(p)
    out = c.decode(agg.result(), 0.0, num_workers=2)
    assert out.shape == (100,) and not out.any()


@pytest.mark.parametrize("bad,msg", [(np.nan, "max_norm is NaN"), (np.inf, "max_norm is inf"),
                                     (-1.0, "max_norm=-1.0 must be >= 0"),
                                     ("x", "max_norm='x' must be a number")])
def test_bad_max_norm(bad, msg):
    c = ThcCodec(ThcConfig(), size=10)
    with pytest.raises(ValueError, match=msg):
        c.encode(np.zeros(10, np.float32), bad)
    with pytest.raises(ValueError, match=msg):
        c.decode(np.zeros(16, np.uint8), bad, num_workers=1)
    assert c.step == 0


def _after_one_step():
    """A codec one step in (error feedback on), the gradient of that step, its residual and step."""
    c = ThcCodec(ThcConfig(rotation_block=256), size=1000)
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c.encode(x, 50.0)
    return c, x, c.residual, c.step


def test_non_finite_input_changes_nothing():
    c, x, res, step = _after_one_step()
    y = x.copy()
    y[999] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        c.norm(y)
    with pytest.raises(ValueError, match="NaN or Inf.*; nothing was changed"):
        c.encode(y, 50.0)
    assert c.step == step and np.array_equal(c.residual, res)


def test_overflow_inside_the_transform_changes_nothing():
    """Finite inputs near FLT_MAX whose Hadamard sums overflow: a ValueError, as for NaN/Inf."""
    c, x, res, step = _after_one_step()
    y = x.copy()
    y[:32] = 3e38  # finite; any two of them with the same sign sum past FLT_MAX
    with pytest.raises(ValueError, match="overflowed float32.*nothing was changed"):
        c.encode(y, 1e30)
    assert c.step == step and np.array_equal(c.residual, res)


def test_sizes_and_counts():
    cfg = ThcConfig()
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"size={bad} must be"):
            ThcCodec(cfg, size=bad)
        with pytest.raises(ValueError, match=f"size={bad} must be"):
            ThcAggregator(cfg, size=bad, num_workers=2)
    with pytest.raises(ValueError, match="size=2.5 must be an integer"):
        ThcCodec(cfg, size=2.5)
    with pytest.raises(ValueError, match="cfg must be a ThcConfig, got dict"):
        ThcCodec({}, size=3)
    c = ThcCodec(cfg, size=10)
    with pytest.raises(ValueError,
                       match="x has 9 elements, but this codec's partition has size=10"):
        c.encode(np.zeros(9, np.float32), 1.0)
    with pytest.raises(ValueError, match="x must be 1-D, got shape \\(2, 5\\)"):
        c.encode(np.zeros((2, 5), np.float32), 1.0)
    agg = ThcAggregator(cfg, size=10, num_workers=1)
    with pytest.raises(ValueError, match="payload has 5 bytes, expected 8"):
        agg.add(np.zeros(5, np.uint8))
    agg.add(bytes(8))
    with pytest.raises(ValueError, match="already added 1 payloads, num_workers=1"):
        agg.add(np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="payload has dtype float32; expected uint8"):
        agg.add(np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="sums have 10 elements, expected the padded size 16"):
        c.decode(np.zeros(10, np.uint8), 1.0, num_workers=1)
    with pytest.raises(ValueError, match="need 16-bit lanes"):
        c.decode(np.zeros(16, np.uint8), 1.0, num_workers=10)


def test_overflow_prone_configuration_refused():
    cfg = ThcConfig(granularity=30)
    with pytest.raises(ValueError, match="overflows a 32-bit sum"):
        ThcAggregator(cfg, size=10, num_workers=(1 << 32) // 30 + 1)
    c = ThcCodec(cfg, size=10)
    with pytest.raises(ValueError, match="overflows a 32-bit sum"):
        c.decode(np.zeros(16, np.uint32), 1.0, num_workers=(1 << 32) // 30 + 1)


def test_lane_width_follows_workers():
    cfg = ThcConfig(granularity=30)
    for n, dt in [(8, np.uint8), (9, np.uint16), (2184, np.uint16), (2185, np.uint32)]:
        agg = ThcAggregator(cfg, size=5, num_workers=n)
        assert agg.result().dtype == dt and agg.lane_bits == np.dtype(dt).itemsize * 8


def test_step_and_residual_controls():
    c = ThcCodec(ThcConfig(), size=10, rank=3)
    c.step = 41
    assert c.step == 41
    with pytest.raises(ValueError, match="step=-1 must be"):
        c.step = -1
    c.encode(np.ones(10, np.float32), 10.0)
    assert c.residual.any()
    c.reset_residual()
    assert not c.residual.any()
    with pytest.raises(ValueError, match="rank=16777216 must be"):
        ThcCodec(ThcConfig(), size=10, rank=1 << 24)


def test_out_buffers():
    cfg = ThcConfig(rotation_block=64)
    c = ThcCodec(cfg, size=100)
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    buf = np.empty(c.payload_bytes, np.uint8)
    assert c.encode(x, 20.0, out=buf) is not None and buf.any()
    agg = ThcAggregator(cfg, size=100, num_workers=1)
    agg.add(buf)
    out = np.empty(100, np.float32)
    c.decode(agg.result(), 20.0, num_workers=1, out=out)
    assert np.array_equal(out, c.decode(agg.result(), 20.0, num_workers=1))


def test_partitions_in_parallel_threads_match_serial():
    cfg = ThcConfig(rotation_block=1024)
    d = 1 << 16
    xs = [np.random.default_rng(i).standard_normal(d).astype(np.float32) for i in range(4)]
    serial = [ThcCodec(cfg, size=d, rank=i).encode(x, 300.0) for i, x in enumerate(xs)]
    out = [None] * 4

    def work(i):
        c = ThcCodec(cfg, size=d, rank=i)
        out[i] = c.encode(xs[i], 300.0)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(np.array_equal(a, b) for a, b in zip(serial, out))
