"""How the THC collective lays out one partition: rotation block, shards, per-partition seed.

A partition is a DDP bucket (byteps_thc.ddp) or one rank's shard of an FSDP param group
(byteps_thc.fsdp). The one rule for the rotation block is `bucket_block`. The codec pads a
partition of d values to d_pad = ceil(d / B) * B for a power-of-two block B, so the collective
picks, per partition, the largest B that keeps d_pad within `PAD_SLACK` (1.05x) of d, preferring
blocks of at least `PREFERRED_BLOCK` (2^14) and going down to `MIN_BLOCK` (2^10) only when no
larger block fits; a partition that no block >= MIN_BLOCK fits (under a few thousand values) is
one block, the whole padded partition.

The C++ core tiles a partition with blocks of two sizes itself when no block is requested
(docs/ALGORITHM.md, "Geometry"), but the CUDA kernels rotate in blocks of one size, so the hook
keeps requesting its one-size block, which both lay out alike. Once the CUDA kernels tile,
`bucket_block` returns None (the core's rule) and `padded_size` the core's geometry; the shards
below do not change, since they only need d_pad and the bit width.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import List, Optional, Sequence, Tuple

from .. import ThcConfig
from ..thc.config import TILE_ALIGN

PAD_SLACK = 1.05
PREFERRED_BLOCK = 1 << 14
MIN_BLOCK = 1 << 10
SHARD_ALIGN = 8  # coordinates: 8 indices of b bits are b whole bytes, for every b
# block_scale's largest block: each block has its own scale, so a larger one lowers no error
# and costs passes beyond the caches (docs/results/2026-12-03-block-scale.md)
SCALE_BLOCK = 1 << 16


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bucket_block(d: int, requested: Optional[int] = None, largest: Optional[int] = None) -> int:
    """The rotation block for a bucket of d values (the hook's one tiling rule).

    `requested` (a ThcConfig's rotation_block) overrides the rule, capped at next_pow2(d) as the
    codec caps it. Otherwise: the largest power of two B in [PREFERRED_BLOCK, next_pow2(d)] (and
    <= `largest`, if given) with ceil(d/B)*B <= PAD_SLACK*d; else the largest such B in
    [MIN_BLOCK, PREFERRED_BLOCK); else MIN_BLOCK, or next_pow2(d) when that is smaller (one
    block).
    """
    if not isinstance(d, int) or d < 1:
        raise ValueError(f"bucket size d={d!r} must be a positive integer")
    whole = next_pow2(d)
    if requested is not None:
        return min(requested, whole)
    b = whole if largest is None else min(whole, largest)
    while b >= MIN_BLOCK:
        if padded_size(d, b) <= PAD_SLACK * d:
            return b
        b //= 2
    return min(whole, MIN_BLOCK)


def padded_size(d: int, block: int) -> int:
    return -(-d // block) * block


def shard_bounds(padded: int, num_ranks: int) -> List[Tuple[int, int]]:
    """[start, end) coordinates of each rank's shard of a padded bucket.

    Every boundary but the last is a multiple of SHARD_ALIGN coordinates, so that shard j's
    indices are the whole bytes [start*b/8, ceil(end*b/8)) of the packed payload for any b.
    Shards are as equal as that allows; with fewer than num_ranks*8 coordinates the last ranks'
    shards are empty.
    """
    units = -(-padded // SHARD_ALIGN)
    per = -(-units // num_ranks) * SHARD_ALIGN
    return [(min(j * per, padded), min((j + 1) * per, padded)) for j in range(num_ranks)]


def byte_range(start: int, end: int, bits: int) -> Tuple[int, int]:
    """The payload bytes that hold the indices of coordinates [start, end) (start aligned, as
    shard_bounds makes it, or start == end: an empty shard, no bytes)."""
    hi = -(-end * bits // 8)
    return (start * bits // 8 if start < end else hi), hi


def bucket_seed(seed: int, key: Sequence[int]) -> int:
    """The per-bucket seed: a 64-bit digest of the shared seed and the bucket's stable key (the
    canonical indices of its parameters), so that buckets get independent rotations and rounding
    streams, the same on every rank and across a bucket rebuild."""
    text = f"{seed}:" + ",".join(str(k) for k in key)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def codec_block(cfg: ThcConfig, d: int) -> int:
    """The rotation_block a partition's codec is given: `bucket_block`; with block_scale the
    rule's blocks stop at SCALE_BLOCK (2^16), and a block is at least TILE_ALIGN (32), the least
    block a scale may have (the codec caps it at next_pow2(d), so a partition of d <= 16 is
    still one block)."""
    if not cfg.block_scale:
        return bucket_block(d, cfg.rotation_block)
    return max(bucket_block(d, cfg.rotation_block, SCALE_BLOCK), TILE_ALIGN)


def bucket_config(cfg: ThcConfig, d: int, key: Sequence[int]) -> ThcConfig:
    """The codec configuration of one bucket: cfg with its block and per-bucket seed."""
    return dataclasses.replace(cfg, rotation_block=codec_block(cfg, d),
                               seed=bucket_seed(cfg.seed, key))


def shard_config(cfg: ThcConfig) -> ThcConfig:
    """The aggregator's configuration of one shard: the sums are a table lookup and an integer
    add per coordinate, independent of the rotation, so a block of 1 makes the aggregator's
    geometry exactly the shard (no padding), and no scale (block_scale off)."""
    return dataclasses.replace(cfg, rotation_block=1, block_scale=False)


def fsdp_shard_config(cfg: ThcConfig, size: int, key: int, shard: int,
                      error_feedback: bool) -> ThcConfig:
    """The codec configuration of shard `shard` of an FSDP param group whose shards hold `size`
    values: each shard is a partition of its own (its block by `bucket_block`, its seed by the
    group's key and the shard's index), so that its owner decodes it alone."""
    return dataclasses.replace(cfg, rotation_block=codec_block(cfg, size),
                               seed=bucket_seed(cfg.seed, (key, shard)),
                               error_feedback=error_feedback)


def wire_bytes(d: int, num_ranks: int, bits: int, lane_bits: int) -> Tuple[float, float]:
    """(out, in) bytes per rank of one compressed bucket, the issue's model (norm round aside)."""
    frac = (num_ranks - 1) / num_ranks
    return frac * d * bits / 8, frac * d * lane_bits / 8


def ring_allreduce_bytes(d: int, num_ranks: int, elem_bytes: int = 4) -> float:
    return 2 * (num_ranks - 1) / num_ranks * elem_bytes * d


__all__ = ["bucket_block", "codec_block", "padded_size", "shard_bounds", "byte_range",
           "bucket_seed", "bucket_config", "shard_config", "fsdp_shard_config", "wire_bytes",
           "ring_allreduce_bytes"]
