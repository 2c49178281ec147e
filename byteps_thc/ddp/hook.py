"""thc_hook: THC as a DDP communication hook, with no parameter server.

For one bucket of d values on n ranks (`ThcHookState` holds the configuration and the state):

1. Norm round: every rank computes ||x|| of its x = gradient + error-feedback residual, and one
   `all_reduce(MAX)` of [norm, non-finite flag, fingerprint, -fingerprint] gives the agreed M.
   A differing fingerprint (configuration or hook settings) raises ValueError on every rank.
   A non-finite norm anywhere (the flag travels separately, since MAX may drop a NaN) makes the
   bucket's result NaN on every rank; nothing aborts, and the residuals and step stay as they
   were (an optimizer or GradScaler that skips non-finite steps skips it).
2. Encode x with the bucket's codec: rotation block by `geometry.bucket_block` (padding <= ~1.05x),
   seed by the bucket's stable key, the rounding stream by (rank, the bucket's step).
3. `all_to_all` of the packed b-bit indices by shards: rank j receives every rank's bytes of
   shard j (geometry.shard_bounds: whole bytes, about d/n coordinates).
4. Rank j sums its shard with a ThcAggregator: table lookup and integer add in lanes of 8, 16 or
   32 bits (chosen by n*g).
5. `all_gather` of the integer sums.
6. Every rank decodes the whole bucket from the same sums and the same M: the estimate of the mean
   gradient, the same bits on every rank. With error feedback each rank also decodes its own
   payload alone and keeps x - that as the residual of the bucket's parameters.

Per rank this sends (n-1)/n*d*b/8 bytes and receives (n-1)/n*d*lane/8, against 2*(n-1)/n*4d for
an fp32 ring all-reduce: about 0.19x at b=4 with 8-bit lanes. The collectives run synchronously
in the hook (the returned future is complete); CUDA tensors stay on the device.

Tuning:
- `min_compress_bytes` (64 KiB): small buckets cost latency, not bandwidth; they go uncompressed.
  DDP's first bucket is small by design (1 MiB cap); `bucket_cap_mb` of 25 or more amortises the
  per-bucket norm round and the Python work.
- `start_iter`: uncompressed warm-up, as PowerSGD's start_powerSGD_iter; a few hundred steps help
  models whose early gradients are far from their later scale.
- `config`: the default picks the least-error granularity for 8-bit lanes at this world size;
  `ThcConfig.for_workers(n, downstream_bits=16)` halves the error again for twice the incoming
  bytes; bits=2 or 3 send less at a larger error. Keep error feedback on.
- It can only pay where the link, not the CPU, is the bottleneck: the encode, the two decodes
  (with error feedback) and four collectives per bucket cost CPU and latency. On a 2-core host it
  was not ahead of plain DDP at 1 Gbit/s (docs/RESULTS.md, "The DDP comm hook").

Example:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from byteps_thc.ddp import ThcHookState, thc_hook

    dist.init_process_group("gloo")            # or "nccl" with CUDA tensors
    model = DDP(net)
    state = ThcHookState(start_iter=10)
    model.register_comm_hook(state, thc_hook)
    ...
    torch.save({"model": model.state_dict(), "thc": state.state_dict()}, path)

The CUDA path (buffers on a GPU: the codec's CudaCodec and CudaAggregator through ThcCodec and
ThcAggregator) has not been run: this project's test machines have no GPU.
"""
import math

import numpy as np
import torch
import torch.distributed as dist

from . import geometry
from .state import ThcHookState

_FLT_MAX = float(np.finfo(np.float32).max)


def _done(value: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _allreduce_mean(state: ThcHookState, buf: torch.Tensor) -> torch.futures.Future:
    buf.div_(state.world_size)
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _agree(state: ThcHookState, norm: float, bad: bool, device) -> float:
    """Step 1: the max norm, or NaN when any rank's was not finite; the fingerprint check."""
    words = state.fingerprint_words()
    vec = torch.tensor([0.0 if bad else norm, 1.0 if bad else 0.0] + words + [-w for w in words],
                       dtype=torch.float64, device=device)
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=state.process_group)
    v = vec.cpu().tolist()
    hi, lo = v[2:5], [-w for w in v[5:8]]
    if hi != lo:
        raise ValueError(
            "THC comm hook: the ranks' configurations differ (fingerprint words range from "
            f"{lo} to {hi}; this rank has {words}, config {state.config}, min_compress_bytes="
            f"{state.min_compress_bytes}, start_iter={state.start_iter}): construct "
            "ThcHookState with the same config and settings on every rank")
    return math.nan if v[1] != 0.0 else v[0]


def _handshake(state: ThcHookState, device) -> None:
    """The first call's fingerprint check, before warm-up or size decides the path: ranks that
    disagree on min_compress_bytes or start_iter would otherwise issue different collectives."""
    _agree(state, 0.0, False, device)
    state.handshake_done = True


def _to_tensor(a, device) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _compressed(state: ThcHookState, bucket, key, buf: torch.Tensor) -> torch.Tensor:
    n, rank, device = state.world_size, state.rank, buf.device
    params = bucket.parameters()
    d = buf.numel()
    offsets, lo = [], 0
    for p in params:
        offsets.append((lo, lo + p.numel()))
        lo += p.numel()
    if lo != d:
        raise ValueError(f"bucket of {d} values, but its parameters hold {lo}")
    cfg, codec, own_agg, shard_agg, bounds = state.codecs(key, d)
    x = buf.detach().reshape(-1).to(torch.float32, copy=True)
    if state.config.error_feedback:
        x += state.bucket_residual(key, offsets, device)

    try:
        norm, bad = codec.norm(x), False                                     # 1
    except ValueError:  # NaN/Inf in the gradient or the residual
        norm, bad = math.nan, True
    m = _agree(state, norm, bad, device)
    if state.trace is not None:
        state.trace.append((key, m))
    # M this large could overflow float32 in the rotation or the scales (|y| <= sqrt(B)*M):
    # treated as non-finite, the same on every rank since M and B are agreed
    if not math.isfinite(m) or m * math.sqrt(codec.block) * (1.0 + cfg.clip) * 4.0 >= _FLT_MAX:
        state.stats["nonfinite_steps"] += 1
        return torch.full_like(buf, math.nan)

    codec.step = state.step_of(key)
    payload = _to_tensor(codec.encode(x, m), device)                            # 2
    bits = cfg.bits
    ranges = [geometry.byte_range(s, e, bits) for s, e in bounds]
    in_splits = [hi - lo for lo, hi in ranges]
    mine = in_splits[rank]
    recv = torch.empty(mine * n, dtype=torch.uint8, device=device)
    dist.all_to_all_single(recv, payload, [mine] * n, in_splits,               # 3
                           group=state.process_group)

    lane_bytes = state.lane_bits // 8
    width = (bounds[0][1] - bounds[0][0]) * lane_bytes  # every rank's gathered bytes, padded
    own = torch.zeros(width, dtype=torch.uint8, device=device)
    if shard_agg is not None:                                                   # 4
        shard_agg.reset()
        for j in range(n):
            shard_agg.add(recv[j * mine:(j + 1) * mine])
        sums = _to_tensor(shard_agg.result(), device).reshape(-1).view(torch.uint8)
        own[:sums.numel()] = sums
    gathered = [torch.empty_like(own) for _ in range(n)]
    dist.all_gather(gathered, own, group=state.process_group)                   # 5
    lanes = torch.cat([g[:(e - s) * lane_bytes] for g, (s, e) in zip(gathered, bounds)])
    if device.type == "cpu":
        lanes = lanes.numpy().view({1: np.uint8, 2: np.uint16, 4: np.uint32}[lane_bytes])
    else:
        lanes = lanes.view({1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[lane_bytes])
    mean = _to_tensor(codec.decode(lanes, m, n), device)                        # 6

    new_res = None
    if own_agg is not None:
        own_agg.reset()
        own_agg.add(payload)
        mine_deq = _to_tensor(codec.decode(own_agg.result(), m, 1), device)
        new_res = x - mine_deq
    state.commit(key, offsets, new_res)
    state.stats["buckets_compressed"] += 1
    state.stats["bytes_sent"] += (payload.numel() - mine) + (n - 1) * width
    state.stats["bytes_received"] += (n - 1) * mine + (n - 1) * width
    return mean.to(buf.dtype).reshape(buf.shape)


# no `from __future__ import annotations` here: DDP compares this return annotation with the
# object torch.futures.Future[torch.Tensor]
def thc_hook(state: ThcHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean gradient by THC (module docstring: the steps).

    World size 1 returns the bucket unchanged. Buckets under state.min_compress_bytes, and every
    bucket during the first state.start_iter iterations, go through a plain all-reduce of the
    mean. fp16 and bf16 buckets are encoded from float32 copies and returned in their dtype.

        model.register_comm_hook(ThcHookState(), thc_hook)
    """
    buf = bucket.buffer()
    if state.world_size == 1:
        return _done(buf)
    if not state.handshake_done:
        _handshake(state, buf.device)
    key = state.bucket_key(bucket.parameters())
    try:
        if state.iteration < state.start_iter:
            state.stats["buckets_warmup"] += 1
            return _allreduce_mean(state, buf)
        if buf.numel() * buf.element_size() < state.min_compress_bytes:
            state.stats["buckets_skipped"] += 1
            return _allreduce_mean(state, buf)
        return _done(_compressed(state, bucket, key, buf))
    finally:
        if bucket.is_last():
            state.iteration += 1
