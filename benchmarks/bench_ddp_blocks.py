#!/usr/bin/env python3
"""The DDP hook's rotation block: codec time against error, on a model's DDP buckets.

For the first buckets of a replay model (byteps_thc.advisor.models, DDP's order: the last
parameters first, buckets of bucket_cap_mb), and for each rotation block (the hook's rule,
geometry.bucket_block, or a fixed block), prints

    ns/coord   one thread's CPU time of norm + encode + decode of the bucket, per coordinate of
               the bucket (the best of --repeats), as the hook calls them (the step set first)
    NMSE       ||estimate - mean||^2 / mean_i ||x_i||^2 of one round of 2 ranks, no error
               feedback, summed over the buckets
    NMSE/blk   the same with one norm per rotation block (--per-block): each block quantised
               on its own agreed scale, emulated here by one codec per block (so its time,
               Python's loop included, is not the codec's and is not shown)

Gradients: per parameter a normal of scale 10^u, u uniform in [-spread/2, spread/2] (--spreads,
in decades; 0: one scale for the whole model), drawn from fixed seeds, the same for every block.
A larger block averages the energy of more parameters before the quantiser's shared scale (the
bucket's norm), so the error of a bucket whose parameters differ in scale falls with the block,
while a block beyond the caches costs more passes over memory.

    python benchmarks/bench_ddp_blocks.py --model resnet50 --buckets 2 --spreads 0,2
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from byteps_thc import ThcAggregator, ThcCodec, ThcConfig
from byteps_thc.advisor import models
from byteps_thc.ddp import geometry

RANKS = 2


def buckets(model: str, cap_mb: float, count: int):
    """Parameter sizes of DDP's first `count` buckets (reverse parameter order, fp32, the cap
    reached or passed by the last parameter added: DDP's rule for buckets after the first)."""
    sizes = [int(np.prod(s)) for s in models.model_shapes(model)][::-1]
    cap, out, cur = int(cap_mb * 2 ** 20) // 4, [], []
    for s in sizes:
        cur.append(s)
        if sum(cur) >= cap:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out[:count]


def gradients(sizes, spread: float, seed: int):
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-spread / 2, spread / 2, len(sizes))
    return [np.concatenate([rng.standard_normal(s, dtype=np.float32) * np.float32(c)
                            for s, c in zip(sizes, scales)]) for _ in range(RANKS)]


def one(sizes, xs, block, repeats):
    d = sum(sizes)
    b = block or geometry.bucket_block(d)
    cfg = ThcConfig(rotation_block=b, error_feedback=False)
    codecs = [ThcCodec(cfg, d, rank=r) for r in range(RANKS)]
    m = max(c.norm(x) for c, x in zip(codecs, xs))
    agg = ThcAggregator(geometry.shard_config(cfg), codecs[0].padded, RANKS)
    for c, x in zip(codecs, xs):
        agg.add(c.encode(x, m))
    sums = agg.result()
    est = codecs[0].decode(sums, m, RANKS)
    mean = (xs[0].astype(np.float64) + xs[1]) / RANKS
    err = float(((est - mean) ** 2).sum())
    tot = float(np.mean([(x.astype(np.float64) ** 2).sum() for x in xs]))
    # the hook's calls with error feedback (norm's rotation reused by the encode)
    ef = ThcCodec(ThcConfig(rotation_block=b), d, rank=0)
    payload, out, best = np.empty(ef.payload_bytes, np.uint8), np.empty(d, np.float32), []
    for step in range(repeats):
        t = time.thread_time()
        ef.step = step
        ef.encode(xs[0], ef.norm(xs[0]) * 1.1, out=payload)
        ef.decode(sums, m, RANKS, out=out)
        best.append(time.thread_time() - t)
    return b, ef.padded, err, tot, min(best)


def per_block(sizes, xs, block):
    """NMSE numerator of one round with one norm per rotation block: each block of the bucket
    (the last one the rest) a partition of its own, with its own max norm over the ranks."""
    d = sum(sizes)
    b = block or geometry.bucket_block(d)
    mean = (xs[0].astype(np.float64) + xs[1]) / RANKS
    err = 0.0
    for lo in range(0, d, b):
        hi = min(lo + b, d)
        cfg = ThcConfig(rotation_block=b, error_feedback=False)
        codecs = [ThcCodec(cfg, hi - lo, rank=r) for r in range(RANKS)]
        parts = [x[lo:hi] for x in xs]
        m = max(c.norm(x) for c, x in zip(codecs, parts))
        agg = ThcAggregator(geometry.shard_config(cfg), codecs[0].padded, RANKS)
        for c, x in zip(codecs, parts):
            agg.add(c.encode(x, m))
        est = codecs[0].decode(agg.result(), m, RANKS)
        err += float(((est - mean[lo:hi]) ** 2).sum())
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--buckets", type=int, default=2, help="the first N buckets")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--blocks", default="0,4096,16384,65536,262144",
                    help="rotation blocks; 0: the hook's rule (geometry.bucket_block)")
    ap.add_argument("--spreads", default="0,1,2", help="decades of per-parameter scale")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-block", action="store_true",
                    help="also the error with one norm per rotation block (NMSE/blk)")
    a = ap.parse_args(argv)
    bks = buckets(a.model, a.bucket_cap_mb, a.buckets)
    print(f"# {a.model}: buckets of {[sum(s) for s in bks]} values; {RANKS} ranks; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'spread':>6} {'block':>12} {'padded/d':>8} {'ns/coord':>8} {'NMSE':>7}"
          + (f" {'NMSE/blk':>8}" if a.per_block else ""))
    for spread in (float(s) for s in a.spreads.split(",")):
        grads = [gradients(s, spread, 100 + i) for i, s in enumerate(bks)]
        for block in (int(b) for b in a.blocks.split(",")):
            err = tot = cpu = blk = 0.0
            coords = pads = 0
            used = set()
            for sizes, xs in zip(bks, grads):
                b, padded, e, t, c = one(sizes, xs, block, a.repeats)
                err, tot, cpu = err + e, tot + t, cpu + c
                if a.per_block:
                    blk += per_block(sizes, xs, block)
                coords, pads = coords + sum(sizes), pads + padded
                used.add(b)
            label = "rule " + "/".join(f"2^{b.bit_length() - 1}" for b in sorted(used)) \
                if block == 0 else f"2^{block.bit_length() - 1}"
            print(f"{spread:6g} {label:>12} {pads / coords:8.3f} {cpu / coords * 1e9:8.2f} "
                  f"{err / tot:7.4f}" + (f" {blk / tot:8.4f}" if a.per_block else ""), flush=True)


if __name__ == "__main__":
    main()
