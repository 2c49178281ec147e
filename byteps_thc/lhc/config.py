"""LhcConfig: the one configuration object of LHC (lossless homomorphic compression).

LHC sends, per partition of d values, a support bitmap and a count sketch of the values in int32
fixed point; the aggregator ORs and adds, every worker decodes the exact sum by peeling
(docs/LHC.md, ../shared/LHC_SPEC.md). The dataclass's defaults are LHC's defaults; the sizing
rule (`buckets_for`) lives here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

from .. import env
from ..common.hashes import digest64
from ..common.settings import config_from_env, config_to_env

# Peeling threshold of a 3-uniform hypergraph (spec §3): peeling succeeds w.h.p. below N/m = c_3.
PEELING_THRESHOLD = 0.8185
# The load LhcConfig sizes for at `capacity` nonzeros: 0.75, a margin of 9% below c_3, where the
# giant 2-core is exponentially unlikely even for m ~ 10^3 buckets (docs/LHC.md, "Sizing").
DESIGN_LOAD = 0.75
# Small tables fail by index pairs that share all three buckets: with N indices and s buckets per
# sub-table, P(some pair collides) ~ N^2 / (2 s^3). The floor on s keeps that below this.
PAIR_COLLISION_BOUND = 1e-3
TOPK_METHODS = ("exact", "sampled")
MAX_CAPACITY = 1 << 31  # keeps m_buckets (about 1.33 capacity) below 2^32: buckets are uint32


def buckets_for(nonzeros: int) -> int:
    """m, the sketch's buckets, for at most `nonzeros` indices in the union: 3 sub-tables of s,
    s = max(ceil(N / (3 * 0.75)), ceil(cbrt(N^2 / (2 * 1e-3)))). The first term keeps the load
    N/m <= 0.75 (c_3 = 0.8185 is the threshold); the second bounds the probability that two
    indices share all three buckets (the failure mode of small tables) by 1e-3."""
    n = int(nonzeros)
    if n < 1:
        raise ValueError(f"nonzeros={nonzeros!r} must be >= 1")
    by_load = -(-n * 4 // 9)  # ceil(n / (3 * 0.75)) in exact integers: 3 * 0.75 = 9/4
    need = n * n / (2 * PAIR_COLLISION_BOUND)
    by_pairs = max(1, math.ceil(need ** (1.0 / 3.0) - 1e-9))
    while by_pairs ** 3 < need:  # the float cube root may come out one short
        by_pairs += 1
    return 3 * max(by_load, by_pairs)


@dataclasses.dataclass(frozen=True)
class LhcConfig:
    """LHC hyper-parameters.

    capacity:       the most nonzeros the *summed* gradient of one partition may have (the union
                    of the workers' supports); sets the sketch size (`buckets_for`). A partition
                    of d < capacity elements is sized for d.
    topk:           None: the input is taken as it is (already sparse, nothing dropped). A
                    fraction in (0, 1]: each worker keeps ceil(topk * d) values of largest
                    magnitude, the rest goes to the error-feedback residual when that is on.
    topk_method:    "exact" (the k largest, ties to the lower index) or "sampled" (a threshold
                    estimated from 1024 sampled magnitudes; keeps about k values).
    seed:           shared by all workers; with the partition key it fixes the buckets and signs.
    error_feedback: keep what top-k dropped and add it to the next step's input.
    """

    capacity: int = 1 << 16
    topk: Optional[float] = None
    seed: int = 42
    error_feedback: bool = True
    topk_method: str = "exact"

    def __post_init__(self):
        c = self.capacity
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity={c!r} must be an integer in [1, 2^31] (the most nonzeros "
                             "the summed partition may have)")
        t = self.topk
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t <= 1.0:
                raise ValueError(f"topk={t!r} must be None (no sparsifier) or a fraction in "
                                 "(0, 1], e.g. 0.01 to keep 1% per worker")
            object.__setattr__(self, "topk", float(t))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) \
                or not 0 <= self.seed < (1 << 64):
            raise ValueError(f"seed={self.seed!r} must be an integer in [0, 2^64)")
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback={self.error_feedback!r} must be True or False")
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"topk_method={self.topk_method!r} must be one of {TOPK_METHODS}")

    def m_buckets(self, size: int) -> int:
        """Buckets of the sketch of a partition of `size` elements (a multiple of 3)."""
        return buckets_for(min(self.capacity, int(size)))

    def keep(self, size: int) -> Optional[int]:
        """k, the values one worker keeps of `size` (exact top-k), or None without top-k."""
        if self.topk is None:
            return None
        return max(1, min(int(size), math.ceil(self.topk * int(size) - 1e-9)))

    def to_kwargs(self) -> dict:
        """BytePS compressor kwargs (strings), for the fork's `lhc` compressor."""
        return {
            "compressor_type": "lhc",
            "lhc_capacity": str(self.capacity),
            "lhc_topk": "0" if self.topk is None else repr(self.topk),
            "lhc_topk_method": self.topk_method,
            "lhc_seed": str(self.seed),
            "lhc_error_feedback": "1" if self.error_feedback else "0",
        }

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "LhcConfig":
        """The configuration `bpslaunch --lhc-*` set (env.LHC: BYTEPS_LHC_*); LhcConfig's defaults
        for what is unset. A value that does not parse raises with the variable named."""
        return config_from_env(cls, env.LHC, environ)

    def to_env(self) -> dict:
        """The variables that choose LHC with this configuration (launcher side):
        BYTEPS_COMPRESSOR and every BYTEPS_LHC_*, in the text their parsers read back."""
        return config_to_env(self, "lhc", env.LHC)

    @classmethod
    def from_kwargs(cls, kwargs) -> "LhcConfig":
        """The inverse of to_kwargs (what the fork's server will read)."""
        if kwargs.get("compressor_type") != "lhc":
            raise ValueError(f"compressor_type={kwargs.get('compressor_type')!r} is not 'lhc'")
        topk = float(kwargs.get("lhc_topk", "0"))
        return cls(capacity=int(kwargs["lhc_capacity"]), topk=topk or None,
                   topk_method=kwargs.get("lhc_topk_method", "exact"),
                   seed=int(kwargs["lhc_seed"]),
                   error_feedback=kwargs.get("lhc_error_feedback", "1") == "1")

    def fingerprint(self) -> int:
        """64-bit digest of what workers and the aggregator must agree on: capacity and seed.
        (topk and error feedback are per worker. Each payload also carries the core's digest of
        its geometry and partition seed, byteps_thc.lhc.reference.fingerprint.)"""
        text = f"lhc;capacity={self.capacity};seed={self.seed}"
        return digest64(text)

    def describe(self) -> str:
        topk = "off" if self.topk is None else f"{self.topk:g} ({self.topk_method})"
        return (f"LHC capacity={self.capacity} (m={self.m_buckets(self.capacity)} buckets) "
                f"topk={topk} seed={self.seed} "
                f"error_feedback={'on' if self.error_feedback else 'off'}")


class LhcDecodeError(RuntimeError):
    """Peeling stopped with indices unresolved (the sketch was overloaded: the union had more
    nonzeros than the capacity allows, or the hypergraph has a 2-core). Every worker gets the
    same set from the same sums, so all of them can fall back the same way.

    unresolved: the indices (int64, ascending) whose values peeling could not determine;
    rounds:     the peeling rounds that resolved something; union: |U|; m_buckets: m;
    partial:    the decoded mean with every resolved value (exact) and 0 at the unresolved
                indices, or None. LhcCodec.fallback_values and LhcCodec.complete finish it
                exactly from a second round that sums the workers' values at `unresolved`.
    """

    def __init__(self, unresolved, rounds: int, union: int, m_buckets: int, partial=None):
        self.unresolved = unresolved
        self.partial = partial
        self.rounds = int(rounds)
        self.union = int(union)
        self.m_buckets = int(m_buckets)
        super().__init__(
            f"LHC peeling left {len(unresolved)} of {union} indices unresolved after {rounds} "
            f"rounds (load {union / m_buckets:.3f} = union / {m_buckets} buckets; peeling needs "
            f"< {PEELING_THRESHOLD}): raise capacity, or send these indices again")
