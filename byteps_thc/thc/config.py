"""ThcConfig: the one configuration object of THC.

It validates once, reads the BYTEPS_THC_* environment in one place (`from_env`, through the
settings of byteps_thc.env, which own the variables' names and parsers), serialises once for
BytePS (`to_kwargs`, which the workers send to the server) and is passed down to every codec.
The dataclass's defaults are THC's defaults; nothing else restates them.
Every worker and the server must hold the same configuration; `fingerprint()` is what they compare.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

from .. import env
from ..common.hashes import digest64
from ..common.settings import config_from_env, config_to_env
from .tables import _check, clip_threshold, expected_error, solve_table

_LANE_MAX = {8: 0xFF, 16: 0xFFFF, 32: 0xFFFFFFFF}

# The default tiling of a partition by rotation blocks (reference.geometry; csrc/thc/config.cc
# mirrors these): blocks of B, then the remainder in one block of its own power-of-two size; B
# keeps d_pad within AUTO_PAD_NUM / AUTO_PAD_DEN of d with blocks of at least AUTO_MIN_BLOCK.
AUTO_MIN_BLOCK = 1 << 14
AUTO_PAD_NUM, AUTO_PAD_DEN = 21, 20
TILE_ALIGN = 32  # coordinates: a block below this is not tiled (sign words, whole payload bytes)
# The name of that rule on the wire: workers and the server must tile alike (to_kwargs).
TILING = "pow2-tail"
# The way down: the server publishes the sums packed in ceil(log2(n*g + 1)) bits each
# (reference.publish); the name of that format on the wire.
SUMS = "packed"


@dataclasses.dataclass(frozen=True)
class ThcConfig:
    """THC hyper-parameters (spec §1).

    bits:           b, bits per coordinate on the way up (table index), 1..8.
    granularity:    g, table values are integers in [0, g]; g >= 2^b - 1. The server's sum of n
                    workers needs n*g to fit its lane (8 bits up to 255, 16 up to 65535, 32 beyond).
    overflow_prob:  p, two-sided probability mass clipped: T = Phi^-1(1 - p/2).
    seed:           shared by all workers; drives the rotation signs (nothing is sent).
    rotation_block: Hadamard block, a power of two: blocks of B, the last one padded (B larger
                    than the partition: one block). None (the default): tiled per partition,
                    d // B blocks of the largest B >= 2^14 that keeps the padding within 5%,
                    then the rest in one block of its own power-of-two size
                    (reference.auto_block; docs/ALGORITHM.md, "Geometry").
    error_feedback: keep each worker's quantisation residual and add it to the next step.
    block_scale:    quantise each rotation block on its own scale: the norm round carries one
                    norm per block (M_k, the max over workers) instead of one per partition
                    (docs/ALGORITHM.md, "A scale per rotation block"). For the DDP hook and
                    FSDP, whose partitions flatten layers of very different scales; BytePS's
                    thc compressor keeps one norm per partition and refuses it (to_kwargs).
                    Needs blocks of at least 32 coordinates (rotation_block None or >= 32).

    Tuning: the defaults (4, 30, 1/32) are the paper's. `ThcConfig.for_workers(n)` picks the
    granularity and clipping with the least error that still fits the downstream lane for n workers.
    """

    bits: int = 4
    granularity: int = 30
    overflow_prob: float = 1.0 / 32
    seed: int = 42
    rotation_block: Optional[int] = None
    error_feedback: bool = True
    block_scale: bool = False

    def __post_init__(self):
        _check(self.bits, self.granularity)
        clip_threshold(self.overflow_prob)  # raises with the value named
        if not isinstance(self.seed, int) or not 0 <= self.seed < (1 << 64):
            raise ValueError(f"seed={self.seed!r} must be an integer in [0, 2^64)")
        rb = self.rotation_block
        if rb is not None and (not isinstance(rb, int) or rb < 1 or rb & (rb - 1)):
            raise ValueError(f"rotation_block={rb!r} must be a power of two (e.g. 1024) or None "
                             "for the default per partition")
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback={self.error_feedback!r} must be True or False")
        if not isinstance(self.block_scale, bool):
            raise ValueError(f"block_scale={self.block_scale!r} must be True or False")
        if self.block_scale and rb is not None and rb < TILE_ALIGN:
            # a block's scale applies to whole chunks of the kernels, which start on the
            # 32-coordinate grid of the sign words (and whole payload bytes)
            raise ValueError(f"block_scale=True needs rotation blocks of at least {TILE_ALIGN} "
                             f"coordinates, got rotation_block={rb}")

    # -- derived -----------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        return 1 << self.bits

    @property
    def clip(self) -> float:
        """T, the clipping threshold in units of a rotated, scaled coordinate."""
        return clip_threshold(self.overflow_prob)

    @property
    def table(self) -> tuple:
        return solve_table(self.bits, self.granularity, self.overflow_prob)

    def lane_bits(self, num_workers: int) -> int:
        """Bits of one server lane for the sums of `num_workers` workers (8, 16 or 32)."""
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a positive integer")
        need = num_workers * self.granularity
        for bits in (8, 16, 32):
            if need <= _LANE_MAX[bits]:
                return bits
        raise ValueError(f"{num_workers} workers x granularity {self.granularity} = {need} "
                         "overflows a 32-bit sum: lower the granularity")

    def sum_bits(self, num_workers: int) -> int:
        """Bits of one sum on the way down: ceil(log2(n*g + 1)), the width of n*g."""
        self.lane_bits(num_workers)  # raises for a bad n, or n*g beyond 32 bits
        return (num_workers * self.granularity).bit_length()

    def expected_error(self) -> dict:
        """Per-coordinate error (z units, one worker, no EF): rounding + clipping (spec §2)."""
        return expected_error(self.bits, self.granularity, self.overflow_prob, self.table)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def for_workers(cls, num_workers: int, downstream_bits: int = 8, bits: int = 4,
                    **kwargs) -> "ThcConfig":
        """The granularity and clipping with the least error whose sums fit `downstream_bits`.

        g is the largest that keeps n*g within the lane (capped at 64*(2^b - 1), beyond which
        the error no longer improves measurably); p is chosen on a grid of powers of sqrt(2).
        """
        if downstream_bits not in _LANE_MAX:
            raise ValueError(f"downstream_bits={downstream_bits!r} must be 8, 16 or 32")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a positive integer")
        levels = 1 << bits
        g = min(_LANE_MAX[downstream_bits] // num_workers, 64 * (levels - 1))
        if g < levels - 1:
            raise ValueError(
                f"{num_workers} workers cannot share a {downstream_bits}-bit lane at bits={bits} "
                f"(needs n*(2^bits - 1) = {num_workers * (levels - 1)} <= "
                f"{_LANE_MAX[downstream_bits]}): "
                f"use downstream_bits={downstream_bits * 2} or fewer bits")
        candidates = [2.0 ** (-k / 2.0) for k in range(6, 27)]  # 1/8 .. 1/8192
        best = min(candidates, key=lambda p: expected_error(bits, g, p)["total"])
        return cls(bits=bits, granularity=g, overflow_prob=best, **kwargs)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "ThcConfig":
        """The configuration `bpslaunch --thc-*` set (env.THC: BYTEPS_THC_*); ThcConfig's defaults
        for what is unset. A value that does not parse raises with the variable named."""
        return config_from_env(cls, env.THC, environ)

    def to_env(self) -> dict:
        """The variables that choose THC with this configuration (launcher side): BYTEPS_COMPRESSOR
        and every BYTEPS_THC_*, in the text their parsers in byteps_thc.env read back."""
        self._refuse_block_scale("bpslaunch's environment")
        return config_to_env(self, "thc", env.THC)

    def _refuse_block_scale(self, where: str) -> None:
        if self.block_scale:
            raise ValueError(f"block_scale=True (a scale per rotation block) is for the DDP "
                             f"hook (byteps_thc.ddp) and FSDP (byteps_thc.fsdp); {where} "
                             "carries BytePS's thc compressor, which keeps one norm per "
                             "partition: use block_scale=False there")

    def to_kwargs(self) -> dict:
        """BytePS compressor kwargs (strings): the worker declares them, the server reads them.

        The C++ side (csrc/byteps) parses exactly these keys; the table travels solved, so the
        server needs no solver and validates it instead. block_scale=True raises: BytePS keeps
        one norm per partition.
        """
        self._refuse_block_scale("the compressor kwargs")
        return self._wire()

    def _wire(self) -> dict:
        return {
            "compressor_type": "thc",
            "thc_bits": str(self.bits),
            "thc_granularity": str(self.granularity),
            "thc_overflow_prob": repr(self.overflow_prob),
            "thc_clip": repr(self.clip),
            "thc_seed": str(self.seed),
            "thc_rotation_block": str(self.rotation_block or 0),
            "thc_tiling": TILING,
            "thc_sums": SUMS,
            "thc_table": ",".join(str(v) for v in self.table),
            "thc_error_feedback": "1" if self.error_feedback else "0",
        }

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, str]) -> "ThcConfig":
        if kwargs.get("compressor_type") != "thc":
            raise ValueError(f"compressor_type={kwargs.get('compressor_type')!r} is not 'thc'")
        tiling = kwargs.get("thc_tiling", TILING)
        if tiling != TILING:
            raise ValueError(f"thc_tiling={tiling!r}: this build tiles partitions as {TILING!r}; "
                             "every worker and the server must run the same byteps-thc")
        sums = kwargs.get("thc_sums", SUMS)
        if sums != SUMS:
            raise ValueError(f"thc_sums={sums!r}: this build publishes the sums as {SUMS!r}; "
                             "every worker and the server must run the same byteps-thc")
        rb = int(kwargs.get("thc_rotation_block", "0"))
        return cls(bits=int(kwargs["thc_bits"]), granularity=int(kwargs["thc_granularity"]),
                   overflow_prob=float(kwargs["thc_overflow_prob"]), seed=int(kwargs["thc_seed"]),
                   rotation_block=rb or None,
                   error_feedback=kwargs.get("thc_error_feedback", "1") == "1")

    def fingerprint(self) -> int:
        """64-bit digest of everything workers and server must agree on (EF is per worker),
        block_scale included."""
        kw = self._wire()
        kw.pop("thc_error_feedback")
        if self.block_scale:  # absent when off: the default's fingerprint is the wire's
            kw["thc_block_scale"] = "1"
        text = ";".join(f"{k}={kw[k]}" for k in sorted(kw))
        return digest64(text)

    def describe(self) -> str:
        err = self.expected_error()["total"]
        return (f"THC bits={self.bits} granularity={self.granularity} "
                f"overflow_prob={self.overflow_prob:.3g} (T={self.clip:.4f}) seed={self.seed} "
                f"rotation_block={self.rotation_block or 'auto'} "
                f"error_feedback={'on' if self.error_feedback else 'off'}"
                f"{' block_scale=on' if self.block_scale else ''}; "
                f"table={list(self.table)}; expected error/coordinate={err:.4f}")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n))
