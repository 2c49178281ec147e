"""Compressors as the advisor prices them, and the bytes each puts on the wire.

1. BytePS cuts every gradient into partitions of BYTEPS_PARTITION_BYTES; tensors smaller than
   BYTEPS_MIN_COMPRESS_BYTES travel as float32 whatever the compressor (`partitions`).
2. Bytes per partition, up (worker -> server) and down (server -> worker) (`wire_bytes`):
   - none: 32 bits a coordinate each way; fp16: 16 each way (a cast in the framework, summed in
     fp16 by the server);
   - thc: b bits up (the partition tiled by its rotation blocks) and the integer sums down,
     packed in ceil(log2(n*g + 1)) bits each: the server adds table values, nothing else;
   - lhc: the codec's payload (header, support bitmap, count sketch sized by the capacity: the
     real size, from LhcAggregator) each way; a partition whose summed support overloads the
     sketch adds the exact fallback round, 4 bytes per unresolved index each way
     (`lhc_fallback_indices`);
   - onebit/topk/randomk/dithering (BytePS's registry compressors): the server decompresses every
     push, sums floats and recompresses the sum, so the way down is compressed by the same
     compressor: onebit 1 bit + a scale, topk/randomk k (index, value) pairs of 4+4 bytes,
     dithering its Elias-delta stream (size estimated on Gaussian data).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import env
from ..lhc import LhcConfig
from ..thc import ThcConfig
from ..thc.reference import geometry

REGISTRY_COMPRESSORS = ("onebit", "topk", "randomk", "dithering")
KNOWN = ("none", "fp16", "thc", "lhc") + REGISTRY_COMPRESSORS


@dataclasses.dataclass(frozen=True)
class CompressorSpec:
    """One compressor as the benchmark runs it and the model prices it.

    name: none | fp16 | thc | lhc | onebit | topk | randomk | dithering
    k:    topk/randomk: fraction of a partition (< 1) or a count; dithering: levels s
    ef:   error feedback (BytePS's vanilla EF for the registry compressors; THC's own for thc)
    thc:  a ThcConfig for name == "thc" (None: the defaults)
    lhc:  an LhcConfig for name == "lhc" (None: the defaults)
    label: how it is shown ("thc", "thc-n8", "topk-0.01+ef", "lhc-topk-0.01", ...)
    """
    name: str
    k: Optional[float] = None
    ef: bool = False
    thc: Optional[ThcConfig] = None
    label: str = ""
    lhc: Optional[LhcConfig] = None

    def __post_init__(self):
        if self.name not in KNOWN:
            raise ValueError(f"unknown compressor {self.name!r}; known: {', '.join(KNOWN)}")
        if self.name in ("topk", "randomk", "dithering") and (self.k is None or self.k <= 0):
            raise ValueError(f"{self.name} needs k > 0")
        if not self.label:
            object.__setattr__(self, "label", self._default_label())

    def _default_label(self) -> str:
        if self.name in ("topk", "randomk", "dithering"):
            base = f"{self.name}-{self.k:g}"
        else:
            base = self.name
        return base + ("+ef" if self.ef and self.name in REGISTRY_COMPRESSORS else "")

    def thc_config(self) -> ThcConfig:
        return self.thc if self.thc is not None else ThcConfig()

    def lhc_config(self) -> LhcConfig:
        return self.lhc if self.lhc is not None else LhcConfig()


def _parse_lhc(text: str, rest: str, workers: int) -> CompressorSpec:
    """'lhc', 'lhc-c20480' (capacity), 'lhc-topk-0.01' (top-k 1%, error feedback on: capacity
    from the workers, n * k of a full partition, so that the sum never overloads the sketch),
    'lhc-topk-0.01-c20480'."""
    tokens = [t for t in rest.split("-") if t] if rest else []
    topk = capacity = None
    try:
        while tokens:
            t = tokens.pop(0)
            if t == "topk" and tokens:
                topk = float(tokens.pop(0))
            elif t.startswith("c") and t[1:].isdigit():
                capacity = int(t[1:])
            else:
                raise ValueError(t)
    except ValueError:
        raise ValueError(f"{text!r}: LHC is written lhc, lhc-c<capacity>, lhc-topk-<fraction> "
                         "or lhc-topk-<fraction>-c<capacity> (e.g. lhc-topk-0.01)") from None
    label = "lhc" + (f"-topk-{topk:g}" if topk is not None else "") + \
        (f"-c{capacity}" if capacity is not None else "")
    if capacity is None and topk is not None:
        capacity = workers * LhcConfig(topk=topk).keep(env.PARTITION_BYTES.default // 4)
    if capacity is None:   # plain 'lhc': the advisor sizes the capacity (predict.size_lhc)
        return CompressorSpec("lhc", label=label)
    return CompressorSpec("lhc", lhc=LhcConfig(capacity=capacity, topk=topk), label=label)


def parse_spec(text: str, workers: int = 2) -> CompressorSpec:
    """'none', 'fp16', 'thc', 'thc-n' (ThcConfig.for_workers(n)), 'lhc', 'lhc-c20480',
    'lhc-topk-0.01', 'onebit', 'onebit+ef', 'topk-0.01', 'randomk-0.01+ef', 'dithering-8'."""
    t = text.strip().lower()
    ef = t.endswith("+ef")
    if ef:
        t = t[:-3]
    if t == "thc-n":
        return CompressorSpec("thc", thc=ThcConfig.for_workers(workers), label="thc-n")
    if t == "thc" or t == "thc-default":
        return CompressorSpec("thc", label="thc")
    if t == "lhc" or t.startswith("lhc-"):
        return _parse_lhc(text, t[4:], workers)
    name, _, k = t.partition("-")
    if name not in KNOWN:
        raise ValueError(f"unknown compressor {text!r}; known: {', '.join(KNOWN)}, thc-n")
    if name in ("topk", "randomk", "dithering"):
        if not k:
            raise ValueError(f"{name} needs a k: {name}-0.01 (fraction) or {name}-1000 (count)")
        return CompressorSpec(name, k=float(k), ef=ef)
    if k:
        raise ValueError(f"{name} takes no k ({text!r})")
    return CompressorSpec(name, ef=ef)


def partitions_with_density(tensors: Sequence[int], density: Optional[Sequence[float]] = None,
                            union: Optional[Sequence[float]] = None,
                            partition_bytes: int = env.PARTITION_BYTES.default,
                            min_compress_bytes: int = env.MIN_COMPRESS_BYTES.default,
                            ) -> List[Tuple[int, bool, float, Optional[float]]]:
    """partitions(), each with its tensor's nonzero fraction per worker and of the sum (1.0 and
    None where `density` is None; None: the sum's from independent supports)."""
    out = []
    for i, n in enumerate(tensors):
        rho = 1.0 if density is None else float(density[i])
        rho_u = None if union is None else float(union[i])
        out += [(e, c, rho, rho_u) for e, c in partitions([n], partition_bytes,
                                                          min_compress_bytes)]
    return out


def partitions(tensors: Sequence[int],
               partition_bytes: int = env.PARTITION_BYTES.default,
               min_compress_bytes: int = env.MIN_COMPRESS_BYTES.default,
               ) -> List[Tuple[int, bool]]:
    """(elements, compressed?) of every partition BytePS makes of float32 tensors."""
    per = max(1, partition_bytes // 4)
    out = []
    for n in tensors:
        big = n * 4 >= min_compress_bytes
        full, rest = divmod(int(n), per)
        out += [(per, big)] * full
        if rest:
            out.append((rest, big))
    return out


def _elias_delta_bits(x):
    x = np.asarray(x, dtype=np.float64)
    n = np.floor(np.log2(x))
    return n + 2 * np.floor(np.log2(n + 1)) + 1


_DITHER_CACHE: Dict[int, float] = {}


def dithering_bits_per_element(levels: int) -> float:
    """Bits per coordinate of BytePS's dithering stream (linear levels, max normalisation) on
    Gaussian data: for every non-zero level, Elias-delta(gap) + sign + Elias-delta(level)."""
    levels = int(levels)
    if levels in _DITHER_CACHE:
        return _DITHER_CACHE[levels]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 18)
    norm = np.abs(x) / np.abs(x).max() * levels
    q = np.floor(norm) + (rng.random(x.size) < (norm - np.floor(norm)))
    nz = np.flatnonzero(q)
    if nz.size == 0:
        bits = 64.0 / x.size
    else:
        gaps = np.diff(np.concatenate(([-1], nz)))
        bits = float(_elias_delta_bits(gaps).sum() + nz.size + _elias_delta_bits(q[nz]).sum())
    rate = (bits + 64) / x.size
    _DITHER_CACHE[levels] = rate
    return rate


def thc_padded(spec: CompressorSpec, elems: int) -> int:
    """Coordinates THC encodes for a partition of `elems`: its tiling by rotation blocks (the
    codec's geometry); the codec's work and bytes follow this length."""
    return geometry(spec.thc_config(), elems).padded


@functools.lru_cache(maxsize=256)
def lhc_payload_bytes(cfg: LhcConfig, elems: int) -> int:
    """Bytes of one LHC payload of a partition of `elems` (the codec's own size)."""
    from ..lhc.codec import LhcAggregator
    return LhcAggregator(cfg, int(elems), num_workers=1).payload_bytes


def lhc_nonzeros(spec: CompressorSpec, elems: int, density: float, workers: int,
                 union: Optional[float] = None) -> Tuple[float, float]:
    """(one worker's encoded nonzeros, the summed support) of a partition of `elems` whose
    gradient has nonzero fraction `density` per worker (`union`: of the sum; None: independent
    supports, 1 - (1 - density)^n). Top-k keeps at most k of each worker's nonzeros."""
    cfg = spec.lhc_config()
    rho_u = 1.0 - (1.0 - density) ** workers if union is None else union
    mine, total = density * elems, rho_u * elems
    k = cfg.keep(elems)
    if k is not None and k < mine:
        # the kept sets of the workers' top-k taken as independent k-subsets
        mine = float(k)
        total = min(total, elems * (1.0 - (1.0 - k / elems) ** workers))
    return mine, total


def lhc_fallback_indices(spec: CompressorSpec, elems: int, union: float) -> float:
    """Indices the exact fallback round carries: peeling leaves the 2-core, a fraction q^3 of the
    union with q = 1 - exp(-3 c q^2) at load c = union / m above the threshold c_3 (0 below)."""
    m = spec.lhc_config().m_buckets(elems)
    c = union / m
    if c <= 0.8185:
        return 0.0
    q = 1.0
    for _ in range(200):
        q = 1.0 - math.exp(-3.0 * c * q * q)
    return q ** 3 * union


def wire_bytes(spec: CompressorSpec, elems: int, compressed: bool, workers: int,
               dithering_rate: Optional[float] = None, density: float = 1.0,
               union: Optional[float] = None) -> Tuple[float, float]:
    """Payload bytes of one partition of `elems` float32 values: (one worker's push, its pull).
    `density`, `union`: the nonzero fraction of a worker's and of the summed gradient (LHC)."""
    if spec.name == "lhc" and compressed:
        b = float(lhc_payload_bytes(spec.lhc_config(), elems))
        _, total = lhc_nonzeros(spec, elems, density, workers, union)
        extra = lhc_fallback_indices(spec, elems, total)
        if extra:
            b += 16 + 4 * extra
        return b, b
    if spec.name == "fp16":
        return 2.0 * elems, 2.0 * elems
    if not compressed or spec.name == "none":
        return 4.0 * elems, 4.0 * elems
    if spec.name == "thc":
        cfg = spec.thc_config()
        pad = thc_padded(spec, elems)
        up = math.ceil(pad * cfg.bits / 8)
        down = math.ceil(pad * cfg.sum_bits(workers) / 8)
        return float(up), float(down)
    if spec.name == "onebit":
        b = math.ceil(elems / 32) * 4 + 4
        return float(b), float(b)
    if spec.name in ("topk", "randomk"):
        k = spec.k * elems if spec.k < 1 else spec.k
        k = max(1, min(int(k), elems // 2))
        return 8.0 * k, 8.0 * k
    if spec.name == "dithering":
        rate = dithering_rate if dithering_rate is not None else \
            dithering_bits_per_element(int(spec.k))
        b = math.ceil(elems * rate / 32) * 4 + 8
        return float(b), float(b)
    raise AssertionError(spec.name)


def codec_elems(spec: CompressorSpec, elems: int, compressed: bool) -> int:
    """The elements a compressor's per-element costs apply to (THC: the padded length)."""
    return thc_padded(spec, elems) if spec.name == "thc" and compressed else elems


def launcher_flags(spec: CompressorSpec) -> List[str]:
    """bpslaunch flags for a spec (they become BYTEPS_* environment)."""
    if spec.name in ("none", "fp16"):
        return ["--compressor", spec.name]
    if spec.name == "thc":
        cfg = spec.thc_config()
        return ["--compressor", "thc", "--thc-bits", str(cfg.bits),
                "--thc-granularity", str(cfg.granularity),
                "--thc-overflow-prob", repr(cfg.overflow_prob), "--thc-seed", str(cfg.seed)]
    if spec.name == "lhc":
        cfg = spec.lhc_config()
        flags = ["--compressor", "lhc", "--lhc-capacity", str(cfg.capacity),
                 "--lhc-seed", str(cfg.seed)]
        if cfg.topk is not None:
            flags += ["--lhc-topk", repr(cfg.topk), "--lhc-topk-method", cfg.topk_method]
        if not cfg.error_feedback:
            flags.append("--lhc-no-error-feedback")
        return flags
    flags = ["--compressor", spec.name]
    if spec.k is not None:
        flags += ["--compressor-k", f"{spec.k:g}"]
    if spec.ef:
        flags += ["--compressor-ef", "vanilla"]
    return flags
