"""The steps of a THC reduce-scatter over torch.distributed that the DDP hook and FSDP share.

A round reduces k partitions (a DDP bucket: one; an FSDP param group: one per rank, its shards),
each with its own codec, over n ranks:

1. `norm_round`: every rank computes each partition's norm (residual included; with
   block_scale one per rotation block) and one `all_reduce(MAX)` of [norms of partition 1 ..
   norms of partition k, non-finite flag, fingerprint, -fingerprint] gives the agreed norms.
   A differing fingerprint raises ValueError on every rank (each gets the same maximum); a
   non-finite norm anywhere (the flag travels apart, since MAX may drop a NaN) makes
   the round non-finite on every rank.
2. `encode`: each partition's codec writes its packed b-bit indices into its byte range of one
   payload (with error feedback the codec adds its rotated residual and keeps the new one: no
   decode for it).
3. `exchange_sums`: one `all_to_all` of the payload cut into n destination byte ranges; rank j
   receives its range from every rank and sums the n of them as integers (a ThcAggregator of
   block 1: table lookups and integer adds, in lanes of 8, 16 or 32 bits).
What the sums become is the caller's: FSDP decodes its own shard, DDP gathers every shard's sums
and decodes the whole bucket.

The steps are generators that yield each collective they issued (async_op=True) and return their
result; `run_inline` drives one to the end, a caller with several rounds in flight (the DDP
hook's pipeline) advances them in an order fixed by the program, never by timing: gloo pairs
collectives by the order they were issued.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from .. import _C, ThcAggregator, ThcConfig
from ..thc.reference import sign_bits

FLT_MAX = float(np.finfo(np.float32).max)
_LANE_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


# -- configuration ------------------------------------------------------------------------------
DEVICE_TYPES = ("cpu", "cuda")


def default_config(num_ranks: int, device_type: str = "cpu") -> ThcConfig:
    """ThcConfig.for_workers(n): the least-error granularity whose n-rank sums fit 8-bit lanes;
    16-bit lanes from 18 ranks on (where 8 bits no longer hold n*(2^4 - 1)). On CPU and CUDA
    tensors alike with a scale per rotation block (block_scale, blocks up to
    geometry.SCALE_BLOCK): measured as large an error as one norm a partition or less, at less
    codec time (docs/results/2026-12-03-block-scale.md); the error is the codec's, the same on
    either device (the CUDA kernels compute the CPU core's payloads). Any other device type
    keeps one norm a partition."""
    try:
        cfg = ThcConfig.for_workers(num_ranks)
    except ValueError:
        cfg = ThcConfig.for_workers(num_ranks, downstream_bits=16)
    return dataclasses.replace(cfg, block_scale=True) if device_type in DEVICE_TYPES else cfg


def saved_default(num_ranks: int, saved: dict) -> Optional[ThcConfig]:
    """The default configuration whose fields are `saved` (a state_dict's dataclasses.asdict of
    it), or None: what a defaulted comm or state loads as its own. Besides today's default, the
    one-norm default that CUDA tensors had before the CUDA kernels took block_scale, so that a
    state saved with it still loads."""
    cfg = default_config(num_ranks)
    for cand in (cfg, dataclasses.replace(cfg, block_scale=False)):
        if dataclasses.asdict(cand) == saved:
            return cand
    return None


def lane_bits_for(config: ThcConfig, world_size: int) -> int:
    """The sum lanes of `config` at `world_size` ranks (8, 16 or 32 bits): the check every
    adapter's constructor makes. Raises ValueError, naming the ranks and the granularity, when
    n*g does not fit a 32-bit lane (at the largest granularity, 2^24 - 1, from 257 ranks on)."""
    if world_size > _C.MAX_WORKERS:
        raise ValueError(f"world size {world_size} exceeds the codec's {_C.MAX_WORKERS} workers")
    try:
        return config.lane_bits(world_size)
    except ValueError as e:
        raise ValueError(f"THC config refused for {world_size} ranks: {e}") from None


def fingerprint_words(fingerprint: int) -> List[float]:
    """A 64-bit fingerprint as three floats exact in binary64 (22, 21 and 21 bits)."""
    f = fingerprint
    return [float(f & 0x3FFFFF), float((f >> 22) & 0x1FFFFF), float(f >> 43)]


# -- error feedback -------------------------------------------------------------------------------
def unrotate(cfg: ThcConfig, block: int, padded: int, residual: np.ndarray, d: int) -> np.ndarray:
    """The textbook residual of a codec's rotated one: sign * Hu(r) / B, its first d floats
    (binary32: the transform, then the exact scaling by 1/B, then the sign flips). What a
    residual becomes when it must leave its codec (a new layout, a state_dict)."""
    w = _C.fwht(np.ascontiguousarray(residual, dtype=np.float32), block)
    w *= np.float32(1.0 / block)
    bits = w.view(np.uint32)
    bits ^= sign_bits(cfg.seed, padded).astype(np.uint32) << np.uint32(31)
    return w[:d].copy()


# -- the steps ------------------------------------------------------------------------------------
def norm_vector(norms, bad: bool, words: Sequence[float], device) -> torch.Tensor:
    """[norms (zeros where bad), flag, words, -words] in float64 (the words are exact there);
    `norms` a sequence of floats or one array (block_scale's, one per block)."""
    body = np.asarray(norms, dtype=np.float64).reshape(-1)
    if bad:
        body = np.zeros_like(body)
    w = np.asarray(words, dtype=np.float64)
    vec = np.concatenate([body, [1.0 if bad else 0.0], w, -w])
    return torch.from_numpy(vec).to(device)


def agreed(vec: torch.Tensor, k: int,
           mismatch: Callable[[list, list], str]) -> Optional[np.ndarray]:
    """The max of each of the k norms (float64), or None when any rank's was not finite; raises
    ValueError(mismatch(lowest words, highest words)) when the ranks' fingerprints differ."""
    v = vec.cpu().numpy()
    w = (v.size - k - 1) // 2
    hi, lo = v[k + 1:k + 1 + w], -v[k + 1 + w:]
    if not np.array_equal(hi, lo):
        raise ValueError(mismatch(lo.tolist(), hi.tolist()))
    return None if v[k] != 0.0 else v[:k].copy()


def too_large(m, block: int, clip: float) -> bool:
    """M this large could overflow float32 in the rotation or the scales (|y| <= sqrt(B)*M): the
    round is treated as non-finite, alike on every rank since M and B are agreed. `m`: one M,
    or block_scale's M_k (the largest decides)."""
    return float(np.max(m)) * math.sqrt(block) * (1.0 + clip) * 4.0 >= FLT_MAX


def finite(m) -> bool:
    """Whether an agreed M (or every M_k of block_scale's) is finite."""
    return bool(np.all(np.isfinite(m)))


def norm_count(codec) -> int:
    """The norms a codec's partition puts in the norm round: one per rotation block with
    block_scale, else one."""
    return codec.blocks if codec.config.block_scale else 1


def norm_round(group, parts, words: Sequence[float], device, mismatch):
    """Step 1 for `parts` [(codec, x)]: yields the all_reduce, returns the agreed norms, one per
    part (a float, or with block_scale an array of its blocks' M_k), or None (non-finite
    somewhere)."""
    counts = [norm_count(codec) for codec, _ in parts]
    norms, bad = [], False
    for codec, x in parts:
        try:
            norms.append(np.atleast_1d(codec.norm(x)))
        except ValueError:  # NaN/Inf in the input or the residual
            bad = True
            break
    flat = np.zeros(sum(counts)) if bad else np.concatenate(norms)
    vec = norm_vector(flat, bad, words, device)
    yield dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group, async_op=True)
    got = agreed(vec, flat.size, mismatch)
    if got is None:
        return None
    ends = np.cumsum(counts)
    return [got[e - c:e] if codec.config.block_scale else float(got[e - 1])
            for (codec, _), c, e in zip(parts, counts, ends)]


class Exchange:
    """The buffers of one layout's all_to_all and the aggregator of this rank's share.

    payload_bytes:  the whole payload (every partition's indices, in order);
    send_splits:    the bytes for each destination rank, in rank order (they tile the payload);
    coords:         the coordinates this rank sums (its destination range's indices);
    agg_config:     the aggregator's configuration (block 1: its geometry is `coords` exactly).
    Every rank sends this rank `send_splits[rank]` bytes (the layout is the same everywhere).
    """

    def __init__(self, agg_config, payload_bytes: int, send_splits: Sequence[int], coords: int,
                 num_ranks: int, rank: int, device):
        if sum(send_splits) != payload_bytes or len(send_splits) != num_ranks:
            raise ValueError(f"send splits {list(send_splits)} do not tile a payload of "
                             f"{payload_bytes} bytes over {num_ranks} ranks")
        self.n, self.rank, self.device = num_ranks, rank, device
        self.send_splits = list(send_splits)
        self.mine = self.send_splits[rank]
        u8 = dict(dtype=torch.uint8, device=device)
        self.payload = torch.empty(payload_bytes, **u8)
        self.recv = torch.empty(self.mine * num_ranks, **u8)
        self.agg = ThcAggregator(agg_config, coords, num_ranks) if coords else None
        self.lane_bytes = self.agg.lane_bits // 8 if self.agg is not None else 0
        parts = [self.recv[j * self.mine:(j + 1) * self.mine] for j in range(num_ranks)]
        # the codec takes NumPy views without a conversion per call
        self.recv_parts = [p.numpy() for p in parts] if device.type == "cpu" else parts
        self.cpu = device.type == "cpu"
        self._np_payload = self.payload.numpy() if self.cpu else None

    def payload_range(self, lo: int, hi: int):
        """Bytes [lo, hi) of the payload, as the codec writes them (NumPy on the CPU)."""
        return self._np_payload[lo:hi] if self.cpu else self.payload[lo:hi]

    def sums(self):
        """This rank's sums of what it received: `coords` lanes (NumPy on the CPU, else the
        device tensor), or None for an empty share."""
        if self.agg is None:
            return None
        self.agg.reset()
        for part in self.recv_parts:
            self.agg.add(part)
        return self.agg.result()


def encode(ex: Exchange, parts, norms: Sequence[float], ranges: Sequence[Tuple[int, int]]):
    """Step 2: each (codec, x) of `parts` encodes with its agreed norm into its byte range."""
    for (codec, x), m, (lo, hi) in zip(parts, norms, ranges):
        out = ex.payload_range(lo, hi)
        got = codec.encode(x, m, out=out)
        if got is not out and not ex.cpu:  # a device codec that returned its own tensor
            ex.payload[lo:hi].copy_(got)


def exchange_sums(group, ex: Exchange, during: Optional[Callable[[], None]] = None):
    """Step 3: yields the all_to_all, returns this rank's sums (Exchange.sums). `during` runs
    while the all_to_all is in flight (it may read the payload, never write it)."""
    work = dist.all_to_all_single(ex.recv, ex.payload, [ex.mine] * ex.n, ex.send_splits,
                                  group=group, async_op=True)
    if during is not None:
        during()
    yield work
    return ex.sums()


def run_inline(gen):
    """Drive a round to its end, waiting for each collective it yields; returns its result."""
    try:
        work = next(gen)
        while True:
            work.wait()
            work = gen.send(None)
    except StopIteration as stop:
        return stop.value


class RoundWork(dist.Work):
    """The Work of a round issued with async_op=True: the round has issued its first collective;
    wait() runs the rest in the waiting thread (so the collectives keep the program's order)."""

    def __init__(self, gen, first):
        super().__init__()
        self._gen, self._work, self._done, self._error = gen, first, False, None

    def wait(self, timeout=None) -> bool:
        if not self._done:
            self._done = True
            try:
                while True:
                    if self._work is not None:
                        self._work.wait()
                    self._work = self._gen.send(None)
            except StopIteration:
                pass
            except Exception as e:  # re-raised at every wait, as a failed Work does
                self._error = e
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None


def start(gen) -> RoundWork:
    """The round run to its first collective: its RoundWork (wait() runs the rest)."""
    try:
        first = next(gen)
    except StopIteration:
        first = None
    return RoundWork(gen, first)


def _nothing():
    return
    yield  # a generator


def done() -> RoundWork:
    """A Work that is already complete (a round with nothing to exchange)."""
    return start(_nothing())


__all__: List[str] = ["DEVICE_TYPES", "default_config", "saved_default", "lane_bits_for",
                      "fingerprint_words", "unrotate",
                      "norm_vector", "agreed", "too_large", "finite", "norm_count", "norm_round",
                      "Exchange", "encode", "exchange_sums", "run_inline", "RoundWork", "start",
                      "done"]
