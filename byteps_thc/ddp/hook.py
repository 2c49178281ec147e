"""thc_hook: THC as a DDP communication hook, with no parameter server.

For one bucket of d values on n ranks (`ThcHookState` holds the configuration and the state);
steps 1-4 are the THC collective's (byteps_thc.collective.rounds), which FSDP's reduce-scatter
(byteps_thc.fsdp) shares:

1. Norm round: every rank computes the norm of x = gradient + its error-feedback residual
   (sqrt(sum(y^2)/B) of the rotation y, residual included), and one `all_reduce(MAX)` of
   [norm, non-finite flag, fingerprint, -fingerprint] gives the agreed M. With
   `config.block_scale` the norm of each rotation block instead (a few hundred bytes for a
   25 MB bucket in blocks of 2^16), and each block is quantised on its own agreed M_k.
   A differing fingerprint (configuration or hook settings) raises ValueError on every rank.
   A non-finite norm anywhere (the flag travels separately, since MAX may drop a NaN) makes the
   bucket's result NaN on every rank; nothing aborts, and the residuals and step stay as they
   were (an optimizer or GradScaler that skips non-finite steps skips it).
2. Encode with the bucket's codec: rotation block by `geometry.bucket_block` (padding <= ~1.05x),
   seed by the bucket's stable key, the rounding stream by (rank, the bucket's step). The codec
   keeps the error feedback in the rotated domain (one transform per step; state.py says how it
   survives a bucket rebuild).
3. `all_to_all` of the packed b-bit indices by shards: rank j receives every rank's bytes of
   shard j (geometry.shard_bounds: whole bytes, about d/n coordinates).
4. Rank j sums its shard with a ThcAggregator: table lookup and integer add in lanes of 8, 16 or
   32 bits (chosen by n*g).
5. `all_gather` of the integer sums.
6. Every rank decodes the whole bucket from the same sums and the same M: the estimate of the mean
   gradient, the same bits on every rank.

Per rank this sends (n-1)/n*d*b/8 bytes and receives (n-1)/n*d*lane/8, against 2*(n-1)/n*4d for
an fp32 ring all-reduce: about 0.19x at b=4 with 8-bit lanes.

Scheduling. The collectives are asynchronous (async_op=True) and CPU buckets run on one thread of
the state (`_Pipeline`), so that the hook returns at once and the rounds overlap with the rest of
the backward pass and with each other: each bucket handed over advances every earlier bucket in
flight by one step (wait for its collective, compute, issue the next), and the last bucket of an
iteration drains them all. That order depends only on the order DDP hands the buckets over (the
same on every rank), never on timing: gloo pairs the ranks' collectives by the order they were
issued, and collectives issued from completion callbacks, whose order follows timing, can pair
different collectives of different buckets across ranks. CUDA buckets run their steps inline in
the hook (NCCL and the codec's kernels are asynchronous on the stream already).

Tuning:
- `min_compress_bytes` (64 KiB): small buckets cost latency, not bandwidth; they go uncompressed.
  DDP's first bucket is small by design (1 MiB cap); `bucket_cap_mb` of 25 or more amortises the
  per-bucket norm round and the Python work.
- `start_iter`: uncompressed warm-up, as PowerSGD's start_powerSGD_iter; a few hundred steps help
  models whose early gradients are far from their later scale.
- `config`: the default picks the least-error granularity for 8-bit lanes at this world size;
  `ThcConfig.for_workers(n, downstream_bits=16)` halves the error again for twice the incoming
  bytes; bits=2 or 3 send less at a larger error. Keep error feedback on.
- `block_scale` and `rotation_block`: by default (CPU and CUDA buckets) each rotation block
  has its own scale, and each bucket gets the largest block up to 2^16 that pads it by at most 5%
  (geometry.codec_block): cache-sized blocks, under 1% padding, no error lost to a bucket's
  parameters differing in scale. `dataclasses.replace(config, block_scale=False)` is one norm a
  bucket, whose blocks are then the largest that pad by at most 5% (2^19-2^23 for 25 MB
  buckets).
  benchmarks/bench_ddp_blocks.py --block-scale measures both on a model's buckets.
- It can only pay where the link, not the CPU, is the bottleneck: the rotation, the quantisation
  and the decode of every bucket cost CPU (docs/RESULTS.md, "The DDP comm hook").

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
import atexit
import collections
import math
import queue
import threading

import torch
import torch.distributed as dist

from ..collective import rounds
from .state import Layout, ThcHookState

# the all_gather into one tensor (the older name is deprecated where the newer exists)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _done(value: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _mismatch(state: ThcHookState):
    def message(lo, hi):
        return ("THC comm hook: the ranks' configurations differ (fingerprint words range from "
                f"{lo} to {hi}; this rank has {state.fingerprint_words()}, config {state.config}, "
                f"min_compress_bytes={state.min_compress_bytes}, start_iter={state.start_iter}): "
                "construct ThcHookState with the same config and settings on every rank")
    return message


def _handshake(state: ThcHookState, device) -> None:
    """The first call's fingerprint check, before warm-up or size decides the path: ranks that
    disagree on min_compress_bytes or start_iter would otherwise issue different collectives."""
    vec = rounds.norm_vector([0.0], False, state.fingerprint_words(), device)
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=state.process_group)
    rounds.agreed(vec, 1, _mismatch(state))
    state.handshake_done = True


def _plain(state: ThcHookState, buf: torch.Tensor):
    """A plain all-reduce of the mean, as a pipeline round (yields its collective)."""
    buf.div_(state.world_size)
    yield dist.all_reduce(buf, group=state.process_group, async_op=True)
    return buf


def _compressed(state: ThcHookState, lay: Layout, buf: torch.Tensor):
    """One THC round of a bucket (module docstring, steps 1-6), as a generator that yields each
    collective it issued; the caller waits for it before resuming. Returns the mean."""
    n, group, cpu = state.world_size, state.process_group, buf.device.type == "cpu"
    codec, flat = lay.codec, buf.detach().reshape(-1)
    pieces = state.prepare(lay)
    if flat.dtype == torch.float32 and not any(p is not None for p in pieces or ()):
        x = flat
    else:
        x = lay.scratch("x")
        x.copy_(flat)
        for p, (lo, hi) in zip(pieces or (), lay.offsets):
            if p is not None:
                x[lo:hi] += p.to(x.device)
    # the step before the norm: setting it drops the rotation the norm keeps for the encode
    codec.step = state.step_of(lay.key)
    parts = [(codec, x)]
    ms = yield from rounds.norm_round(group, parts, state.fingerprint_words(),  # 1
                                      buf.device, _mismatch(state))
    m = math.nan if ms is None else ms[0]  # block_scale: an array, one M_k per block
    if state.trace is not None:
        state.trace.append((lay.key, m))
    if ms is None or not rounds.finite(m) or rounds.too_large(m, codec.block, lay.cfg.clip):
        state.stats["nonfinite_steps"] += 1
        return flat.fill_(math.nan).view(buf.shape)

    ex = lay.exchange
    rounds.encode(ex, parts, [m], [(0, codec.payload_bytes)])                 # 2
    state.commit(lay)
    sums = yield from rounds.exchange_sums(group, ex)                          # 3, 4
    if sums is not None:
        sums = (torch.from_numpy(sums) if cpu else sums).reshape(-1).view(torch.uint8)
        lay.own[:sums.numel()] = sums
    yield _all_gather(lay.gathered, lay.own, group=group,                       # 5
                      async_op=True)

    if flat.dtype == torch.float32 and cpu:                                     # 6
        codec.decode(lay.lanes, m, n, out=flat.numpy())
    else:
        mean = codec.decode(lay.lanes, m, n, out=lay.scratch("out").numpy() if cpu else None)
        flat.copy_(lay.scratch("out") if cpu else mean)
    state.stats["buckets_compressed"] += 1
    mine = lay.mine
    state.stats["bytes_sent"] += (codec.payload_bytes - mine) + (n - 1) * lay.width
    state.stats["bytes_received"] += (n - 1) * mine + (n - 1) * lay.width
    return flat.view(buf.shape)


def _advance(entry) -> bool:
    """Run one round to its next collective (waiting for the one in flight); True when done."""
    gen, fut, work = entry
    try:
        if work is not None:
            work.wait()
        entry[2] = next(gen)
        return False
    except StopIteration as stop:
        fut.set_result(stop.value)
    except Exception as e:  # reaches DDP through the bucket's future
        fut.set_exception(e)
    return True


class _Pipeline:
    """One thread that runs the rounds of CPU buckets in the order they were handed over. A new
    bucket starts (to its first collective), then every earlier round in flight advances one
    step, oldest first; the iteration's last bucket drains them all. The thread keeps only its
    queue: a dropped state ends it."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, args=(self._queue,), name="thc-hook",
                                  daemon=True)
        for t in [t for t in _LIVE if not t.is_alive()]:
            del _LIVE[t]
        _LIVE[thread] = self._queue
        thread.start()

    def submit(self, gen, last: bool) -> torch.futures.Future:
        fut = torch.futures.Future()
        self._queue.put((gen, fut, last))
        return fut

    def __del__(self):
        self._queue.put(None)

    @staticmethod
    def _run(q):
        active = collections.deque()
        while True:
            item = q.get()
            if item is None:
                return
            gen, fut, last = item
            older = list(active)
            entry = [gen, fut, None]
            if not _advance(entry):
                active.append(entry)
            for e in older:
                if _advance(e):
                    active.remove(e)
            while last and active:
                for e in list(active):
                    if _advance(e):
                        active.remove(e)


# Every pipeline thread started and not yet seen ended, with its queue. A daemon thread that is
# still inside C++ (a collective's wait, a future's callbacks, or the release of its last
# futures and tensors as its frame ends, which drops and retakes the GIL) when the interpreter
# finalizes is ended by a forced unwind, which aborts the process through std::terminate; so at
# exit each one is told to stop and joined first. A thread leaves this registry only once it has
# ended (pruned when the next one starts), never by itself on its way out: one that had already
# taken its stop and was still releasing its frame would otherwise not be joined. The bound keeps
# a stuck collective from hanging the exit.
_LIVE = {}
_JOIN_TIMEOUT_S = 30.0


@atexit.register
def _stop_pipelines():
    live = list(_LIVE.items())
    for _, q in live:
        q.put(None)  # a thread that already stopped never reads it
    for thread, _ in live:
        thread.join(_JOIN_TIMEOUT_S)


def _inline(gen) -> torch.futures.Future:
    entry = [gen, torch.futures.Future(), None]
    while not _advance(entry):
        pass
    return entry[1]


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
    device = buf.device
    if not state.handshake_done:
        state.settle(device.type)
        _handshake(state, device)
    if device.type != state.device_type:
        raise ValueError(f"THC comm hook: a bucket on {device}, but earlier ones were on "
                         f"{state.device_type}: use one ThcHookState per device type")
    params = bucket.parameters()
    key = state.bucket_key(params)
    last = bucket.is_last()
    try:
        if state.iteration < state.start_iter:
            state.stats["buckets_warmup"] += 1
            gen = _plain(state, buf)
        elif buf.numel() * buf.element_size() < state.min_compress_bytes:
            state.stats["buckets_skipped"] += 1
            gen = _plain(state, buf)
        else:
            gen = _compressed(state, state.layout(key, params, buf.numel(), device), buf)
    finally:
        if last:
            state.end_iteration()
    if device.type != "cpu":
        return _inline(gen)
    if state.pipeline is None:
        state.pipeline = _Pipeline()
    return state.pipeline.submit(gen, last)
