"""The THC codec in plain NumPy, written to be read: docs/ALGORITHM.md, step by step.

This is the ground truth. Every kernel (CPU SIMD, CUDA) is tested against it, bit for bit where
the arithmetic allows. Every float operation here is a binary32 operation (NumPy float32 arrays
times float32 scalars), in the order the contract gives; constants are computed in binary64 and
rounded once. It is slow on purpose: no fusion, no cleverness.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..common.hashes import M32, M64, hash32, splitmix64
from .config import AUTO_MIN_BLOCK, AUTO_PAD_DEN, AUTO_PAD_NUM, TILE_ALIGN, ThcConfig, next_pow2

F32 = np.float32


# -- random streams (splitmix64 and hash32: byteps_thc.common.hashes) ---------------------------
def sign_key(seed: int) -> int:
    return splitmix64(seed) & M32


def round_key(seed: int, rank: int, step: int) -> int:
    return splitmix64(splitmix64(seed ^ 0x5448435F524E4421)
                      ^ splitmix64(((rank << 40) ^ step) & M64)) & M32


def sign_bits(seed: int, n: int) -> np.ndarray:
    """neg_j in {0, 1} for j < n: 1 where coordinate j has its sign flipped."""
    j = np.arange(n, dtype=np.uint64)
    words = hash32((np.uint32(sign_key(seed)) ^ (j >> np.uint64(5)).astype(np.uint32)))
    return ((words >> (j & np.uint64(31)).astype(np.uint32)) & np.uint32(1)).astype(np.uint32)


def uniforms(seed: int, rank: int, step: int, n: int) -> np.ndarray:
    """u_j in [0, 1) for j < n, exact binary32 multiples of 2^-24."""
    j = np.arange(n, dtype=np.uint64).astype(np.uint32)
    h = hash32(np.uint32(round_key(seed, rank, step)) ^ j)
    return (h >> np.uint32(8)).astype(F32) * F32(2.0 ** -24)


def apply_signs(v: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Flip the sign bit where neg = 1 (exact, zeros included)."""
    bits = (np.ascontiguousarray(v, dtype=F32).view(np.uint32)
            ^ (neg.astype(np.uint32) << np.uint32(31)))
    return bits.view(F32)


# -- transform -----------------------------------------------------------------------------------
def fwht(v: np.ndarray, block: int) -> np.ndarray:
    """Unnormalised Walsh-Hadamard transform of each block; stages h = 1, 2, 4, ... in order."""
    v = np.array(v, dtype=F32)
    n = v.size
    assert n % block == 0 and block & (block - 1) == 0
    h = 1
    while h < block:
        w = v.reshape(-1, 2, h)
        a = w[:, 0, :].copy()
        b = w[:, 1, :]
        w[:, 0, :] = a + b
        w[:, 1, :] = a - b
        h *= 2
    return v


def fwht_tiled(v: np.ndarray, geo) -> np.ndarray:
    """fwht of each run of equal blocks of a tiled partition (`geo.segments()`)."""
    v = np.array(v, dtype=F32)
    for start, length, block in geo.segments():
        v[start:start + length] = fwht(v[start:start + length], block)
    return v


# -- geometry ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """A partition of d values tiled by rotation blocks (docs/ALGORITHM.md, "Geometry"):
    floor(d / block) blocks of `block`, then, when d is not a multiple of it, one last block of
    `tail_block` (the default block only: the remainder rounded up to a power of two, < block)
    or one more of `block` (tail_block 0). padded = d_pad, the coordinates encoded and summed."""
    d: int
    block: int
    padded: int
    payload_bytes: int
    tail_block: int = 0

    def segments(self):
        """[(start, length, block)]: the runs of equal blocks, in order (one or two)."""
        main = self.padded - self.tail_block
        out = [(0, main, self.block)] if main else []
        if self.tail_block:
            out.append((main, self.tail_block, self.tail_block))
        return out


def tiled_size(d: int, block: int) -> int:
    """d_pad of d values under rotation blocks of at most `block` (the tiling rule)."""
    return _tile(d, block)[0]


def _tile(d: int, block: int):
    full, rest = divmod(d, block)
    if rest == 0:
        return full * block, 0
    tail = next_pow2(rest)
    # Blocks below TILE_ALIGN would start off the 32-coordinate grid the sign words and the
    # byte-aligned payload need: such a partition pads its last block to `block` instead.
    if tail >= block or block < TILE_ALIGN:
        return (full + 1) * block, 0
    return full * block + tail, tail


def auto_block(d: int) -> int:
    """The default rotation block of a partition of d values (rotation_block None): the largest
    power of two B in [AUTO_MIN_BLOCK, next_pow2(d)] whose tiling keeps d_pad <= AUTO_PAD_NUM /
    AUTO_PAD_DEN (1.05) * d; if none does, the one of least d_pad (the larger on a tie);
    next_pow2(d) (one block) when d <= AUTO_MIN_BLOCK."""
    whole = next_pow2(d)
    if whole <= AUTO_MIN_BLOCK:
        return whole
    best, b = whole, whole
    while b >= AUTO_MIN_BLOCK:
        size = tiled_size(d, b)
        if size * AUTO_PAD_DEN <= d * AUTO_PAD_NUM:
            return b
        if size < tiled_size(d, best):
            best = b
        b //= 2
    return best


def geometry(cfg: ThcConfig, d: int) -> Geometry:
    if not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"size={d!r}: a partition needs at least one element")
    d = int(d)
    if cfg.rotation_block:  # blocks of one size, the last one padded (what the CUDA kernels do)
        block = min(cfg.rotation_block, next_pow2(d))
        padded, tail = -(-d // block) * block, 0
    else:
        block = auto_block(d)
        padded, tail = _tile(d, block)
    return Geometry(d, block, padded, -(-padded * cfg.bits // 8), tail)


def block_sizes(geo: Geometry) -> np.ndarray:
    """The size of each rotation block of the partition, in order (int64): the blocks whose
    scales a block_scale configuration sends, one max norm each."""
    return np.concatenate([np.full(length // block, block, dtype=np.int64)
                           for _, length, block in geo.segments()])


def num_blocks(cfg: ThcConfig, d: int) -> int:
    """Rotation blocks of a partition of d values: the length of its vector of block norms."""
    return int(block_sizes(geometry(cfg, d)).size)


def lane_dtype(cfg: ThcConfig, num_workers: int):
    return {8: np.uint8, 16: np.uint16, 32: np.uint32}[cfg.lane_bits(num_workers)]


def _tables(cfg: ThcConfig):
    tbl = np.array(cfg.table, dtype=np.int64)
    k = np.arange(cfg.granularity + 1)
    lvl = np.searchsorted(tbl, k, side="right") - 1       # largest i with TBL[i] <= k
    ig = np.array([1.0 / (tbl[i + 1] - tbl[i]) for i in range(tbl.size - 1)],
                  dtype=np.float64).astype(F32)
    return tbl, lvl, ig


# -- packing -------------------------------------------------------------------------------------
def pack(indices: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first bit stream: index j occupies bits [j*bits, j*bits + bits)."""
    idx = np.asarray(indices, dtype=np.uint8)
    bitplanes = ((idx[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(bitplanes, bitorder="little")


def unpack(payload: np.ndarray, bits: int, n: int) -> np.ndarray:
    stream = np.unpackbits(np.asarray(payload, dtype=np.uint8), bitorder="little")[: n * bits]
    planes = stream.reshape(n, bits).astype(np.uint8)
    return (planes << np.arange(bits, dtype=np.uint8)).sum(axis=1).astype(np.uint8)


# -- the codec -----------------------------------------------------------------------------------
def _padded_input(grad, geo):
    x = np.zeros(geo.padded, dtype=F32)
    x[: geo.d] = np.asarray(grad, dtype=F32)
    if not np.all(np.isfinite(x)):
        raise ValueError("gradient contains NaN or Inf")
    return x


_OVERFLOW = ("the Hadamard rotation overflowed float32 (Inf from finite values near FLT_MAX, or a "
             "max_norm so large that the error-feedback scale is Inf)")


def rotate(cfg: ThcConfig, grad, residual=None) -> np.ndarray:
    """Encode steps 1-2: y = Hu(sign * x) per block, plus the rotated error-feedback residual r."""
    grad = np.asarray(grad)
    geo = geometry(cfg, grad.size)
    x = _padded_input(grad, geo)
    with np.errstate(over="ignore", invalid="ignore"):
        y = fwht_tiled(apply_signs(x, sign_bits(cfg.seed, geo.padded)), geo)
        if residual is not None:
            r = np.asarray(residual, dtype=F32)
            if r.size != geo.padded:
                raise ValueError(f"residual of {r.size} floats; expected d_pad = {geo.padded}")
            y = y + r
    if not np.all(np.isfinite(y)):
        raise ValueError(_OVERFLOW)
    return y


def norm(grad, residual=None, cfg: ThcConfig = None) -> float:
    """The local norm: ||grad|| without error feedback; with it (residual = the rotated state r,
    cfg required) sqrt(sum over the blocks of sum(y^2) / B) = ||grad + textbook residual||,
    each run of equal blocks summed in binary64 and divided by its block."""
    if residual is None:
        x = np.asarray(grad, dtype=F32)
        if not np.all(np.isfinite(x)):
            raise ValueError("gradient contains NaN or Inf")
        return math.sqrt(float(np.dot(x.astype(np.float64), x.astype(np.float64))))
    if cfg is None:
        raise ValueError("norm with a residual needs cfg (the residual is kept rotated)")
    y = rotate(cfg, grad, residual).astype(np.float64)
    geo = geometry(cfg, np.asarray(grad).size)
    total = 0.0
    for start, length, block in geo.segments():
        part = y[start:start + length]
        total += float(np.dot(part, part)) / block
    return math.sqrt(total)


def block_norms(grad, residual=None, cfg: ThcConfig = None) -> np.ndarray:
    """The local norm of each rotation block (block_scale; float64, one per block in order):
    without error feedback ||grad restricted to the block||, with it (residual = the rotated
    state r) sqrt(sum over the block of y^2 / B), each block summed in binary64."""
    if cfg is None:
        raise ValueError("block_norms needs cfg (the blocks are the configuration's)")
    grad = np.asarray(grad)
    geo = geometry(cfg, grad.size)
    if residual is None:
        y, ef = _padded_input(grad, geo).astype(np.float64), False
    else:
        y, ef = rotate(cfg, grad, residual).astype(np.float64), True
    out = []
    for start, length, block in geo.segments():
        sq = np.sum(np.square(y[start:start + length].reshape(-1, block)), axis=1)
        out.append(np.sqrt(sq / block if ef else sq))
    return np.concatenate(out)


def _block_max_norms(cfg: ThcConfig, geo: Geometry, max_norm) -> np.ndarray:
    """max_norm of a block_scale configuration checked: one finite value >= 0 per block."""
    m = np.asarray(max_norm, dtype=np.float64)
    nb = block_sizes(geo).size
    if m.ndim != 1 or m.size != nb:
        raise ValueError(f"block_scale: max_norm must hold one max norm per rotation block "
                         f"({nb}), got shape {m.shape}")
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise ValueError("block_scale: every block's max norm must be finite and >= 0")
    return m


def _block_scale(cfg) -> bool:
    """cfg.block_scale; a duck-typed configuration without the field has one norm a partition."""
    return bool(getattr(cfg, "block_scale", False))


def _check_max_norm(cfg: ThcConfig, geo: Geometry, max_norm):
    """The checked max norm: a float, or with block_scale an array of one per block."""
    if _block_scale(cfg):
        return _block_max_norms(cfg, geo, max_norm)
    if np.ndim(max_norm) != 0:
        raise ValueError("max_norm must be one number (block_scale is off)")
    max_norm = float(max_norm)
    if not math.isfinite(max_norm) or max_norm < 0:
        raise ValueError(f"max_norm={max_norm!r} must be finite and >= 0")
    return max_norm


def _encode_blocks(cfg: ThcConfig, geo: Geometry, y: np.ndarray, m: np.ndarray, rank: int,
                   step: int, ef: bool):
    """Encode steps 3-7 with a scale per block: block k of size B is quantised as a partition of
    its own (d_pad = B) with max norm M_k; a block with M_k = 0 gets indices 0 and keeps y."""
    g, T, dp = cfg.granularity, cfg.clip, geo.padded
    sizes = block_sizes(geo)
    sb = np.sqrt(sizes.astype(np.float64))
    live = m > 0
    safe = np.where(live, m, 1.0)
    c1 = np.repeat(np.where(live, g / (2.0 * T) * sb / safe / sb, 0.0).astype(F32), sizes)
    with np.errstate(over="ignore"):  # an Inf of a huge y is clipped to g like any large value
        t = y * c1 + F32(g / 2.0)
    t = np.minimum(np.maximum(t, F32(0)), F32(g))
    tbl, lvl, ig = _tables(cfg)
    i = np.minimum(lvl[t.astype(np.int64)], tbl.size - 2)
    p = (t - tbl[i].astype(F32)) * ig[i]
    u = uniforms(cfg.seed, rank, step, dp)
    dead = np.repeat(~live, sizes)
    q = np.where(dead, 0, i + (u < p)).astype(np.uint8)
    new_res = None
    if ef:
        with np.errstate(over="ignore", invalid="ignore"):  # Inf here is caught just below
            k1 = np.repeat((2.0 * T / g * m / sb * sb).astype(F32), sizes)
            k0 = np.repeat((-T * m / sb * sb).astype(F32), sizes)
            new_res = y - (tbl[q].astype(F32) * k1 + k0)
        new_res = np.where(dead, y, new_res)
        if not np.all(np.isfinite(new_res)):
            raise ValueError(_OVERFLOW)
    return pack(q, cfg.bits), new_res, q


def encode(cfg: ThcConfig, grad, max_norm, rank: int, step: int, residual=None):
    """One worker's encode. `residual`: the rotated error-feedback state r (d_pad floats; zeros at
    the start), or None without error feedback. `max_norm`: the agreed M, or with block_scale
    one M_k per rotation block (block_norms' order). Returns (payload uint8, new state or None,
    indices uint8)."""
    grad = np.asarray(grad)
    geo = geometry(cfg, grad.size)
    try:
        max_norm = _check_max_norm(cfg, geo, max_norm)
    except ValueError:
        _padded_input(grad, geo)  # a NaN gradient is reported as such first
        raise
    ef = residual is not None
    y = rotate(cfg, grad, residual)
    if _block_scale(cfg):
        return _encode_blocks(cfg, geo, y, max_norm, rank, step, ef)
    if max_norm == 0:
        q = np.zeros(geo.padded, dtype=np.uint8)
        return pack(q, cfg.bits), (y.copy() if ef else None), q
    g, T, dp = cfg.granularity, cfg.clip, geo.padded
    c0 = F32(g / 2.0)
    t = np.empty(dp, dtype=F32)
    for start, length, B in geo.segments():  # each run of blocks scales by its own sqrt(B)
        c1 = F32(g / (2.0 * T) * math.sqrt(dp) / max_norm / math.sqrt(B))
        with np.errstate(over="ignore"):  # an Inf of a huge y is clipped to g like any large value
            t[start:start + length] = y[start:start + length] * c1 + c0
    t = np.minimum(np.maximum(t, F32(0)), F32(g))
    tbl, lvl, ig = _tables(cfg)
    i = np.minimum(lvl[t.astype(np.int64)], tbl.size - 2)
    p = (t - tbl[i].astype(F32)) * ig[i]
    u = uniforms(cfg.seed, rank, step, dp)
    q = (i + (u < p)).astype(np.uint8)
    new_res = None
    if ef:
        new_res = np.empty(dp, dtype=F32)
        for start, length, B in geo.segments():
            with np.errstate(over="ignore", invalid="ignore"):  # Inf here is caught just below
                k1 = F32(2.0 * T / g * max_norm / math.sqrt(dp) * math.sqrt(B))
                k0 = F32(-T * max_norm / math.sqrt(dp) * math.sqrt(B))
                sl = slice(start, start + length)
                new_res[sl] = y[sl] - (tbl[q[sl]].astype(F32) * k1 + k0)
        if not np.all(np.isfinite(new_res)):
            raise ValueError(_OVERFLOW)
    return pack(q, cfg.bits), new_res, q


def initial_residual(cfg: ThcConfig, d: int) -> np.ndarray:
    """The error-feedback state before the first step: d_pad zeros."""
    return np.zeros(geometry(cfg, d).padded, dtype=F32)


def unrotate_residual(cfg: ThcConfig, residual, d: int) -> np.ndarray:
    """The textbook residual sign * Hu(r) / B (first d floats) of a rotated state r."""
    geo = geometry(cfg, d)
    w = fwht_tiled(np.asarray(residual, dtype=F32), geo)
    for start, length, block in geo.segments():
        w[start:start + length] *= F32(1.0 / block)
    return apply_signs(w, sign_bits(cfg.seed, geo.padded))[:d].copy()


def aggregate(cfg: ThcConfig, payloads, d: int, num_workers: int) -> np.ndarray:
    """S_j = sum over workers of TBL[index]: what the server computes."""
    geo = geometry(cfg, d)
    dtype = lane_dtype(cfg, num_workers)
    if len(payloads) > num_workers:
        raise ValueError(f"{len(payloads)} payloads for num_workers={num_workers}")
    tbl = np.array(cfg.table, dtype=np.uint64)
    s = np.zeros(geo.padded, dtype=np.uint64)
    for p in payloads:
        p = np.asarray(p, dtype=np.uint8)
        if p.size != geo.payload_bytes:
            raise ValueError(f"payload of {p.size} bytes; expected {geo.payload_bytes}")
        s += tbl[unpack(p, cfg.bits, geo.padded)]
    return s.astype(dtype)


# -- the way down: the published sums in exactly the bits they need -------------------------------
def sum_bits(cfg: ThcConfig, num_workers: int) -> int:
    """Bits of one published sum: ceil(log2(n*g + 1)), the width of the largest, n*g."""
    return cfg.sum_bits(num_workers)


def pack_sums(sums, bits: int) -> np.ndarray:
    """LSB-first bit stream of the sums: sum j occupies bits [j*bits, j*bits + bits); the unused
    high bits of the last byte are zero. What the server publishes."""
    s = np.asarray(sums).astype(np.uint64)
    if s.size and int(s.max()) >> bits:
        raise ValueError(f"a sum of {int(s.max())} does not fit {bits} bits")
    planes = ((s[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")


def unpack_sums(packed, bits: int, n: int) -> np.ndarray:
    """The first n sums of a pack_sums stream, as uint64."""
    stream = np.unpackbits(np.asarray(packed, dtype=np.uint8), bitorder="little")[: n * bits]
    planes = stream.reshape(n, bits).astype(np.uint64)
    return (planes << np.arange(bits, dtype=np.uint64)).sum(axis=1).astype(np.uint64)


def publish(cfg: ThcConfig, sums, d: int, num_workers: int) -> np.ndarray:
    """The server's reply: the d_pad sums packed in sum_bits(cfg, n) bits each."""
    s = np.asarray(sums)
    if s.size != geometry(cfg, d).padded:
        raise ValueError(f"{s.size} sums; expected d_pad = {geometry(cfg, d).padded}")
    return pack_sums(s, sum_bits(cfg, num_workers))


def decode_published(cfg: ThcConfig, packed, d: int, num_workers: int, max_norm: float,
                     total: bool = False) -> np.ndarray:
    """decode() of the server's packed reply (what every worker does); total=True: of the sum."""
    geo, bits = geometry(cfg, d), sum_bits(cfg, num_workers)
    packed = np.asarray(packed, dtype=np.uint8)
    if packed.size != -(-geo.padded * bits // 8):
        raise ValueError(f"reply of {packed.size} bytes; expected {-(-geo.padded * bits // 8)} "
                         f"({geo.padded} sums of {bits} bits)")
    sums = unpack_sums(packed, bits, geo.padded).astype(lane_dtype(cfg, num_workers))
    return decode(cfg, sums, d, num_workers, max_norm, total)


def decode(cfg: ThcConfig, sums, d: int, num_workers: int, max_norm: float,
           total: bool = False) -> np.ndarray:
    """Every worker's estimate of the mean input from the server's sums (what the BytePS
    worker's pull of a THC tensor yields); total=True: of the sum of the inputs (n folded into
    the scale). With block_scale, max_norm holds one M_k per rotation block."""
    geo = geometry(cfg, d)
    max_norm = _check_max_norm(cfg, geo, max_norm)
    if _block_scale(cfg):
        return _decode_blocks(cfg, geo, sums, num_workers, max_norm, total)
    if max_norm == 0:
        return np.zeros(d, dtype=F32)
    g, T, dp, n = cfg.granularity, cfg.clip, geo.padded, num_workers
    s = np.asarray(sums).astype(F32)
    z = np.empty(dp, dtype=F32)
    for start, length, B in geo.segments():  # each run of blocks scales by its own sqrt(B)
        if total:
            m1 = F32(2.0 * T / g * max_norm / math.sqrt(dp) / math.sqrt(B))
            m0 = F32(-T * n * max_norm / math.sqrt(dp) / math.sqrt(B))
        else:
            m1 = F32(2.0 * T / g / n * max_norm / math.sqrt(dp) / math.sqrt(B))
            m0 = F32(-T * max_norm / math.sqrt(dp) / math.sqrt(B))
        z[start:start + length] = s[start:start + length] * m1 + m0
    w = fwht_tiled(z, geo)
    return apply_signs(w, sign_bits(cfg.seed, dp))[:d].copy()


def _decode_blocks(cfg: ThcConfig, geo: Geometry, sums, n: int, m: np.ndarray,
                   total: bool) -> np.ndarray:
    """decode() with a scale per block: block k's scales from M_k as a partition of its own
    (d_pad = B); a block with M_k = 0 decodes to +0."""
    g, T = cfg.granularity, cfg.clip
    sizes = block_sizes(geo)
    sb = np.sqrt(sizes.astype(np.float64))
    if total:
        m1 = (2.0 * T / g * m / sb / sb).astype(F32)
        m0 = (-T * n * m / sb / sb).astype(F32)
    else:
        m1 = (2.0 * T / g / n * m / sb / sb).astype(F32)
        m0 = (-T * m / sb / sb).astype(F32)
    z = np.asarray(sums).astype(F32) * np.repeat(m1, sizes) + np.repeat(m0, sizes)
    w = apply_signs(fwht_tiled(z, geo), sign_bits(cfg.seed, geo.padded))
    w[np.repeat(m == 0, sizes)] = F32(0)
    return w[:geo.d].copy()


def simulate_round(cfg: ThcConfig, grads, rank_offset: int = 0, step: int = 0, residuals=None):
    """One full THC round for n workers: norm round, encodes, aggregate, publish, decode.

    Returns (estimate of the mean, new residuals). Used by tests and the demo.
    """
    n = len(grads)
    res = residuals if residuals is not None else [None] * n
    if _block_scale(cfg):  # the norm round's max, block by block
        m = np.max([block_norms(gr, r, cfg) for gr, r in zip(grads, res)], axis=0)
    else:
        m = max(norm(gr, r, cfg) for gr, r in zip(grads, res))
    out = [encode(cfg, gr, m, rank_offset + i, step, r)
           for i, (gr, r) in enumerate(zip(grads, res))]
    d = len(grads[0])
    reply = publish(cfg, aggregate(cfg, [o[0] for o in out], d, n), d, n)
    return decode_published(cfg, reply, d, n, m), [o[1] for o in out]
