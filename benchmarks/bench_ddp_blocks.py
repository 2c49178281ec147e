#!/usr/bin/env python3
"""The collective's rotation block and scale: codec time against error, on a model's DDP buckets
or FSDP param groups.

For the partitions of a model (--layout ddp: DDP's buckets of bucket_cap_mb, the last parameters
first; --layout fsdp: consecutive param groups of about --group-mb, each cut into --ranks
shards, one partition per shard, as byteps_thc.fsdp does), and for each rotation block (the
collective's rule, geometry.bucket_block, or a fixed block), prints

    ns/coord   one thread's CPU time of norm + encode + decode of each partition, per coordinate
               (the best of --repeats), as the hook calls them (error feedback on, the step set
               first, the norm's rotation reused by the encode)
    NMSE       ||estimate - mean||^2 / mean_i ||x_i||^2 of one round of --ranks ranks, no error
               feedback, over all the partitions
with one norm per partition, and with --block-scale the same two with a scale per rotation
block (ThcConfig(block_scale=True): the norm round carries one norm per block).

Gradients (--grads):
  synthetic  per parameter a normal of scale 10^u, u uniform in [-spread/2, spread/2]
             (--spreads, in decades; 0: one scale for the whole model), fixed seeds, the
             shapes of a replay model (--model, byteps_thc.advisor.models)
  lm         real gradients of benchmarks/stdlib_lm's byte-level transformer (--lm-dim,
             --lm-layers) on the standard library's sources: --lm-steps steps of Adam on one
             rank's batches, then each rank's gradient of its own next batch (--lm-batch)

    python benchmarks/bench_ddp_blocks.py --model resnet50 --buckets 2 --spreads 0,2 --block-scale
    python benchmarks/bench_ddp_blocks.py --grads lm --lm-dim 768 --layout fsdp --block-scale
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np

from byteps_thc import ThcAggregator, ThcCodec, ThcConfig
from byteps_thc.advisor import models
from byteps_thc.collective import geometry


def buckets(sizes, cap_mb: float, count: int):
    """DDP's first `count` buckets of parameters of `sizes` (reverse order, fp32, the cap reached
    or passed by the last parameter added: DDP's rule for buckets after the first), as index
    lists."""
    order = list(range(len(sizes)))[::-1]
    cap, out, cur = int(cap_mb * 2 ** 20) // 4, [], []
    for i in order:
        cur.append(i)
        if sum(sizes[j] for j in cur) >= cap:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out[:count]


def groups(sizes, group_mb: float, count: int):
    """FSDP param groups: consecutive parameters of about group_mb MiB of float32 each."""
    out, cur = [], []
    for i, s in enumerate(sizes):
        cur.append(i)
        if 4 * sum(sizes[j] for j in cur) >= group_mb * 2 ** 20:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out[:count]


def synthetic(sizes, ranks: int, spread: float, seed: int):
    """Each rank's gradient per parameter: normals of a per-parameter scale 10^u."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-spread / 2, spread / 2, len(sizes))
    return [[rng.standard_normal(s, dtype=np.float32) * np.float32(c)
             for s, c in zip(sizes, scales)] for _ in range(ranks)]


def lm_gradients(a):
    """Real gradients of the byte LM: (parameter sizes, per rank a list of per-parameter
    gradients), after a.lm_steps steps of Adam on rank 0's batches."""
    import torch

    from benchmarks import stdlib_lm
    torch.manual_seed(0)
    cfg = stdlib_lm.LmConfig(dim=a.lm_dim, layers=a.lm_layers, heads=max(1, a.lm_dim // 64))
    net = stdlib_lm.make_model(cfg)
    corpus = stdlib_lm.load_corpus()
    data = [stdlib_lm.Batches(corpus, cfg.seq, a.lm_batch, rank=r) for r in range(a.ranks)]
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(a.lm_steps):
        opt.zero_grad()
        net(*data[0].next()).backward()
        opt.step()
    out = []
    for r in range(a.ranks):
        net.zero_grad()
        net(*data[r].next()).backward()
        out.append([p.grad.detach().reshape(-1).numpy().astype(np.float32).copy()
                    for p in net.parameters()])
    return [p.numel() for p in net.parameters()], out


def partitions(layout: str, index_lists, grads, ranks: int):
    """Per partition, each rank's flat float32 vector: a bucket, or one shard of a group
    (the group padded with zeros to ranks shards of equal size, as FSDP pads it)."""
    out = []
    for idx in index_lists:
        flat = [np.concatenate([g[i] for i in idx]) for g in grads]
        if layout == "ddp":
            out.append(flat)
            continue
        shard = -(-flat[0].size // ranks)
        padded = [np.concatenate([f, np.zeros(shard * ranks - f.size, np.float32)]) for f in flat]
        out.extend([p[j * shard:(j + 1) * shard] for p in padded] for j in range(ranks))
    return out


def config(d: int, block: int, block_scale: bool, ef: bool) -> ThcConfig:
    """The collective's configuration of a partition of d values (geometry.codec_block)."""
    base = ThcConfig(rotation_block=block or None, block_scale=block_scale, error_feedback=ef)
    return dataclasses.replace(base, rotation_block=geometry.codec_block(base, d))


def one(xs, block: int, block_scale: bool, repeats: int):
    """(block, padded, error, energy, best CPU seconds, norms in the norm round) of one
    partition."""
    d, n = xs[0].size, len(xs)
    cfg = config(d, block, block_scale, ef=False)
    codecs = [ThcCodec(cfg, d, rank=r) for r in range(n)]
    norms = [c.norm(x) for c, x in zip(codecs, xs)]
    m = np.max(norms, axis=0) if block_scale else max(norms)
    agg = ThcAggregator(geometry.shard_config(cfg), codecs[0].padded, n)
    for c, x in zip(codecs, xs):
        agg.add(c.encode(x, m))
    sums = agg.result()
    est = codecs[0].decode(sums, m, n)
    mean = np.mean([x.astype(np.float64) for x in xs], axis=0)
    err = float(((est - mean) ** 2).sum())
    tot = float(np.mean([(x.astype(np.float64) ** 2).sum() for x in xs]))
    # the hook's calls with error feedback (norm's rotation reused by the encode)
    ef = ThcCodec(config(d, block, block_scale, ef=True), d, rank=0)
    payload, out, best = np.empty(ef.payload_bytes, np.uint8), np.empty(d, np.float32), []
    for step in range(repeats):
        t = time.thread_time()
        ef.step = step
        ef.encode(xs[0], ef.norm(xs[0]) * 1.1, out=payload)
        ef.decode(sums, m, n, out=out)
        best.append(time.thread_time() - t)
    return ef.block, ef.padded, err, tot, min(best), (ef.blocks if block_scale else 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grads", choices=("synthetic", "lm"), default="synthetic")
    ap.add_argument("--model", default="resnet50", help="the shapes of --grads synthetic")
    ap.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--buckets", type=int, default=2, help="the first N buckets or groups")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--group-mb", type=float, default=25.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--blocks", default="0,4096,16384,65536,262144",
                    help="rotation blocks; 0: the collective's rule (geometry.bucket_block)")
    ap.add_argument("--spreads", default="0,1,2",
                    help="decades of per-parameter scale (--grads synthetic)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-scale", action="store_true",
                    help="also a scale per rotation block (ns/blk, NMSE/blk)")
    ap.add_argument("--lm-dim", type=int, default=256)
    ap.add_argument("--lm-layers", type=int, default=4)
    ap.add_argument("--lm-steps", type=int, default=20)
    ap.add_argument("--lm-batch", type=int, default=8)
    a = ap.parse_args(argv)
    if a.grads == "lm":
        sizes, lm = lm_gradients(a)
        name, spreads = f"stdlib-lm dim {a.lm_dim} x {a.lm_layers} ({a.lm_steps} steps)", [None]
    else:
        sizes, name = [int(np.prod(s)) for s in models.model_shapes(a.model)], a.model
        spreads = [float(s) for s in a.spreads.split(",")]
    cut = buckets if a.layout == "ddp" else groups
    index_lists = cut(sizes, a.bucket_cap_mb if a.layout == "ddp" else a.group_mb, a.buckets)
    what = "buckets" if a.layout == "ddp" else f"groups ({a.ranks} shards each)"
    print(f"# {name}: {what} of {[sum(sizes[i] for i in idx) for idx in index_lists]} values; "
          f"{a.ranks} ranks; load average {os.getloadavg()[0]:.2f}")
    print(f"{'spread':>6} {'block':>12} {'padded/d':>8} {'ns/coord':>8} {'NMSE':>7}"
          + (f" {'ns/blk':>8} {'NMSE/blk':>8} {'norms':>6}" if a.block_scale else ""))
    for spread in spreads:
        grads = lm if spread is None else synthetic(sizes, a.ranks, spread, 100)
        parts = partitions(a.layout, index_lists, grads, a.ranks)
        for block in (int(b) for b in a.blocks.split(",")):
            row = {}
            for bs in ((False, True) if a.block_scale else (False,)):
                err = tot = cpu = 0.0
                coords = pads = norms = 0
                used = set()
                for xs in parts:
                    b, padded, e, t, c, k = one(xs, block, bs, a.repeats)
                    err, tot, cpu = err + e, tot + t, cpu + c
                    coords, pads, norms = coords + xs[0].size, pads + padded, norms + k
                    used.add(b)
                row[bs] = (pads / coords, cpu / coords * 1e9, err / tot, used, norms)
            pad, ns, nmse, used, _ = row[False]
            label = "rule " + "/".join(f"2^{b.bit_length() - 1}" for b in sorted(used)) \
                if block == 0 else f"2^{block.bit_length() - 1}"
            text = f"{'lm' if spread is None else f'{spread:g}':>6} {label:>12} {pad:8.3f} " \
                   f"{ns:8.2f} {nmse:7.4f}"
            if a.block_scale:
                _, ns_b, nmse_b, _, norms = row[True]
                text += f" {ns_b:8.2f} {nmse_b:8.4f} {norms:6d}"
            print(text, flush=True)


if __name__ == "__main__":
    main()
