#!/usr/bin/env python3
"""LHC codec speed against memcpy, and peeling rounds against load.

Speed: for each instruction set the CPU has and each workload, the median CPU time of this
thread (time.thread_time: the core releases the GIL but runs in the calling thread, and on a
shared host wall time mostly measures the other processes) of

    memcpy     np.copyto of d float32 (the yardstick, measured in the same run)
    max_abs    LhcCodec.max_abs (the max round's local value; a scan of x, plus the residual)
    encode     LhcCodec.encode (sparsify, quantise, bitmap, sketch)
    add        one LhcAggregator.add (bitmap OR, sketch add): the server's work per payload
    decode     LhcCodec.decode of n workers' aggregated payload (bitmap scan, peeling)

and each as a ratio to memcpy. Workloads: a natively sparse gradient (density rho, no top-k)
and a dense one through exact top-k of rho. The sketch is sized for the union of n workers.

Rounds: the aggregated payload of a union of N = load * m indices (m ~ 1.2e5 buckets) decoded
by the core; rounds of round-synchronous peeling, success, and the unresolved fraction next to
the theory q^3, q = 1 - exp(-3 c q^2).

    python benchmarks/bench_lhc.py                       # 2^20 and 2^22, every ISA
    python benchmarks/bench_lhc.py --sizes 20 --json benchmarks/results/bench_lhc.json
"""
from __future__ import annotations

import argparse
import json
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from byteps_thc import _C, LhcAggregator, LhcCodec, LhcConfig
from byteps_thc.lhc import codec as lhc_codec

WORKERS = 4


def median_time(fn, reps, setup=None):
    ts = []
    for _ in range(reps):
        if setup is not None:
            setup()
        t0 = time.thread_time()
        fn()
        ts.append(time.thread_time() - t0)
    return statistics.median(ts)


def speed(d, rho, topk, reps):
    rng = np.random.default_rng(0)
    cap = max(1, round(d * (1 - (1 - rho) ** WORKERS)))
    cfg = LhcConfig(capacity=cap, topk=topk, error_feedback=topk is not None)
    xs = []
    for w in range(WORKERS):
        if topk is None:
            x = np.zeros(d, np.float32)
            i = rng.choice(d, int(rho * d), replace=False)
            x[i] = rng.standard_normal(i.size)
        else:
            x = rng.standard_normal(d).astype(np.float32)
        xs.append(x)
    codecs = [LhcCodec(cfg, d, rank=w) for w in range(WORKERS)]
    m = max(c.max_abs(x) for c, x in zip(codecs, xs))
    pays = [c.encode(x, m, WORKERS) for c, x in zip(codecs, xs)]
    agg = LhcAggregator(cfg, d, WORKERS)
    for p in pays:
        agg.add(p)
    total = agg.result()
    dst = np.empty_like(xs[0])

    def add_one():
        agg.reset()
        agg.add(pays[0])

    t = {
        "memcpy": median_time(lambda: np.copyto(dst, xs[0]), reps),
        "max_abs": median_time(lambda: codecs[0].max_abs(xs[0]), reps),
        "encode": median_time(lambda: codecs[0].encode(xs[0], m, WORKERS), reps,
                              codecs[0].reset_residual),
        "add": median_time(add_one, reps),
        "decode": median_time(lambda: codecs[1].decode(total, m, WORKERS), reps),
    }
    return {"d": d, "rho": rho, "topk": topk, "m_buckets": codecs[0].m_buckets,
            "payload_bytes": codecs[0].payload_bytes, "dense_bytes": 4 * d,
            "seconds": t, "ratio": {k: v / t["memcpy"] for k, v in t.items()}}


def core_fraction(c):
    q = 1.0
    for _ in range(10000):
        q = 1.0 - math.exp(-3 * c * q * q)
    return q ** 3


def rounds(loads, m_sub=40_000, trials=3):
    m = 3 * m_sub
    d = 1 << 24
    out = []
    for load in loads:
        row = {"load": load, "m_buckets": m, "rounds": [], "ok": 0, "unresolved": []}
        for t in range(trials):
            cfg = LhcConfig(capacity=1, seed=1000 * t + int(load * 100))
            pseed = _C.lhc_partition_seed(cfg.seed, 0)
            rng = np.random.default_rng(t)
            x = np.zeros(d, np.float32)
            n = int(load * m)
            x[rng.choice(d, n, replace=False)] = rng.standard_normal(n)
            enc = _C.LhcEncoder(d, m, pseed, 0, 0.0, False, False)
            mx = enc.max_abs(x)
            agg = _C.LhcAggregator(d, m, pseed, 1)
            agg.add(enc.encode(x, mx, 1))
            _, unresolved, r, union = _C.lhc_decode(d, m, pseed, agg.result(), mx, 1)
            row["rounds"].append(r)
            row["ok"] += unresolved is None
            row["unresolved"].append(0.0 if unresolved is None else unresolved.size / union)
        row["theory_unresolved"] = core_fraction(load)
        out.append(row)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 22], help="log2 d")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--isa", nargs="+", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if lhc_codec.backend() != "core":
        sys.exit("byteps_thc._C has no LHC core: build it (make ext)")
    orig = _C.lhc_active_isa()
    isas = args.isa or [i for i in ("portable", "avx2", "avx512") if _C.lhc_force_isa(i)]
    result = {"workers": WORKERS, "speed": {}, "rounds": None}
    for isa in isas:
        if not _C.lhc_force_isa(isa):
            print(f"{isa}: not on this CPU")
            continue
        rows = []
        for lg in args.sizes:
            for rho, topk in [(0.001, None), (0.01, None), (0.01, 0.01)]:
                r = speed(1 << lg, rho, topk, args.reps)
                rows.append(r)
                kind = "sparse" if topk is None else "topk  "
                print(f"{isa:8s} d=2^{lg} {kind} rho={rho:<6g} m={r['m_buckets']:>7d} "
                      f"bytes={r['payload_bytes'] / r['dense_bytes']:.3f}x dense  "
                      + "  ".join(f"{k}={r['seconds'][k] * 1e3:7.3f}ms ({r['ratio'][k]:5.2f}x)"
                                  for k in ("memcpy", "max_abs", "encode", "add", "decode")))
        result["speed"][isa] = rows
    _C.lhc_force_isa(orig)
    result["rounds"] = rounds([0.5, 0.6, 0.7, 0.75, 0.78, 0.8, 0.81, 0.83, 0.85, 0.9])
    for row in result["rounds"]:
        print(f"load {row['load']:.2f} m={row['m_buckets']}: rounds {row['rounds']} "
              f"ok {row['ok']}/{len(row['rounds'])} unresolved "
              f"{[round(u, 3) for u in row['unresolved']]} (theory {row['theory_unresolved']:.3f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
