"""ThcReduceScatter: THC as FSDP2's reduce-scatter, through stock torch's
`fully_shard(module).set_custom_reduce_scatter(comm)`.

FSDP hands the comm a param group's flat padded gradient (`input_tensor`, n*S values, shard j at
[j*S, (j+1)*S)) and this rank's shard (`output_tensor`, S values). On n ranks, one call:

1. Each shard j is a THC partition of its own (geometry.fsdp_shard_config: its rotation block by
   the padding rule, its seed by the group's key and j). Every rank computes the norm of each of
   its n shards (x_j = gradient shard + its error-feedback residual), and one all_reduce(MAX) of
   [n norms, non-finite flag, fingerprint, -fingerprint] gives every shard's agreed M_j (with
   `config.block_scale`, one norm per rotation block of each shard, and each block is quantised
   on its own M_jk). A differing fingerprint (configuration, error feedback, key, shard size)
   raises on every rank (the first call compares it alone first, since the norm round's length
   follows the settings); a non-finite norm anywhere fills output_tensor with NaN on every rank
   and keeps the state.
2. Each rank encodes shard j with M_j into the j-th range of one payload (b bits a coordinate).
3. One all_to_all: rank j receives every rank's encoding of shard j.
4. Rank j adds those n payloads as integers (a ThcAggregator, 8/16/32-bit lanes by n*g).
5. Rank j decodes its shard from the sums and M_j into output_tensor: the THC estimate of the
   mean (op AVG), or n times it in float32 (op SUM; FSDP asks for SUM for fp16 gradients, which
   it pre-divides). Nothing is gathered back.

A rank sends and receives (n-1)/n * n*S * b/8 bytes (plus 8*(n+7) bytes of norms), against
(n-1)/n * n*S * 4 of an fp32 reduce-scatter: 1/8 of it at b = 4.

Error feedback (`error_feedback`): each rank keeps the residual of what it sent, all n shards,
so it costs a full-size buffer per rank (FSDP keeps only 1/n of the gradient):
- "fp32" (the default): the codec's rotated residual, d_pad floats per shard, 4 bytes a
  coordinate; no extra pass (the codec adds it after its rotation and keeps the new one).
- "bf16": the residual in its own coordinates in bfloat16, 2 bytes a coordinate; each step
  decodes this rank's own encoding of every shard to form it (one extra decode of n*S values).
- "off": nothing kept; THC's rounding is unbiased, so the estimate is still unbiased.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from .. import ThcAggregator, ThcCodec, ThcConfig
from ..collective import geometry, rounds

STATE_VERSION = 1
EF_MODES = ("fp32", "bf16", "off")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_STAT_KEYS = ("calls", "calls_nonfinite", "bytes_sent", "bytes_received")


class _Layout:
    """The codecs, the exchange and the buffers of one param group (shard size S, device): built
    on the first call and reused by every later one (no allocation per call but the sums')."""

    def __init__(self, rs: "ThcReduceScatter", size: int, device):
        n, rank = rs.world_size, rs.rank
        self.size, self.device = size, device
        fp32_ef = rs.error_feedback == "fp32"
        self.cfgs = [geometry.fsdp_shard_config(rs.config, size, rs.key, j, fp32_ef)
                     for j in range(n)]
        self.codecs = [ThcCodec(c, size, rank=rank, threads=rs.threads) for c in self.cfgs]
        self.block, self.padded = self.codecs[0].block, self.codecs[0].padded
        per = self.codecs[0].payload_bytes
        self.ranges = [(j * per, (j + 1) * per) for j in range(n)]
        self.exchange = rounds.Exchange(geometry.shard_config(self.cfgs[rank]), n * per,
                                        [per] * n, self.padded, n, rank, device)
        self.payload_bytes = per
        f32 = dict(dtype=torch.float32, device=device)
        self.x = torch.empty(n * size, **f32)    # the input in float32, residual added
        self.out = torch.empty(size, **f32)      # the decoded shard, before its cast
        self.own = (ThcAggregator(geometry.shard_config(self.cfgs[0]), self.padded, 1)
                    if rs.error_feedback == "bf16" else None)  # this rank's own estimate


class ThcReduceScatter(ReduceScatter):
    """THC as FSDP2's reduce-scatter for one param group (module docstring: the steps).

        from torch.distributed.fsdp import fully_shard
        from byteps_thc.fsdp import ThcReduceScatter
        for i, block in enumerate(model.blocks):
            fully_shard(block).set_custom_reduce_scatter(ThcReduceScatter(key=i))
        fully_shard(model).set_custom_reduce_scatter(ThcReduceScatter(key=len(model.blocks)))

    config:          a ThcConfig shared by all ranks; None = rounds.default_config(n, the
                     first call's device type): ThcConfig.for_workers(n) (the least-error
                     granularity for 8-bit lanes), with block_scale (CPU and CUDA). Its
                     rotation_block None lets each shard take the largest block that pads it
                     by <= ~5% (with block_scale, at most 2^16).
    error_feedback:  "fp32", "bf16" or "off" (module docstring: memory and cost); None takes
                     "fp32" when config.error_feedback, else "off".
    key:             this param group's number: it selects the shards' seeds (independent
                     rotations per group); give each fully_shard module its own.
    group:           the process group FSDP reduces over (None: the default group); every call
                     must come on a group of its size and this rank's place in it.
    threads:         codec threads per shard (the bits are one thread's).

    One instance serves one param group: a call with another shard size or dtype raises. Every
    rank must construct it alike; the first call's norm round compares a fingerprint.
    `stats`: calls, calls_nonfinite, bytes_sent / bytes_received (the all_to_all's payload bytes
    to and from other ranks; the norm round's are not counted).
    """

    def __init__(self, config: Optional[ThcConfig] = None, *, error_feedback: Optional[str] = None,
                 key: int = 0, group=None, threads: int = 1):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("ThcReduceScatter needs torch.distributed initialised "
                             "(dist.init_process_group) before it is created")
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._config_default = config is None  # it follows the first call's device type
        if config is None:
            config = rounds.default_config(self.world_size)
        elif not isinstance(config, ThcConfig):
            raise ValueError(f"config must be a ThcConfig or None, got {type(config).__name__}")
        if error_feedback is None:
            error_feedback = "fp32" if config.error_feedback else "off"
        if error_feedback not in EF_MODES:
            raise ValueError(f"error_feedback={error_feedback!r} must be one of {EF_MODES} "
                             "(or None: fp32 when config.error_feedback)")
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise ValueError(f"key={key!r} must be an integer >= 0")
        self.lane_bits = rounds.lane_bits_for(config, self.world_size)
        self.config, self.error_feedback, self.key = config, error_feedback, key
        self.threads = threads
        self.step = 0
        self.stats: Dict[str, int] = {k: 0 for k in _STAT_KEYS}
        self._size: Optional[int] = None
        self._dtype: Optional[torch.dtype] = None
        self._layout: Optional[_Layout] = None
        # the residual in the shards' own coordinates (n*S): "bf16" keeps it so; "fp32" holds
        # it here only between a state_dict (or a load) and the next round, its codecs zeroed
        self._residual: Optional[torch.Tensor] = None
        self.trace: Optional[list] = None  # a list: the agreed norms of every round (tests)
        self._agreed = False  # the first call's fingerprint check done

    # -- agreement --------------------------------------------------------------------------
    def fingerprint(self) -> int:
        """64 bits of what ranks must agree on: the codec configuration, the error feedback,
        the key, the shard size (once known) and the world size."""
        text = (f"{self.config.fingerprint()};ef={self.error_feedback};key={self.key};"
                f"size={self._size};n={self.world_size};fsdp-v={STATE_VERSION}")
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    def _mismatch(self, lo, hi) -> str:
        return ("ThcReduceScatter: the ranks' configurations differ (fingerprint words range "
                f"from {lo} to {hi}; this rank has config {self.config}, "
                f"error_feedback={self.error_feedback!r}, key={self.key}, shard size "
                f"{self._size}): construct ThcReduceScatter alike on every rank, one per "
                "fully_shard module")

    # -- the comm ---------------------------------------------------------------------------
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A fresh tensor, as FSDP's default: the output becomes the sharded gradient (views
        of it live on), so it cannot be a workspace; the codec's workspaces are kept instead."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group,
                 op=dist.ReduceOp.AVG, async_op: bool = False):
        total = self._check(output_tensor, input_tensor, group, op)
        if self.world_size == 1:
            output_tensor.copy_(input_tensor)
            return rounds.done() if async_op else None
        lay = self._layout_for(output_tensor)
        work = rounds.start(self._round(lay, output_tensor, input_tensor, group, total))
        if async_op:
            return work
        work.wait()
        return None

    def _check(self, out, inp, group, op) -> bool:
        if op == dist.ReduceOp.AVG:
            total = False
        elif op == dist.ReduceOp.SUM:
            total = True
        else:
            raise ValueError(f"ThcReduceScatter: op {op} is not supported; THC reduces by "
                             "ReduceOp.AVG or ReduceOp.SUM (for a gradient_divide_factor, "
                             "divide the gradient before or after the reduction instead)")
        size = dist.get_world_size(group)
        if size != self.world_size or dist.get_rank(group) != self.rank:
            raise ValueError(f"ThcReduceScatter was built for rank {self.rank} of "
                             f"{self.world_size}, but called on a group where this rank is "
                             f"{dist.get_rank(group)} of {size}: pass that group as `group=`")
        for name, t in (("output_tensor", out), ("input_tensor", inp)):
            if t.dtype not in _DTYPES:
                raise ValueError(f"ThcReduceScatter: {name} has dtype {t.dtype}; THC reduces "
                                 "float32, bfloat16 or float16 gradients")
            if not t.is_contiguous():
                raise ValueError(f"ThcReduceScatter: {name} must be contiguous")
        if out.dtype != inp.dtype or out.device != inp.device:
            raise ValueError(f"ThcReduceScatter: output_tensor ({out.dtype}, {out.device}) and "
                             f"input_tensor ({inp.dtype}, {inp.device}) must match")
        if inp.numel() != self.world_size * out.numel() or out.numel() == 0:
            raise ValueError(f"ThcReduceScatter: input_tensor has {inp.numel()} values, "
                             f"output_tensor {out.numel()}: the input must hold "
                             f"{self.world_size} shards of the output's size (>= 1)")
        if self._layout is not None and (out.numel() != self._size or out.dtype != self._dtype):
            raise ValueError(
                f"ThcReduceScatter serves one param group (shards of {self._size} "
                f"{self._dtype}), but was called with shards of {out.numel()} {out.dtype}: give "
                "each fully_shard module its own ThcReduceScatter (and key)")
        return total

    def _layout_for(self, out: torch.Tensor) -> _Layout:
        if self._layout is None:
            if self._size is not None and out.numel() != self._size:  # loaded
                raise ValueError(
                    f"the loaded state_dict is of a param group with shards of {self._size} "
                    f"values, this one's hold {out.numel()}: load it into the ThcReduceScatter "
                    "of the same param group")
            self._size, self._dtype = out.numel(), out.dtype
            if self._config_default:
                self.config = rounds.default_config(self.world_size, out.device.type)
            self._layout = _Layout(self, self._size, out.device)
        elif out.device != self._layout.device:
            raise ValueError(f"ThcReduceScatter: a call on {out.device}, but its state lives on "
                             f"{self._layout.device}")
        return self._layout

    def _inputs(self, lay: _Layout, inp: torch.Tensor):
        """The n shards to encode: views of the input where it is float32 and nothing is to be
        added, else of lay.x = input + the residual in own coordinates."""
        flat = inp.detach().reshape(-1)
        if flat.dtype == torch.float32 and self._residual is None:
            x = flat
        else:
            x = lay.x
            x.copy_(flat)
            if self._residual is not None:
                x.add_(self._residual.to(x.device))
        s = lay.size
        return [x[j * s:(j + 1) * s] for j in range(self.world_size)]

    def _round(self, lay: _Layout, out, inp, group, total: bool):
        n, rank = self.world_size, self.rank
        xs = self._inputs(lay, inp)
        for c in lay.codecs:  # the step before the norm: setting it drops the cached rotation
            c.step = self.step
        parts = list(zip(lay.codecs, xs))
        words = rounds.fingerprint_words(self.fingerprint())
        if not self._agreed:  # the norm round's length follows the settings: compare them first
            vec = rounds.norm_vector([0.0], False, words, out.device)
            yield dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group, async_op=True)
            rounds.agreed(vec, 1, self._mismatch)
            self._agreed = True
        ms = yield from rounds.norm_round(group, parts, words, out.device, self._mismatch)  # 1
        if self.trace is not None:
            self.trace.append(None if ms is None else list(ms))
        clip = self.config.clip
        if ms is None or any(not rounds.finite(m) or rounds.too_large(m, lay.block, clip)
                             for m in ms):
            self.stats["calls_nonfinite"] += 1
            out.fill_(math.nan)
            return
        rounds.encode(lay.exchange, parts, ms, lay.ranges)                             # 2
        during = None
        if self.error_feedback == "bf16":
            during = lambda: self._own_residual(lay, xs, ms)  # noqa: E731  (reads the payload)
        sums = yield from rounds.exchange_sums(group, lay.exchange, during)           # 3, 4
        self.step += 1
        if self.error_feedback == "fp32":
            self._residual = None  # the codecs hold it again, rotated
        codec, m = lay.codecs[rank], ms[rank]                                          # 5
        direct = out.dtype == torch.float32 and out.device.type == "cpu"
        dest = out if direct else lay.out
        if out.device.type == "cpu":
            codec.decode(sums, m, n, out=dest.reshape(-1).numpy())
        else:
            dest.copy_(codec.decode(sums, m, n).reshape(-1))
        if total:
            dest.mul_(float(n))
        if not direct:
            out.copy_(dest.view(out.shape))
        self.stats["calls"] += 1
        self.stats["bytes_sent"] += (n - 1) * lay.payload_bytes
        self.stats["bytes_received"] += (n - 1) * lay.payload_bytes

    def _own_residual(self, lay: _Layout, xs, ms) -> None:
        """bf16 error feedback: residual_j = x_j - (this rank's own estimate of x_j)."""
        if self._residual is None:
            self._residual = torch.zeros(self.world_size * lay.size, dtype=torch.bfloat16,
                                         device=lay.device)
        s, ex = lay.size, lay.exchange
        for j, (codec, x, m) in enumerate(zip(lay.codecs, xs, ms)):
            lo, hi = lay.ranges[j]
            lay.own.reset()
            lay.own.add(ex.payload_range(lo, hi))
            est = codec.decode(lay.own.result(), m, 1,
                               out=lay.out.numpy() if lay.device.type == "cpu" else None)
            est = lay.out if lay.device.type == "cpu" else est
            self._residual[j * s:(j + 1) * s] = x - est

    # -- persistence ------------------------------------------------------------------------
    def _own_coordinates(self) -> Optional[torch.Tensor]:
        """Every shard's residual in its own coordinates (n*S floats), moving fp32's rotated
        residuals there (the codecs zeroed), as a loaded state holds them; None if none."""
        lay = self._layout
        if self.error_feedback == "fp32" and lay is not None and self._residual is None:
            pieces = [torch.from_numpy(rounds.unrotate(c.config, c.block, c.padded,
                                                       c.residual, lay.size))
                      for c in lay.codecs]
            for c in lay.codecs:
                c.reset_residual()
            self._residual = torch.cat(pieces).to(lay.device)
        return self._residual

    def state_dict(self) -> dict:
        """Plain types and CPU tensors (torch.save / torch.load(weights_only=True) keep them):
        the step, the residuals in their own coordinates, the settings' fingerprint. With fp32
        error feedback this moves the codecs' rotated residuals to that form, so that this
        instance continues exactly as a fresh one loaded from the dict. Call it between steps."""
        res = self._own_coordinates()
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "config": dataclasses.asdict(self.config),
            "error_feedback": self.error_feedback,
            "key": self.key,
            "world_size": self.world_size,
            "rank": self.rank,
            "size": self._size,
            "step": self.step,
            "residual": None if res is None else res.detach().cpu().clone(),
            "stats": dict(self.stats),
        }

    def load_state_dict(self, sd: dict) -> None:
        """Continue from `sd`, saved by the same rank of a group of the same size with the same
        settings; load into a fresh instance, before its first call."""
        if not isinstance(sd, dict) or sd.get("version") != STATE_VERSION:
            raise ValueError(f"not a ThcReduceScatter state_dict of version {STATE_VERSION}")
        if sd["world_size"] != self.world_size or sd["rank"] != self.rank:
            raise ValueError(f"the state_dict was saved by rank {sd['rank']} of "
                             f"{sd['world_size']}, this is rank {self.rank} of {self.world_size}: "
                             "resume on as many ranks, each loading its own")
        if self._config_default and self._layout is None:  # another device type's default
            self.config = rounds.saved_default(self.world_size, sd["config"]) or self.config
        mine = (dataclasses.asdict(self.config), self.error_feedback, self.key)
        if (sd["config"], sd["error_feedback"], sd["key"]) != mine:
            raise ValueError(f"the state_dict was saved with config {sd['config']}, "
                             f"error_feedback={sd['error_feedback']!r}, key={sd['key']}; this "
                             f"instance has {mine[0]}, error_feedback={mine[1]!r}, key={mine[2]}: "
                             "construct it with the same ones")
        if self._layout is not None:
            raise ValueError("load_state_dict into a fresh ThcReduceScatter, before its first call")
        self._size = sd["size"]
        self.step = int(sd["step"])
        res = sd["residual"]
        dtype = torch.bfloat16 if self.error_feedback == "bf16" else torch.float32
        self._residual = None if res is None else res.to(dtype).reshape(-1).clone()
        self.stats = {k: int(sd["stats"].get(k, 0)) for k in _STAT_KEYS}

    def residual_bytes(self) -> int:
        """The bytes error feedback keeps on this rank (0 before the first call or when off)."""
        lay = self._layout
        if lay is None or self.error_feedback == "off":
            return 0
        if self.error_feedback == "bf16":
            return 2 * self.world_size * lay.size
        return 4 * self.world_size * lay.padded
