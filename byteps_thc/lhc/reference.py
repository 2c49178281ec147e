"""The LHC codec in plain NumPy, written to be read: docs/LHC.md, step by step.

This is the contract. The C++ core (csrc/lhc) produces the same payloads, the same sums and the
same decoded values, bit for bit; tests/unit/test_lhc_kernels.py holds it to that. Everything
but the last step of decode is integer arithmetic; that step is one binary64 product and
quotient, rounded once to binary32. Slow on purpose: no cleverness.

Payload of one partition of d elements with m buckets (little-endian):
    header   24 bytes  magic "LHC1" u32, version u16, reserved u16 (0), scale exponent e i32,
                       count u32 (payloads summed: 1 from a worker), fingerprint u64
    bitmap   8 * ceil(d / 64) bytes, bit i (byte i // 8, bit i % 8) set where q_i != 0
    sketch   m int32, Y[b] = sum over i of sign * q_i for the three buckets b of i (mod 2^32)
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from ..common.hashes import M32, M64, hash32, splitmix64, splitmix64_v
from .config import LhcConfig, LhcDecodeError

INT32_MAX = (1 << 31) - 1
MAGIC = 0x3143484C  # "LHC1"
VERSION = 1
HEADER = struct.Struct("<IHHiIQ")
HEADER_BYTES = HEADER.size  # 24
SAMPLES = 1024  # magnitudes sampled by topk_method="sampled"
MAX_WORKERS = (1 << 24) - 1
MAX_BUCKETS = (1 << 32) - 1  # = 3 * 1431655765; bucket numbers are uint32 (lhc.h: kMaxBuckets)

_TAG_KEY = 0x4C48435F4B455921
_TAG_HASH = 0x4C48435F48415348
_TAG_ROUND = 0x4C48435F524E4421
_TAG_SAMPLE = 0x4C48435F53414D50
_TAG_FP = 0x4C48435F46505249


# -- keys and streams (splitmix64, splitmix64_v, hash32: byteps_thc.common.hashes) -------------
def partition_seed(seed: int, key: int = 0) -> int:
    """The seed of one partition: the shared seed mixed with the partition's key."""
    return splitmix64(seed ^ splitmix64((key ^ _TAG_KEY) & M64))


def hash_keys(pseed: int) -> tuple:
    """The three 32-bit keys of h_1..h_3 (and their signs)."""
    return tuple(splitmix64(pseed ^ (_TAG_HASH + j)) & M32 for j in range(3))


def round_key(pseed: int, rank: int, step: int) -> int:
    """64-bit key of one worker's stochastic-rounding stream at one step."""
    return splitmix64(splitmix64(pseed ^ _TAG_ROUND) ^ splitmix64(((rank << 40) ^ step) & M64))


def sample_key(pseed: int, rank: int, step: int) -> int:
    return splitmix64(round_key(pseed, rank, step) ^ _TAG_SAMPLE) & M32


def fingerprint(d: int, m: int, pseed: int) -> int:
    """What every payload of a partition carries: its geometry and partition seed."""
    return splitmix64(splitmix64(splitmix64(_TAG_FP ^ VERSION) ^ d) ^ m) ^ pseed


# -- geometry ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    d: int
    m: int               # buckets, 3 sub-tables of `sub`
    sub: int
    bitmap_bytes: int    # 8 * ceil(d / 64)
    payload_bytes: int   # HEADER_BYTES + bitmap_bytes + 4 m


def geometry(d: int, m: int) -> Geometry:
    if d < 1 or d > (1 << 32):
        raise ValueError(f"size={d!r} must be in [1, 2^32]")
    if m < 3 or m % 3 or m > MAX_BUCKETS:
        raise ValueError(f"m_buckets={m!r} must be a multiple of 3 in [3, {MAX_BUCKETS}]")
    bm = 8 * -(-d // 64)
    return Geometry(d, m, m // 3, bm, HEADER_BYTES + bm + 4 * m)


def buckets(pseed: int, idx: np.ndarray, sub: int):
    """(b, neg): b[i, j] = j * sub + floor(hash32(key_j ^ i) * sub / 2^32), the j-th bucket of
    index i (three distinct sub-tables, so distinct buckets); neg[i, j]: its sign is -1 where
    the hash's lowest bit is 1."""
    idx = np.asarray(idx, dtype=np.uint32)
    b = np.empty((idx.size, 3), dtype=np.uint32)
    neg = np.empty((idx.size, 3), dtype=bool)
    for j, k in enumerate(hash_keys(pseed)):
        h = hash32(np.uint32(k) ^ idx)
        b[:, j] = ((h.astype(np.uint64) * np.uint64(sub)) >> np.uint64(32)) + np.uint64(j * sub)
        neg[:, j] = (h & np.uint32(1)) == 1
    return b, neg


# -- fixed point ---------------------------------------------------------------------------------
def scale_exponent(max_abs: float, num_workers: int) -> int:
    """e, the scale 2^e: the largest with n * max_abs * 2^e < 2^31, lowered by one in the rare
    case where n * ceil(max_abs * 2^e) (the worst sum after rounding up) would pass 2^31 - 1."""
    if not math.isfinite(max_abs) or max_abs < 0:
        raise ValueError(f"max_abs={max_abs!r} must be finite and >= 0")
    if max_abs == 0:
        return 0
    e = 31 - math.frexp(num_workers * max_abs)[1]
    if num_workers * math.ceil(math.ldexp(max_abs, e)) > INT32_MAX:
        e -= 1
    return e


def _shift_right(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """x >> s for uint64 arrays, 0 where s >= 64 (NumPy, like C, leaves those undefined)."""
    big = s >= 64
    return np.where(big, np.uint64(0), x >> np.where(big, 0, s).astype(np.uint64))


def quantize(v: np.ndarray, e: int, u: np.ndarray) -> np.ndarray:
    """q = sign(v) * round(|v| * 2^e), rounded up with probability exactly frac(|v| * 2^e) by the
    top bits of the 64-bit uniform u (exact while the fraction has at most 64 bits; below that,
    |v| * 2^e < 2^-40, the bias is under 2^-40 units). Integer arithmetic on the float's bits."""
    bits = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    ex = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    mant = (bits & np.uint32(0x7FFFFF)).astype(np.uint64)
    mant = np.where(ex > 0, mant | np.uint64(1 << 23), mant)
    sh = np.where(ex > 0, ex - 150, -149) + e  # |v| * 2^e = mant * 2^sh
    up_shift = np.clip(sh, 0, 63).astype(np.uint64)
    k = np.maximum(-sh, 0)  # fraction bits
    whole = np.where(sh >= 0, mant << up_shift, _shift_right(mant, k))
    mask = (np.uint64(1) << np.minimum(k, 63).astype(np.uint64)) - np.uint64(1)
    frac = np.where(sh >= 0, np.uint64(0), np.where(k >= 64, mant, mant & mask))
    top = _shift_right(u, np.clip(64 - k, 0, 64))  # the top k bits of u (k <= 64)
    round_up = np.where(k <= 64, top < frac, u < _shift_right(frac, np.maximum(k - 64, 0)))
    mag = (whole + round_up.astype(np.uint64)).astype(np.int64)
    return np.where((bits >> np.uint32(31)) == 1, -mag, mag)


# -- sparsify ------------------------------------------------------------------------------------
def sparsify(cfg: LhcConfig, a: np.ndarray, pseed: int, rank: int, step: int) -> np.ndarray:
    """The mask of the values one worker encodes (always within a's nonzeros)."""
    nz = a != 0
    k = cfg.keep(a.size)
    if k is None:
        return nz
    mag = a.view(np.uint32) & np.uint32(0x7FFFFFFF)  # ordered like |a| for finite a
    if cfg.topk_method == "exact":
        if int(nz.sum()) <= k:
            return nz
        tau = np.partition(mag, a.size - k)[a.size - k]  # the k-th largest magnitude (> 0)
        keep = mag > tau
        ties = np.flatnonzero(mag == tau)[: k - int(keep.sum())]  # ties go to the lower index
        keep[ties] = True
        return keep
    j = np.arange(SAMPLES, dtype=np.uint32)
    pos = (hash32(np.uint32(sample_key(pseed, rank, step)) ^ j).astype(np.uint64)
           * np.uint64(a.size)) >> np.uint64(32)
    sampled = np.sort(mag[pos.astype(np.int64)])[::-1]
    r = min(SAMPLES - 1, max(0, math.ceil(cfg.topk * SAMPLES - 1e-9) - 1))
    return (mag >= sampled[r]) & nz


# -- the worker ----------------------------------------------------------------------------------
def check_input(x, d: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 1 or x.size != d:
        raise ValueError(f"x must be 1-D float32 of {d} elements, got {x.dtype} {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("x contains NaN or Inf")
    return x


def with_residual(x: np.ndarray, residual) -> np.ndarray:
    if residual is None:
        return x
    with np.errstate(over="ignore"):
        a = x + residual
    if not np.all(np.isfinite(a)):
        raise ValueError("x + the error-feedback residual overflowed float32")
    return a


def max_abs(x: np.ndarray, residual=None) -> float:
    """max |v| of what encode will see: x, plus the residual with error feedback."""
    a = with_residual(check_input(x, np.asarray(x).size), residual)
    return float(np.max(np.abs(a))) if a.size else 0.0


def pack(e: int, count: int, fp: int, bitmap: np.ndarray, sketch: np.ndarray) -> np.ndarray:
    head = np.frombuffer(HEADER.pack(MAGIC, VERSION, 0, e, count, fp), dtype=np.uint8)
    return np.concatenate([head, bitmap.view(np.uint8),
                           np.asarray(sketch, dtype=np.uint32).view(np.uint8)])


def bitmap_of(idx: np.ndarray, d: int) -> np.ndarray:
    bits = np.zeros(8 * -(-d // 64) * 8, dtype=bool)
    bits[idx] = True
    return np.packbits(bits, bitorder="little")


def sketch(pseed: int, geo: Geometry, idx: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Y = A q mod 2^32 (uint32) for the integer vector q supported on idx."""
    y = np.zeros(geo.m, dtype=np.uint32)
    b, neg = buckets(pseed, idx, geo.sub)
    qu = np.asarray(q, dtype=np.int64).astype(np.uint32)  # two's complement, mod 2^32
    for j in range(3):
        np.add.at(y, b[:, j], np.where(neg[:, j], np.uint32(0) - qu, qu))
    return y


def encode(cfg: LhcConfig, x, max_abs_all: float, num_workers: int, m: int, rank: int = 0,
           step: int = 0, residual=None, key: int = 0, with_values: bool = False):
    """One worker's payload. `residual`: the error-feedback state (d floats; zeros at the start)
    or None without it. Returns (payload uint8, new residual or None), and with `with_values`
    also the support (uint32, ascending) and its values q (int64)."""
    d = np.asarray(x).size
    geo = geometry(d, m)
    x = check_input(x, d)
    a = with_residual(x, residual)
    e = scale_exponent(max_abs_all, num_workers)
    pseed = partition_seed(cfg.seed, key)
    keep = sparsify(cfg, a, pseed, rank, step)
    idx = np.flatnonzero(keep).astype(np.uint32)
    v = a[idx]
    if v.size and float(np.max(np.abs(v))) > max_abs_all:
        raise ValueError(f"max_abs={max_abs_all!r} is below this worker's max |v| = "
                         f"{float(np.max(np.abs(v)))!r}: pass the max over workers of max_abs()")
    u = splitmix64_v(np.uint64(round_key(pseed, rank, step)) ^ idx.astype(np.uint64))
    q = quantize(v, e, u)
    nzq = q != 0
    idx, q = idx[nzq], q[nzq]
    new_res = None
    if residual is not None:
        new_res = np.where(keep, np.float32(0), a).astype(np.float32)
    payload = pack(e, 1, fingerprint(d, m, pseed), bitmap_of(idx, d), sketch(pseed, geo, idx, q))
    return (payload, new_res, idx, q) if with_values else (payload, new_res)


# -- the aggregator ------------------------------------------------------------------------------
def parse(payload, geo: Geometry, fp: int, what: str = "payload"):
    """(e, count, bitmap uint8, sketch uint32): copies, checked against the geometry."""
    p = np.asarray(payload)
    if p.dtype != np.uint8 or p.ndim != 1:
        raise ValueError(f"{what} must be a 1-D uint8 array, got {p.dtype} {p.shape}")
    if p.size != geo.payload_bytes:
        raise ValueError(f"{what} has {p.size} bytes; this partition (d={geo.d}, m={geo.m}) "
                         f"has {geo.payload_bytes}-byte payloads")
    magic, ver, _, e, count, pfp = HEADER.unpack(p[:HEADER_BYTES].tobytes())
    if magic != MAGIC or ver != VERSION:
        raise ValueError(f"{what} is not an LHC v{VERSION} payload (magic {magic:#x}, "
                         f"version {ver})")
    if pfp != fp:
        raise ValueError(f"{what} has fingerprint {pfp:#018x}, expected {fp:#018x}: it comes "
                         "from another configuration (capacity, seed, key or size)")
    bm = p[HEADER_BYTES:HEADER_BYTES + geo.bitmap_bytes].copy()
    y = p[HEADER_BYTES + geo.bitmap_bytes:].copy().view(np.uint32)
    return e, count, bm, y


def aggregate(payloads, d: int, m: int, pseed: int, num_workers: int) -> np.ndarray:
    """The server's whole job: OR the bitmaps, add the sketches mod 2^32, count the payloads."""
    geo = geometry(d, m)
    fp = fingerprint(d, m, pseed)
    bm = np.zeros(geo.bitmap_bytes, dtype=np.uint8)
    y = np.zeros(m, dtype=np.uint32)
    e0, total = 0, 0
    for i, p in enumerate(payloads):
        e, count, pb, py = parse(p, geo, fp)
        if total and e != e0:
            raise ValueError(f"payload {i} has scale 2^{e}, the ones before 2^{e0}: every "
                             "worker must encode with the same max_abs and num_workers")
        e0, total = e, total + count
        if total > num_workers:
            raise ValueError(f"{total} payloads summed for num_workers={num_workers}")
        bm |= pb
        y += py
    return pack(e0, total, fp, bm, y)


# -- decode --------------------------------------------------------------------------------------
def peel(pseed: int, geo: Geometry, idx: np.ndarray, y: np.ndarray):
    """Round-synchronous peeling of the sketch y (uint32, m) over the union idx.

    Returns (x int64 per idx, resolved bool per idx, rounds, y after peeling). Each round works
    on a snapshot: every unresolved index with a bucket of count 1 takes its value from that
    bucket (any such bucket gives the same value), then all of them leave their buckets."""
    b, neg = buckets(pseed, idx, geo.sub)
    c = np.zeros(geo.m, dtype=np.int64)
    np.add.at(c, b.ravel(), 1)
    y = y.copy()
    x = np.zeros(idx.size, dtype=np.uint32)
    alive = np.ones(idx.size, dtype=bool)
    rounds = 0
    while True:
        pure = (c[b] == 1) & alive[:, None]
        p = np.flatnonzero(pure.any(axis=1))
        if p.size == 0:
            break
        rounds += 1
        j = np.argmax(pure[p], axis=1)
        val = y[b[p, j]]
        x[p] = np.where(neg[p, j], np.uint32(0) - val, val)
        for jj in range(3):
            contrib = np.where(neg[p, jj], np.uint32(0) - x[p], x[p])
            np.subtract.at(y, b[p, jj], contrib)
            np.subtract.at(c, b[p, jj], 1)
        alive[p] = False
    return x.view(np.int32).astype(np.int64), ~alive, rounds, y


def decode(cfg: LhcConfig, total, d: int, m: int, max_abs_all: float, num_workers: int,
           key: int = 0) -> np.ndarray:
    """The exact mean of the workers' quantised inputs, float32[d]; LhcDecodeError when
    peeling leaves indices unresolved (the same set on every worker)."""
    geo = geometry(d, m)
    pseed = partition_seed(cfg.seed, key)
    e, count, bm, y = parse(total, geo, fingerprint(d, m, pseed), "sums")
    if count != num_workers:
        raise ValueError(f"the sums hold {count} payloads, but num_workers={num_workers}")
    want = scale_exponent(max_abs_all, num_workers)
    if e != want:
        raise ValueError(f"the sums are on scale 2^{e}, but max_abs={max_abs_all!r} with "
                         f"num_workers={num_workers} gives 2^{want}: decode with the max round's "
                         "max_abs")
    bits = np.unpackbits(bm, bitorder="little")
    if bits[d:].any():
        raise ValueError(f"the sums' bitmap has bits set past size={d}")
    idx = np.flatnonzero(bits[:d]).astype(np.uint32)
    x, ok, rounds, rest = peel(pseed, geo, idx, y)
    out = np.zeros(d, dtype=np.float32)
    out[idx[ok]] = (x[ok].astype(np.float64) * math.ldexp(1.0, -e) / num_workers).astype(
        np.float32)
    if not ok.all():
        raise LhcDecodeError(idx[~ok].astype(np.int64), rounds, idx.size, m, out)
    if rest.any():
        raise ValueError("the sums are inconsistent: the sketch is not zero after every index "
                         "of the bitmap was peeled (a corrupted or truncated payload)")
    return out


def complete(partial: np.ndarray, unresolved, summed, max_abs_all: float,
             num_workers: int) -> np.ndarray:
    """The exact fallback: `partial` (LhcDecodeError.partial) with the unresolved indices set
    from `summed`, the int32 sum over the workers of their values q at those indices."""
    e = scale_exponent(max_abs_all, num_workers)
    out = np.array(partial, dtype=np.float32)
    s = np.asarray(summed, dtype=np.int64)
    out[np.asarray(unresolved, dtype=np.int64)] = (
        s.astype(np.float64) * math.ldexp(1.0, -e) / num_workers).astype(np.float32)
    return out
