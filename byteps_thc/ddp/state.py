"""ThcHookState: what the THC comm hook keeps between calls (see byteps_thc.ddp.hook).

Keys that survive a bucket rebuild and a new DDP wrapper. DDP gives a hook buckets, not names; the
state numbers the parameters in the order it first meets them (DDP's initial buckets, in index
order, each in its own parameter order) and keys everything by those canonical indices:
- the error-feedback residual is kept per parameter, in the parameter's own coordinates (the
  textbook form of docs/ALGORITHM.md, "Error-feedback state"), so any bucket layout reads and
  writes the same values: the rebuild after the first iteration neither resets nor mixes them;
- a bucket's key is the tuple of its parameters' canonical indices; it selects the bucket's seed
  (geometry.bucket_seed) and its step counter.
A second wrapper of the same model (same parameters, same bucket_cap_mb) meets its initial buckets
in the same order, so a state loaded from `state_dict()` numbers them as the saved one did; the
shapes are checked against the saved ones.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _C
from ..codec import ThcAggregator, ThcCodec
from ..config import ThcConfig
from . import geometry

log = logging.getLogger("byteps_thc.ddp")

STATE_VERSION = 1
_STAT_KEYS = ("bytes_sent", "bytes_received", "buckets_compressed", "buckets_skipped",
              "buckets_warmup", "nonfinite_steps")


def default_config(num_ranks: int) -> ThcConfig:
    """ThcConfig.for_workers(n): the least-error granularity whose n-rank sums fit 8-bit lanes;
    16-bit lanes from 18 ranks on (where 8 bits no longer hold n*(2^4 - 1))."""
    try:
        return ThcConfig.for_workers(num_ranks)
    except ValueError:
        return ThcConfig.for_workers(num_ranks, downstream_bits=16)


def _check_nonneg_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")
    return value


class ThcHookState:
    """The state of `thc_hook` for one DDP model: configuration, per-parameter error feedback,
    per-bucket steps and statistics.

    process_group:       the group DDP reduces over (None: the default group).
    config:              a ThcConfig shared by all ranks; None = `default_config(world_size)`
                         (ThcConfig.for_workers(world_size), 8-bit lanes up to 17 ranks). Its
                         rotation_block None lets the hook choose each bucket's block
                         (geometry.bucket_block, padding <= ~1.05x); a number forces that block.
    min_compress_bytes:  buckets smaller than this (in their own dtype) go through a plain
                         all-reduce of the mean.
    start_iter:          iterations of plain all-reduce before compression starts (warm-up).

    Every rank must pass the same values: the hook's first call and every norm round compare a
    fingerprint of them and raise ValueError on every rank if they differ.

    `stats`: bytes_sent / bytes_received (this rank's all_to_all and all_gather payloads of the
    compressed buckets; the norm rounds' 64 bytes and the plain all-reduces are not counted),
    buckets_compressed, buckets_skipped (under min_compress_bytes), buckets_warmup, and
    nonfinite_steps (compressed rounds whose agreed norm was not finite).
    `state_dict()` / `load_state_dict()`: see there; `trace`, when set to a list, receives
    (bucket key, agreed norm) of every compressed round (tests, debugging).
    """

    def __init__(self, process_group=None, config: Optional[ThcConfig] = None,
                 min_compress_bytes: int = 65536, start_iter: int = 0):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("ThcHookState needs torch.distributed initialised "
                             "(dist.init_process_group) before it is created")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        if config is None:
            config = default_config(self.world_size)
        elif not isinstance(config, ThcConfig):
            raise ValueError(f"config must be a ThcConfig or None, got {type(config).__name__}")
        if self.world_size > _C.MAX_WORKERS:
            raise ValueError(f"world size {self.world_size} exceeds the codec's "
                             f"{_C.MAX_WORKERS} workers")
        try:
            self.lane_bits = config.lane_bits(self.world_size)
        except ValueError as e:
            raise ValueError(f"THC config refused for {self.world_size} ranks: {e}") from None
        self.config = config
        self.min_compress_bytes = _check_nonneg_int("min_compress_bytes", min_compress_bytes)
        self.start_iter = _check_nonneg_int("start_iter", start_iter)
        self.iteration = 0
        self.stats: Dict[str, int] = {k: 0 for k in _STAT_KEYS}
        self._param_index: Dict[int, int] = {}   # id(parameter) -> canonical index
        self._param_refs: List[torch.Tensor] = []  # keeps those ids from being reused
        self._shapes: List[Tuple[Tuple[int, ...], str]] = []  # per canonical index
        self._residuals: Dict[int, torch.Tensor] = {}
        self._flat: Dict[Tuple[int, ...], torch.Tensor] = {}   # bucket key -> its residual
        self._owner: Dict[int, Tuple[int, ...]] = {}           # index -> key whose flat holds it
        self._steps: Dict[Tuple[int, ...], int] = {}
        self._codecs: Dict[tuple, tuple] = {}
        self.handshake_done = False
        self.trace: Optional[list] = None  # a list: (bucket key, agreed norm) of every round
        if self.rank == 0:
            log.info("THC comm hook: %d ranks, %d-bit lanes, min_compress_bytes=%d, "
                     "start_iter=%d; %s", self.world_size, self.lane_bits,
                     self.min_compress_bytes, self.start_iter, config.describe())

    # -- agreement --------------------------------------------------------------------------
    def fingerprint(self) -> int:
        """64 bits of everything ranks must agree on: the codec configuration (ThcConfig's own
        fingerprint, error feedback included) and the hook's settings."""
        text = (f"{self.config.fingerprint()};ef={int(self.config.error_feedback)};"
                f"min={self.min_compress_bytes};start={self.start_iter};v={STATE_VERSION}")
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    def fingerprint_words(self) -> List[float]:
        """The fingerprint as three floats exact in binary64 (22, 21 and 21 bits)."""
        f = self.fingerprint()
        return [float(f & 0x3FFFFF), float((f >> 22) & 0x1FFFFF), float(f >> 43)]

    # -- keys -------------------------------------------------------------------------------
    def bucket_key(self, params) -> Tuple[int, ...]:
        """The canonical indices of a bucket's parameters (numbering new ones as they come)."""
        key = []
        for p in params:
            idx = self._param_index.get(id(p))
            if idx is None:
                idx = len(self._param_refs)
                sig = (tuple(p.shape), str(p.dtype).replace("torch.", ""))
                if idx < len(self._shapes):  # loaded from a state_dict: must be the same model
                    if self._shapes[idx] != sig:
                        raise ValueError(
                            f"parameter #{idx} has shape/dtype {sig}, but the loaded state_dict "
                            f"holds {self._shapes[idx]} there: load it into a wrapper of the "
                            "same model with the same bucket_cap_mb")
                else:
                    self._shapes.append(sig)
                self._param_index[id(p)] = idx
                self._param_refs.append(p)
            key.append(idx)
        return tuple(key)

    def codecs(self, key, d: int):
        """(config, codec, own aggregator, shard aggregator, shard bounds) of one bucket."""
        entry = self._codecs.get((key, d))
        if entry is None:
            # the codec without its own EF: the hook keeps the residual per parameter
            cfg = dataclasses.replace(geometry.bucket_config(self.config, d, key),
                                      error_feedback=False)
            codec = ThcCodec(cfg, d, rank=self.rank)
            own = ThcAggregator(cfg, d, 1) if self.config.error_feedback else None
            bounds = geometry.shard_bounds(codec.padded, self.world_size)
            lo, hi = bounds[self.rank]
            shard = (ThcAggregator(geometry.shard_config(cfg), hi - lo, self.world_size)
                     if hi > lo else None)
            entry = (cfg, codec, own, shard, bounds)
            self._codecs[(key, d)] = entry
        return entry

    def step_of(self, key) -> int:
        return self._steps.get(key, 0)

    def bucket_residual(self, key, offsets, device) -> torch.Tensor:
        """The residual of a bucket's parameters, flat in the bucket's order (zeros where none):
        the bucket's own last residual when it wrote every piece of it, else the pieces joined."""
        flat = self._flat.get(key)
        if flat is not None and all(self._owner.get(i) == key for i in key):
            return flat.to(device)
        pieces = []
        for idx, (lo, hi) in zip(key, offsets):
            r = self._residuals.get(idx)
            pieces.append(torch.zeros(hi - lo, dtype=torch.float32, device=device) if r is None
                          else r.to(device))
        return torch.cat(pieces)

    def commit(self, key, offsets, new_residual: Optional[torch.Tensor]):
        """A compressed round of `key` succeeded: advance its step, store the residuals (views
        of the bucket's flat residual, which the next round of the same layout reuses)."""
        self._steps[key] = self.step_of(key) + 1
        if new_residual is None:
            return
        previous = {self._owner.get(i) for i in key} - {None, key}
        self._flat[key] = new_residual
        for idx, (lo, hi) in zip(key, offsets):
            self._residuals[idx] = new_residual[lo:hi]
            self._owner[idx] = key
        for old in previous:  # a layout that no longer owns any residual frees its buffer
            if old not in self._owner.values():
                self._flat.pop(old, None)

    # -- persistence ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain types and CPU tensors (torch.save / torch.load(weights_only=True) keep them)."""
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "config": dataclasses.asdict(self.config),
            "world_size": self.world_size,
            "iteration": self.iteration,
            "params": [[list(shape), dtype] for shape, dtype in self._shapes],
            "residuals": {int(i): r.detach().cpu().clone() for i, r in self._residuals.items()},
            "steps": [[list(k), s] for k, s in self._steps.items()],
            "stats": dict(self.stats),
        }

    def load_state_dict(self, sd: dict) -> None:
        """Continue from `sd`: same configuration and settings (fingerprint), same world size.
        Load before the first iteration of the wrapper this state is registered on."""
        if not isinstance(sd, dict) or sd.get("version") != STATE_VERSION:
            raise ValueError(f"not a ThcHookState state_dict of version {STATE_VERSION}")
        if sd["fingerprint"] != self.fingerprint():
            raise ValueError(f"the state_dict was saved with config {sd['config']} (and its hook "
                             f"settings), this state has {dataclasses.asdict(self.config)}, "
                             f"min_compress_bytes={self.min_compress_bytes}, "
                             f"start_iter={self.start_iter}: construct it with the same ones")
        if sd["world_size"] != self.world_size:
            raise ValueError(f"the state_dict was saved by {sd['world_size']} ranks, this group "
                             f"has {self.world_size}")
        if self._param_refs:
            raise ValueError("load_state_dict into a fresh ThcHookState, before it sees a bucket")
        self.iteration = int(sd["iteration"])
        self._shapes = [(tuple(shape), dtype) for shape, dtype in sd["params"]]
        self._residuals = {int(i): r.float().clone() for i, r in sd["residuals"].items()}
        self._steps = {tuple(k): int(s) for k, s in sd["steps"]}
        self.stats = {k: int(sd["stats"].get(k, 0)) for k in _STAT_KEYS}
