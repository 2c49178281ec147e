"""ThcHookState: what the THC comm hook keeps between calls (see byteps_thc.ddp.hook).

Keys that survive a bucket rebuild and a new DDP wrapper. DDP gives a hook buckets, not names; the
state numbers the parameters in the order it first meets them (DDP's initial buckets, in index
order, each in its own parameter order) and keys everything by those canonical indices. A
bucket's key is the tuple of its parameters' canonical indices; it selects the bucket's seed
(geometry.bucket_seed), its step counter and its layout (codec, aggregator, buffers).

Error feedback lives in one of two forms per parameter (docs/ALGORITHM.md, "Error-feedback
state"), and every parameter is in exactly one of them:
- rotated: inside the codec of the key that last encoded it (its residual r, d_pad floats, for
  the whole bucket). While a bucket keeps its key, each round adds r after the rotation: one
  transform per step.
- per parameter: the textbook residual in the parameter's own coordinates, sign * Hu(r) / B cut
  to the bucket's pieces (`unrotate`). A key's rotated residual takes this form when another
  key meets one of its parameters (the rebuild after the first iteration) and when
  `state_dict()` is called. The next compressed round of a bucket whose parameters are in this
  form encodes x = gradient + those pieces with a zeroed codec residual, and from then on the
  bucket's residual is rotated again. The padding coordinates' share of the residual is dropped
  at that change of form (at most (d_pad - d)/d_pad of it, and d_pad <= ~1.05 d).
So any bucket layout reads and writes the same residual; a rebuild neither resets nor mixes it.
A second wrapper of the same model (same parameters, same bucket_cap_mb) meets its initial buckets
in the same order, so a state loaded from `state_dict()` numbers them as the saved one did; the
shapes are checked against the saved ones. A state belongs to one model's parameters: once an
iteration has ended, a bucket with a parameter it has not numbered raises ValueError (a state
registered on another model's wrapper would otherwise start those parameters with no error
feedback and step 0); `state_dict()` / `load_state_dict()` into a fresh state moves it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from .. import ThcCodec, ThcConfig
from ..collective import geometry, rounds
from ..collective.rounds import default_config, lane_bits_for, saved_default, unrotate

log = logging.getLogger("byteps_thc.ddp")

STATE_VERSION = 2
_STAT_KEYS = ("bytes_sent", "bytes_received", "buckets_compressed", "buckets_skipped",
              "buckets_warmup", "nonfinite_steps")
_LANE_DTYPE = {1: (np.uint8, torch.uint8), 2: (np.uint16, torch.uint16),
               4: (np.uint32, torch.uint32)}


def _check_nonneg_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")
    return value


class Layout:
    """One bucket layout (key, size): its codec (with the rotated residual), its exchange (the
    payload, the received bytes and the shard's aggregator) and the buffers every round of it
    reuses (no allocation per call)."""

    def __init__(self, state: "ThcHookState", key, d: int, offsets, device):
        n, rank = state.world_size, state.rank
        self.device = device
        self.key, self.d, self.offsets = key, d, offsets
        self.cfg = geometry.bucket_config(state.config, d, key)
        self.codec = ThcCodec(self.cfg, d, rank=rank)
        self.bounds = geometry.shard_bounds(self.codec.padded, n)
        lo, hi = self.bounds[rank]
        ranges = [geometry.byte_range(s, e, self.cfg.bits) for s, e in self.bounds]
        self.in_splits = [b - a for a, b in ranges]
        # steps 1-4 are the shared collective's: one partition, its payload cut by shards
        self.exchange = rounds.Exchange(geometry.shard_config(self.cfg), self.codec.payload_bytes,
                                        self.in_splits, hi - lo, n, rank, device)
        self.mine = self.exchange.mine
        self.lane_bytes = state.lane_bits // 8
        per = self.bounds[0][1] - self.bounds[0][0]
        self.width = per * self.lane_bytes   # every rank's gathered bytes, padded to shard 0's
        u8 = dict(dtype=torch.uint8, device=device)
        self.own = torch.zeros(self.width, **u8)  # bytes past this shard's sums stay zero
        self.gathered = torch.empty(self.width * n, **u8)
        # shard j's sums sit at [j*width, ...): all shards but the last are full, so the first
        # padded lanes of `gathered` are the whole bucket's sums in order
        np_lane, torch_lane = _LANE_DTYPE[self.lane_bytes]
        lanes = self.gathered[:self.codec.padded * self.lane_bytes]
        self.lanes = lanes.numpy().view(np_lane) if device.type == "cpu" else lanes.view(torch_lane)
        self._scratch: Dict[str, torch.Tensor] = {}

    def scratch(self, name: str) -> torch.Tensor:
        """A float32 buffer of d values kept for this layout: "x" (the input when the bucket
        cannot be encoded as it is), "out" (the result of an fp16/bf16 bucket)."""
        t = self._scratch.get(name)
        if t is None:
            t = self._scratch[name] = torch.empty(self.d, dtype=torch.float32, device=self.device)
        return t


class ThcHookState:
    """The state of `thc_hook` for one DDP model: configuration, error feedback, per-bucket
    steps and statistics.

    process_group:       the group DDP reduces over (None: the default group).
    config:              a ThcConfig shared by all ranks; None = `default_config(world_size,
                         device type of the first bucket)` (ThcConfig.for_workers(world_size),
                         8-bit lanes up to 17 ranks; with block_scale on CPU and CUDA). Its
                         rotation_block None lets the hook choose each bucket's block
                         (geometry.codec_block, padding <= ~1.05x); a number forces that block.
    min_compress_bytes:  buckets smaller than this (in their own dtype) go through a plain
                         all-reduce of the mean.
    start_iter:          iterations of plain all-reduce before compression starts (warm-up).

    Every rank must pass the same values: the hook's first call and every norm round compare a
    fingerprint of them and raise ValueError on every rank if they differ.

    `stats`: bytes_sent / bytes_received (this rank's all_to_all and all_gather payloads of the
    compressed buckets; the norm rounds' 64 bytes a bucket, 8 more a block with block_scale,
    and the plain all-reduces are not counted), buckets_compressed, buckets_skipped (under
    min_compress_bytes), buckets_warmup, and nonfinite_steps (compressed rounds whose agreed
    norm was not finite).
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
        self._config_default = config is None  # it follows the first bucket's device type
        if config is None:
            config = default_config(self.world_size)
        elif not isinstance(config, ThcConfig):
            raise ValueError(f"config must be a ThcConfig or None, got {type(config).__name__}")
        self.lane_bits = lane_bits_for(config, self.world_size)
        self.config = config
        self.min_compress_bytes = _check_nonneg_int("min_compress_bytes", min_compress_bytes)
        self.start_iter = _check_nonneg_int("start_iter", start_iter)
        self.iteration = 0
        self.stats: Dict[str, int] = {k: 0 for k in _STAT_KEYS}
        self._param_index: Dict[int, int] = {}   # id(parameter) -> canonical index
        self._param_refs: List[torch.Tensor] = []  # keeps those ids from being reused
        self._shapes: List[Tuple[Tuple[int, ...], str]] = []  # per canonical index
        self._layouts: Dict[Tuple[Tuple[int, ...], int], Layout] = {}
        self._owner: Dict[int, Tuple[Tuple[int, ...], int]] = {}  # index -> layout, rotated
        self._loose: Dict[int, torch.Tensor] = {}  # index -> textbook residual, own coordinates
        self._steps: Dict[Tuple[int, ...], int] = {}
        self._sealed = False  # an iteration ended: every parameter of the model is numbered
        self.handshake_done = False
        self.device_type: Optional[str] = None  # of the first bucket; every bucket's must match
        self.pipeline = None  # hook._Pipeline, started on the first CPU bucket
        self.trace: Optional[list] = None  # a list: (bucket key, agreed norm) of every round
        if self.rank == 0:
            log.info("THC comm hook: %d ranks, %d-bit lanes, min_compress_bytes=%d, "
                     "start_iter=%d; %s", self.world_size, self.lane_bits,
                     self.min_compress_bytes, self.start_iter, config.describe())

    # -- agreement --------------------------------------------------------------------------
    def settle(self, device_type: str) -> None:
        """The first bucket's device type: a default configuration becomes that device type's
        (rounds.default_config)."""
        self.device_type = device_type
        if self._config_default:
            self.config = default_config(self.world_size, device_type)

    def fingerprint(self) -> int:
        """64 bits of everything ranks must agree on: the codec configuration (ThcConfig's own
        fingerprint, error feedback included) and the hook's settings."""
        text = (f"{self.config.fingerprint()};ef={int(self.config.error_feedback)};"
                f"min={self.min_compress_bytes};start={self.start_iter};v={STATE_VERSION}")
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    def fingerprint_words(self) -> List[float]:
        """The fingerprint as three floats exact in binary64 (22, 21 and 21 bits)."""
        return rounds.fingerprint_words(self.fingerprint())

    # -- keys -------------------------------------------------------------------------------
    def bucket_key(self, params) -> Tuple[int, ...]:
        """The canonical indices of a bucket's parameters (numbering new ones as they come)."""
        key = []
        for p in params:
            idx = self._param_index.get(id(p))
            if idx is None:
                if self._sealed:
                    raise ValueError(
                        f"THC comm hook: a bucket holds a parameter (shape {tuple(p.shape)}, "
                        f"{str(p.dtype).replace('torch.', '')}) that this ThcHookState has not "
                        f"met in its first iteration (it numbered {len(self._param_refs)}): a "
                        "state belongs to the parameters of one model. To move the hook's error "
                        "feedback and steps to another model or a copy of it, call "
                        "state.state_dict() and load_state_dict() it into a fresh ThcHookState "
                        "registered on the new wrapper; for a new model, use a fresh state")
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

    def layout(self, key, params, d: int, device) -> Layout:
        lay = self._layouts.get((key, d))
        if lay is None:
            offsets, lo = [], 0
            for p in params:
                offsets.append((lo, lo + p.numel()))
                lo += p.numel()
            if lo != d:
                raise ValueError(f"bucket of {d} values, but its parameters hold {lo}")
            lay = Layout(self, key, d, offsets, device)
            self._layouts[(key, d)] = lay
        return lay

    def end_iteration(self) -> None:
        """The iteration's last bucket was handed over: from now on a parameter the state has
        not numbered is another model's (bucket_key refuses it)."""
        self.iteration += 1
        self._sealed = True

    def step_of(self, key) -> int:
        return self._steps.get(key, 0)

    # -- error feedback ---------------------------------------------------------------------
    def _release(self, lid) -> None:
        """A layout's rotated residual to the per-parameter form; the layout is dropped."""
        lay = self._layouts.pop(lid)
        res = lay.codec.residual
        flat = torch.from_numpy(unrotate(lay.cfg, lay.codec.block, lay.codec.padded, res, lay.d))
        for idx, (lo, hi) in zip(lay.key, lay.offsets):
            if self._owner.get(idx) == lid:
                self._loose[idx] = flat[lo:hi]
                del self._owner[idx]

    def prepare(self, lay: Layout) -> Optional[List[Optional[torch.Tensor]]]:
        """Before a compressed round of `lay`: None when its codec holds the residual of every
        parameter (the rotated form continues); else the per-parameter pieces to add to the
        gradient (None: zero), the residuals of other layouts first moved to that form and this
        codec's residual zeroed."""
        lid = (lay.key, lay.d)
        if not self.config.error_feedback or all(self._owner.get(i) == lid for i in lay.key):
            return None
        for idx in lay.key:
            other = self._owner.get(idx)
            if other is not None and other != lid:
                self._release(other)
        lay.codec.reset_residual()
        return [self._loose.get(i) for i in lay.key]

    def commit(self, lay: Layout) -> None:
        """A compressed round of `lay` succeeded: its step advances and its codec now holds
        the residual of its parameters."""
        self._steps[lay.key] = self.step_of(lay.key) + 1
        if self.config.error_feedback:
            lid = (lay.key, lay.d)
            for idx in lay.key:
                self._owner[idx] = lid
                self._loose.pop(idx, None)

    def residuals(self) -> Dict[int, torch.Tensor]:
        """Every parameter's residual in its own coordinates (moving the rotated ones to that
        form, as a change of layout does)."""
        for lid in {lid for lid in self._owner.values()}:
            self._release(lid)
        return dict(self._loose)

    # -- persistence ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain types and CPU tensors (torch.save / torch.load(weights_only=True) keep them).

        The residuals are saved per parameter, so this moves the rotated ones to that form
        (`residuals()`): this state then continues exactly as a fresh one loaded from the dict,
        on any wrapper. Call it between iterations."""
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "config": dataclasses.asdict(self.config),
            "world_size": self.world_size,
            "iteration": self.iteration,
            "params": [[list(shape), dtype] for shape, dtype in self._shapes],
            "residuals": {int(i): r.detach().cpu().clone() for i, r in self.residuals().items()},
            "steps": [[list(k), s] for k, s in self._steps.items()],
            "stats": dict(self.stats),
        }

    def load_state_dict(self, sd: dict) -> None:
        """Continue from `sd`: same configuration and settings (fingerprint), same world size.
        Load before the first iteration of the wrapper this state is registered on."""
        if not isinstance(sd, dict) or sd.get("version") != STATE_VERSION:
            raise ValueError(f"not a ThcHookState state_dict of version {STATE_VERSION}")
        if self._config_default and not self._param_refs:  # another device type's default
            self.config = saved_default(self.world_size, sd.get("config")) or self.config
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
        self._loose = {int(i): r.float().reshape(-1).clone() for i, r in sd["residuals"].items()}
        self._steps = {tuple(k): int(s) for k, s in sd["steps"]}
        self.stats = {k: int(sd["stats"].get(k, 0)) for k in _STAT_KEYS}
