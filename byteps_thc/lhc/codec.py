"""LhcCodec and LhcAggregator: the public LHC codec API (docs/LHC.md).

    from byteps_thc import LhcConfig, LhcCodec, LhcAggregator, LhcDecodeError
    cfg = LhcConfig(capacity=N, topk=None, seed=42, error_feedback=True)
    codec = LhcCodec(cfg, size=d, rank=r)            # one partition of d elements
    m = codec.max_abs(x)                             # the max round takes the max over workers
    payload = codec.encode(x, m, num_workers=n)      # uint8; advances the step
    agg = LhcAggregator(cfg, size=d, num_workers=n); agg.add(payload); total = agg.result()
    mean = codec.decode(total, m, num_workers=n)     # float32[d]; LhcDecodeError when overloaded
    # on LhcDecodeError err: every worker sends codec.fallback_values(err.unresolved); with their
    # int32 sum, codec.complete(err, summed, m, n) is the exact mean all the same

The C++ core (byteps_thc._C, csrc/lhc) does the work when the extension is built; otherwise
byteps_thc.lhc.reference, which it equals bit for bit, does. Inputs are 1-D NumPy arrays or torch
CPU tensors (float16, bfloat16 and float64 are converted to float32). Bad input is a ValueError
that names it; an overloaded sketch is an LhcDecodeError, never a wrong value.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..common import inputs
from . import reference as R
from .config import LhcConfig, LhcDecodeError

try:
    from .. import _C
    _CORE = _C if hasattr(_C, "LhcEncoder") else None
except ImportError:  # the extension is not built: the reference does the work
    _CORE = None

__all__ = ["LhcCodec", "LhcAggregator", "LhcDecodeError", "backend"]

def backend() -> str:
    """'core' when the C++ core runs the codec, 'reference' when NumPy does."""
    return "core" if _CORE is not None else "reference"


def _cpu_only(what: str):
    raise ValueError(f"{what} is a CUDA tensor; the LHC codec runs on the CPU: pass {what}.cpu()")


def _float_vector(x: Any, size: int) -> np.ndarray:
    """x as float32[size]; LHC's fixed point needs every value finite."""
    a = inputs.float_vector(x, "x", size, _cpu_only)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"x contains NaN or Inf (first at index "
                         f"{int(np.flatnonzero(~np.isfinite(a))[0])})")
    return a


def _payload(p: Any, what: str, nbytes: int) -> np.ndarray:
    a = inputs.int_vector(p, what, ("uint8",), _cpu_only)
    if a.size != nbytes:
        raise ValueError(f"{what} has {a.size} bytes; this partition's payloads have {nbytes}")
    return a


class _Partition:
    """What a codec and an aggregator of one partition share: geometry, seed, fingerprint."""

    def __init__(self, cfg, size, key):
        self.config = inputs.check_type("cfg", cfg, LhcConfig, "an LhcConfig")
        self.size = inputs.check_int("size", size, 1, 1 << 32)
        self.key = inputs.check_int("key", key, 0, (1 << 64) - 1)
        self.m_buckets = cfg.m_buckets(self.size)
        self.geometry = R.geometry(self.size, self.m_buckets)
        self.payload_bytes = self.geometry.payload_bytes
        self.partition_seed = R.partition_seed(cfg.seed, self.key)
        self.fingerprint = R.fingerprint(self.size, self.m_buckets, self.partition_seed)


class LhcCodec(_Partition):
    """One worker's LHC codec for one partition of `size` elements.

    Holds the step (which, with `rank`, selects the stochastic-rounding stream) and, when top-k
    and error feedback are both on, the residual of what top-k dropped. `key` is the partition's
    key (BytePS's tensor key), mixed with the seed: every worker and the aggregator use the same.
    """

    def __init__(self, cfg: LhcConfig, size: int, rank: int = 0, key: int = 0):
        super().__init__(cfg, size, key)
        self.rank = inputs.check_int("rank", rank, 0, R.MAX_WORKERS)
        self._ef = cfg.error_feedback and cfg.topk is not None
        if _CORE is not None:
            self._enc = _CORE.LhcEncoder(self.size, self.m_buckets, self.partition_seed,
                                         self.rank, cfg.topk or 0.0,
                                         cfg.topk_method == "sampled", self._ef)
        else:
            self._step = 0
            self._res = np.zeros(self.size, np.float32) if self._ef else None
            self._last = (np.zeros(0, np.uint32), np.zeros(0, np.int64))  # support, q

    def __repr__(self) -> str:
        return (f"LhcCodec(size={self.size}, rank={self.rank}, key={self.key}, "
                f"m_buckets={self.m_buckets}, step={self.step}, {self.config.describe()})")

    @property
    def step(self) -> int:
        return self._enc.step if _CORE is not None else self._step

    @step.setter
    def step(self, value: int) -> None:
        value = inputs.check_int("step", value, 0, (1 << 40) - 1)
        if _CORE is not None:
            self._enc.step = value
        else:
            self._step = value

    @property
    def residual(self) -> Optional[np.ndarray]:
        """A copy of the error-feedback residual (size floats), or None when it is not kept."""
        if _CORE is not None:
            return self._enc.residual
        return None if self._res is None else self._res.copy()

    def reset_residual(self) -> None:
        if _CORE is not None:
            self._enc.reset_residual()
        elif self._res is not None:
            self._res[:] = 0

    def max_abs(self, x) -> float:
        """max |v| of what encode() will see (x plus the residual when error feedback is on)."""
        xv = _float_vector(x, self.size)
        if _CORE is not None:
            return self._enc.max_abs(xv)
        return R.max_abs(xv, self._res)

    def encode(self, x, max_abs, num_workers: int) -> np.ndarray:
        """The payload (payload_bytes uint8) on the scale of the max round's max_abs and n.
        Advances the step; on error nothing changes."""
        xv = _float_vector(x, self.size)
        m = inputs.check_scale("max_abs", max_abs)
        n = inputs.check_int("num_workers", num_workers, 1, R.MAX_WORKERS)
        if _CORE is not None:
            return self._enc.encode(xv, m, n)
        payload, res, idx, q = R.encode(self.config, xv, m, n, self.m_buckets, self.rank,
                                        self._step, self._res, self.key, with_values=True)
        self._res, self._last = res, (idx, q)
        self._step += 1
        return payload

    def decode(self, total, max_abs, num_workers: int) -> np.ndarray:
        """The exact mean of the `num_workers` workers' quantised inputs (float32[size]) from
        the aggregated payload. Raises LhcDecodeError when peeling fails. Repeatable."""
        m = inputs.check_scale("max_abs", max_abs)
        n = inputs.check_int("num_workers", num_workers, 1, R.MAX_WORKERS)
        t = _payload(total, "total", self.payload_bytes)
        if _CORE is not None:
            out, unresolved, rounds, union = _CORE.lhc_decode(
                self.size, self.m_buckets, self.partition_seed, t, m, n)
            if unresolved is not None:
                raise LhcDecodeError(unresolved.astype(np.int64), rounds, union, self.m_buckets,
                                     out)
            return out
        return R.decode(self.config, t, self.size, self.m_buckets, m, n, self.key)


    def fallback_values(self, unresolved) -> np.ndarray:
        """The exact fallback, worker side: this worker's fixed-point values q (int32) of its
        last encode at `unresolved` (LhcDecodeError.unresolved; the same on every worker), 0
        off its support. Their sum over the workers (int32 adds, which cannot overflow: the
        scale keeps every sum within int32) goes to complete()."""
        idx = np.asarray(unresolved)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.size)):
            raise ValueError(f"unresolved must be a 1-D array of indices in [0, {self.size})")
        idx = idx.astype(np.uint32)
        if _CORE is not None:
            return self._enc.values_at(idx)
        have, q = self._last
        pos = np.searchsorted(have, idx)
        hit = pos < have.size
        hit[hit] = have[pos[hit]] == idx[hit]
        out = np.zeros(idx.size, np.int32)
        out[hit] = q[pos[hit]]
        return out

    def complete(self, error: LhcDecodeError, summed, max_abs, num_workers: int) -> np.ndarray:
        """The exact fallback, decode side: the mean of decode() from the LhcDecodeError it
        raised and `summed`, the sum over the workers of fallback_values(error.unresolved)."""
        if not isinstance(error, LhcDecodeError) or error.partial is None \
                or np.asarray(error.partial).size != self.size:
            raise ValueError("error must be the LhcDecodeError of this codec's decode()")
        s = inputs.to_numpy(summed, "summed", _cpu_only)
        if s.dtype.kind not in "iu" or s.shape != (len(error.unresolved),):
            raise ValueError(f"summed must be {len(error.unresolved)} integers (one per "
                             f"unresolved index), got {s.dtype.name} {tuple(s.shape)}")
        m = inputs.check_scale("max_abs", max_abs)
        n = inputs.check_int("num_workers", num_workers, 1, R.MAX_WORKERS)
        return R.complete(error.partial, error.unresolved, s.astype(np.int32), m, n)


class LhcAggregator(_Partition):
    """The server side of one partition: ORs the bitmaps and adds the sketches (mod 2^32) of
    up to `num_workers` payloads. It copies what it is given and never modifies it."""

    def __init__(self, cfg: LhcConfig, size: int, num_workers: int, key: int = 0):
        super().__init__(cfg, size, key)
        self.num_workers = inputs.check_int("num_workers", num_workers, 1, R.MAX_WORKERS)
        if _CORE is not None:
            self._agg = _CORE.LhcAggregator(self.size, self.m_buckets, self.partition_seed,
                                            self.num_workers)
        else:
            self.reset()

    def __repr__(self) -> str:
        return (f"LhcAggregator(size={self.size}, num_workers={self.num_workers}, "
                f"m_buckets={self.m_buckets}, count={self.count})")

    @property
    def count(self) -> int:
        """Payloads summed since the last reset."""
        return self._agg.count if _CORE is not None else len(self._payloads)

    def add(self, payload) -> None:
        p = _payload(payload, "payload", self.payload_bytes)
        if _CORE is not None:
            self._agg.add(p)
            return
        R.aggregate(self._payloads + [p], self.size, self.m_buckets, self.partition_seed,
                    self.num_workers)  # raises before anything is kept
        self._payloads.append(p.copy())

    def result(self) -> np.ndarray:
        """The aggregated payload (payload_bytes uint8, a copy), the input of decode()."""
        if _CORE is not None:
            return self._agg.result()
        return R.aggregate(self._payloads, self.size, self.m_buckets, self.partition_seed,
                           self.num_workers)

    def reset(self) -> None:
        if _CORE is not None:
            self._agg.reset()
        else:
            self._payloads = []
