#!/usr/bin/env python3
"""Codec speed: encode, decode and aggregate against a memcpy of the same float32 bytes.

For each instruction set the CPU has, each partition size d and each rotation block (1024-wide
and the whole partition), prints the median time per coordinate of

    memcpy     np.copyto of d float32 (the yardstick, measured in the same run)
    encode     ThcCodec.encode with error feedback alone (it rotates x), into a preallocated payload
    encode_noef  the same without error feedback
    step       norm + encode with error feedback: a worker's whole codec work before the pull
               (the norm rotates x; the encode of the same x quantises that rotation)
    decode     ThcCodec.decode of n=4 workers' sums, into a preallocated output
    encode_alloc, decode_alloc  the same without `out`: the Python API's default, a new payload
               (output) per call, which is what these add to encode and decode
    aggregate  one ThcAggregator.add (unpack, table lookup, integer add)
    publish    the server's reply: n=4 workers' lanes packed in ceil(log2(n*g + 1)) = 7 bits each
    decode_packed  a BytePS worker's decode: that packed reply, n folded into the scale
               (total=True), into a preallocated output
    transform  the in-place Walsh-Hadamard transform alone of the partition's d_pad floats in its
               rotation blocks (zeros: SIMD adds take the same time for any value but
               subnormals), the floor under the decode and the encode (partitions with a smaller
               tail block leave the tail out)

and each as a ratio to memcpy, with one thread and with all threads (independent partitions in
parallel threads, as BytePS compresses partitions in parallel; the GIL is released in the
kernels). Targets at d = 2^20, one thread: encode <= 3x, decode <= 3x, aggregate <= 0.3x.
--codec-threads T splits each partition's own blocks over T threads (ThcCodec's `threads`);
those rows are timed on the wall clock (a CPU clock sees the calling thread alone), so compare
them with the codec-threads 1 rows of the same run taken with --clock wall.

Two memory states (--memory): `hot` works on one partition over and over, so at 2^16-2^20 its
data stay in the last-level cache; `cold` cycles through enough partitions (--working-set) that
every call reads and writes DRAM, as a training step does (a model's gradients are far larger
than the cache). The spec's yardstick, a transform of 2^20 floats at about 2.2x a memcpy, is a
cold memcpy; the transform op measures ours (docs/RESULTS.md has the figures).

    python benchmarks/bench_codec.py                      # 2^16, 2^20, 2^24; every ISA
    python benchmarks/bench_codec.py --sizes 20 --isa avx512 --json out.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no idle BLAS threads competing for the cores
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from byteps_thc import (
    _C,
    ThcAggregator,
    ThcCodec,
    ThcConfig,
)

WORKERS = 4  # the sums decoded are those of this many workers (8-bit lanes at g = 30)


class Partition:
    """One partition's state for one thread: data, codec, aggregator, output buffers."""

    def __init__(self, cfg: ThcConfig, d: int, seed: int, codec_threads: int = 1):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal(d, dtype=np.float32)
        self.copy_dst = np.empty_like(self.x)
        self.codec = ThcCodec(cfg, d, rank=seed % 4, threads=codec_threads)
        self.codec_noef = ThcCodec(dataclasses.replace(cfg, error_feedback=False), d,
                                   rank=seed % 4, threads=codec_threads)
        self.max_norm = self.codec.norm(self.x) * 1.5
        self.payload = np.empty(self.codec.payload_bytes, dtype=np.uint8)
        self.codec.encode(self.x, self.max_norm, out=self.payload)
        self.agg = ThcAggregator(cfg, d, WORKERS)
        for _ in range(WORKERS):
            self.agg.add(self.payload)
        self.sums = self.agg.result()
        self.out = np.empty(d, dtype=np.float32)
        self.core = self.codec._core
        self.packed = _C.publish(self.core, WORKERS, self.sums)
        self.block = self.codec.block
        self.rotated = np.zeros(self.codec.padded // self.block * self.block, dtype=np.float32)

    def memcpy(self):
        np.copyto(self.copy_dst, self.x)

    def encode(self):
        self.codec.encode(self.x, self.max_norm, out=self.payload)

    def encode_alloc(self):
        self.codec.encode(self.x, self.max_norm)

    def decode_alloc(self):
        self.codec.decode(self.sums, self.max_norm, WORKERS)

    def encode_noef(self):
        self.codec_noef.encode(self.x, self.max_norm, out=self.payload)

    def step(self):
        self.codec.norm(self.x)
        self.codec.encode(self.x, self.max_norm, out=self.payload)

    def decode(self):
        self.codec.decode(self.sums, self.max_norm, WORKERS, out=self.out)

    def publish(self):
        _C.publish(self.core, WORKERS, self.sums)

    def decode_packed(self):
        _C.decode_published(self.core, self.codec.size, self.packed, WORKERS, self.max_norm,
                            total=True, threads=self.codec.threads, out=self.out)

    def transform(self):
        _C._time_fwht(self.rotated, self.block, 1)

    def aggregate(self):
        if self.agg.count == WORKERS:
            self.agg.reset()
        self.agg.add(self.payload)


def time_single(fn, repeats: int, clock=time.perf_counter) -> list:
    fn()  # warm up
    ts = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return ts


def time_threads(fns, repeats: int, inner: int) -> list:
    """Wall times (per call) for len(fns) threads to run their function `inner` times each, one
    per repeat: from the first thread's start to the last thread's end. `inner` amortises the
    thread synchronisation for small partitions."""
    n = len(fns)
    start, end = threading.Barrier(n), threading.Barrier(n + 1)
    spans = [[None] * n for _ in range(repeats + 1)]

    def worker(k, fn):
        for r in range(repeats + 1):
            start.wait()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            spans[r][k] = (t0, time.perf_counter())
            end.wait()

    threads = [threading.Thread(target=worker, args=(k, fn)) for k, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for _ in range(repeats + 1):
        end.wait()
    for t in threads:
        t.join()
    return [(max(e for _, e in sp) - min(s for s, _ in sp)) / inner for sp in spans[1:]]


class Cycle:
    """Calls op on k partitions in turn (k = 1: the same one every time)."""

    def __init__(self, parts, op):
        self.fns = [getattr(p, op) for p in parts]
        self.i = 0

    def __call__(self):
        fn = self.fns[self.i]
        self.i = (self.i + 1) % len(self.fns)
        fn()


def bench(cfg, d, threads, repeats, ops, clock=time.perf_counter, per_thread=1, codec_threads=1):
    """{op: [seconds per repeat]} for memcpy and each op; each thread cycles through
    `per_thread` partitions of its own."""
    parts = [[Partition(cfg, d, seed * per_thread + k, codec_threads) for k in range(per_thread)]
             for seed in range(threads)]
    res = {}
    for op in ["memcpy"] + ops:
        for ps in parts:  # every partition once, untimed: first touches and page faults
            for p in ps:
                getattr(p, op)()
        if threads == 1:
            t = time_single(Cycle(parts[0], op), repeats, clock)
        else:
            t = time_threads([Cycle(p, op) for p in parts], repeats, max(1, (1 << 20) // d))
        res[op] = t
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,20,24",
                    help="log2 of d, comma separated; a number above 40 is d itself (1024000: "
                         "a BytePS partition of 4,096,000 bytes, padded to 2^20)")
    ap.add_argument("--isa", default="all",
                    help="portable, avx2, avx512 or all (those the CPU has)")
    ap.add_argument("--blocks", default="1024,0", help="rotation blocks; 0 = whole partition")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", help="thread counts")
    ap.add_argument("--codec-threads", default="1",
                    help="threads of one partition's codec (ThcCodec's threads), comma separated")
    ap.add_argument("--repeats", type=int, default=0, help="repeats (default: by size)")
    ap.add_argument("--ops", default="encode,encode_noef,step,decode,decode_packed,aggregate,"
                                     "publish")
    ap.add_argument("--memory", default="hot,cold",
                    help="hot: one partition again and again (cache-resident up to 2^20); cold: "
                         "cycle through partitions of --working-set MiB of gradients in all, so "
                         "that every call streams from DRAM, as in training")
    ap.add_argument("--working-set", type=int, default=256,
                    help="MiB of float32 gradients per thread for --memory cold (default 256, "
                         "several times a server's last-level cache)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="statistic of the repeats printed (both go to --json); min is steadier "
                         "on a busy machine")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="one-thread timings: wall clock, or this thread's CPU time (on a shared, "
                         "loaded host the time the thread was preempted is not the codec's)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    args = ap.parse_args(argv)

    isas = ["avx512", "avx2", "portable"] if args.isa == "all" else args.isa.split(",")
    original = _C.active_isa()
    isas = [i for i in isas if _C.force_isa(i)]
    _C.force_isa(original)
    sizes = [int(s) for s in args.sizes.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    thread_counts = sorted({int(t) for t in args.threads.split(",")})
    codec_threads = sorted({int(t) for t in args.codec_threads.split(",")})
    ops = args.ops.split(",")

    print(f"# byteps-thc codec benchmark: cpu={os.cpu_count()} cores, ISAs {isas} "
          f"(best {original}); b=4 g=30 p=1/32, encode with EF unless _noef; decode/aggregate with "
          f"{WORKERS} workers' sums; load average {os.getloadavg()[0]:.2f}")
    print(f"# per-coordinate ns (ratio to memcpy of the same float32 bytes); "
          f"{args.stat} of repeats; one thread: {args.clock} clock; "
          f"threads: independent partitions in parallel, ns = wall / (threads * d)")
    pick = statistics.median if args.stat == "median" else min
    memories = args.memory.split(",")
    hdr = (f"{'isa':8} {'d':>7} {'block':>7} {'thr':>3} {'cthr':>4} {'mem':>4} {'memcpy ns':>9} "
           + " ".join(
        f"{op + ' ns (x)':>20}" for op in ops))
    print(hdr, flush=True)
    rows = []
    for isa in isas:
        _C.force_isa(isa)
        for lg in sizes:
            d = 1 << lg if lg <= 40 else lg
            label = "2^%d" % lg if lg <= 40 else str(d)
            for block in blocks:
                cfg = ThcConfig(rotation_block=block or None, error_feedback=True)
                for thr, cthr, mem in [(t, c, m) for t in thread_counts for c in codec_threads
                                       for m in memories]:
                    per_thread = 1 if mem == "hot" else max(
                        2, -(-(args.working_set << 20) // (4 * d)))
                    repeats = args.repeats or (21 if d <= 1 << 18 else 9 if d <= 1 << 22 else 3)
                    cpu_clock = args.clock == "cpu" and cthr == 1
                    clock = time.thread_time if cpu_clock else time.perf_counter
                    r = bench(cfg, d, thr, repeats, ops, clock, per_thread, cthr)
                    coords = d * thr
                    whole = 1 << (d - 1).bit_length()     # a whole-partition block: padded d
                    row = {"isa": isa, "d": d, "log2_d": math.log2(d), "block": block or whole,
                           "threads": thr, "codec_threads": cthr,
                           "clock": "cpu" if cpu_clock else "wall", "memory": mem,
                           "partitions_per_thread": per_thread,
                           "repeats": repeats}
                    cells = []
                    for op in ["memcpy"] + ops:
                        row[op + "_s_median"] = statistics.median(r[op])
                        row[op + "_s_min"] = min(r[op])
                        row[op + "_ns_per_coord"] = pick(r[op]) / coords * 1e9
                        if op != "memcpy":
                            row[op + "_ratio"] = pick(r[op]) / pick(r["memcpy"])
                            row[op + "_ratio_median"] = (row[op + "_s_median"]
                                                         / row["memcpy_s_median"])
                            row[op + "_ratio_min"] = row[op + "_s_min"] / row["memcpy_s_min"]
                            cells.append(f"{row[op + '_ns_per_coord']:9.3f} "
                                         f"({row[op + '_ratio']:5.2f}x)")
                    rows.append(row)
                    print(f"{isa:8} {label:>7} {('whole' if not block else block):>7} {thr:>3} "
                          f"{cthr:>4} {mem:>4} "
                          f"{row['memcpy_ns_per_coord']:9.3f} "
                          + " ".join(f"{c:>20}" for c in cells),
                          flush=True)
    _C.force_isa(original)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "cpu_count": os.cpu_count(),
                                               "best_isa": original, "stat": args.stat,
                                               "clock": args.clock,
                                               "load_average": os.getloadavg()}, indent=1))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
