#!/usr/bin/env python3
"""BytePS server benchmark: THC's homomorphic integer path against uncompressed float32, same run.

Starts the real scheduler and server of the fork build on 127.0.0.1 and N real ps-lite clients
(harness/thc_client.cc). A model of --params float32 parameters is split into
BytePS partitions of --partition-bytes (4096000 bytes by default, BytePS's); every client pushes
every partition and pulls it back, R rounds, first as THC payloads (header + b-bit indices; the
server unpacks, looks up and adds integers, pulls return the sums), then as plain float32 (the
server sums floats). Prints rounds per second, bytes on the wire per round (measured at the clients:
bytes pushed and bytes the pulls returned) and the server's CPU time per round (/proc utime+stime
of the server process).

    .venv/bin/python benchmarks/bench_server.py --workers 2 --params 25000000 --rounds 10
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import pslite as tc

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def partitions(params: int, partition_bytes: int):
    per = partition_bytes // 4
    sizes = [per] * (params // per)
    if params % per:
        sizes.append(params % per)
    return sizes


def run_phase(cluster, name, keys, manifests, rounds, warmup):
    n = cluster.n
    if warmup:
        cluster.all([f"loop {warmup} {m}" for m in manifests], timeout=600)
    cpu0 = cpu_seconds(cluster.server.pid)
    t0 = time.perf_counter()
    out = cluster.all([f"loop {rounds} {m}" for m in manifests], timeout=3600)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(cluster.server.pid) - cpu0
    up = sum(int(o.split()[1]) for o in out) / rounds
    down = sum(int(o.split()[2]) for o in out) / rounds
    return dict(name=name, rounds_per_s=rounds / wall, up=up, down=down,
                cpu_ms=1000 * cpu / rounds, n=n, keys=len(keys))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="clients (BytePS workers)")
    ap.add_argument("--params", type=int, default=25_000_000,
                    help="model size in float32 parameters")
    ap.add_argument("--partition-bytes", type=int, default=4096000,
                    help="BYTEPS_PARTITION_BYTES (BytePS's default 4096000)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--granularity", type=int, default=30)
    ap.add_argument("--engine-threads", type=int, default=2, help="BYTEPS_SERVER_ENGINE_THREAD")
    args = ap.parse_args(argv)

    from byteps_thc import ThcCodec, ThcConfig
    argv_server = tc.server_argv()
    if argv_server is None:
        sys.exit("the BytePS fork is not built: run `make byteps` first")
    work = Path(tempfile.mkdtemp(prefix="bench_server_"))
    exe = tc.build_client(ROOT / "build" / "thc_client")
    if exe is None:
        sys.exit("the fork build's ps-lite was not found (make byteps)")
    cfg = ThcConfig(bits=args.bits, granularity=args.granularity)
    sizes = partitions(args.params, args.partition_bytes)
    n = args.workers
    print(f"{n} workers, {args.params / 1e6:.1f}M float32 parameters in {len(sizes)} partitions of "
          f"<= {args.partition_bytes} bytes; {cfg.describe().split(';')[0]}")
    cluster = tc.Cluster(n, work, exe, argv_server,
                         {"BYTEPS_SERVER_ENGINE_THREAD": str(args.engine_threads)})
    try:
        thc_keys = [(1 << 16) + i for i in range(len(sizes))]
        raw_keys = [(2 << 16) + i for i in range(len(sizes))]
        kw = tc.serialise_kwargs(cfg.to_kwargs())
        (work / "kwargs.txt").write_text(kw)
        rng = np.random.default_rng(0)
        thc_manifest = [[] for _ in range(n)]
        raw_manifest = [[] for _ in range(n)]
        for key, raw_key, d in zip(thc_keys, raw_keys, sizes):
            zeros = work / f"zeros{d}.bin"
            if not zeros.exists():
                zeros.write_bytes(bytes(4 * d))
            cmd_push = tc.command(tc.DEFAULT, tc.FLOAT32)
            for k in (key, raw_key):  # BytePS's init push: also the store size
                cluster.all([f"push {k} {cmd_push} {zeros}"] * n)
            cmd_kwargs = tc.command(tc.COMPRESSED, tc.FLOAT32)
            cluster.all([f"push {key} {cmd_kwargs} {work / 'kwargs.txt'}"] * n)
            fp_reply = cluster.clients[0].cmd(f"fp {key} {d} {kw}")
            fp, payload_bytes, padded = map(int, fp_reply.split())
            grads = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
            codecs = [ThcCodec(cfg, d, rank=i) for i in range(n)]
            m = max(c.norm(g) for c, g in zip(codecs, grads))
            cap = 32 + 4 * padded
            for i in range(n):
                p = work / f"thc_{key}_{i}.bin"
                p.write_bytes(struct.pack("<IIQ", tc.PUSH_MAGIC, tc.WIRE_VERSION, fp) +
                              codecs[i].encode(grads[i], m).tobytes())
                thc_manifest[i].append(f"{key} {cmd_push} {cmd_push} {cap} {p}")
                r = work / f"raw_{raw_key}_{i}.bin"
                r.write_bytes(grads[i].tobytes())
                raw_manifest[i].append(f"{raw_key} {cmd_push} {cmd_push} {4 * d} {r}")
        manifests = {}
        for name, man in (("thc", thc_manifest), ("float32", raw_manifest)):
            manifests[name] = []
            for i in range(n):
                f = work / f"manifest_{name}_{i}.txt"
                f.write_text("\n".join(man[i]) + "\n")
                manifests[name].append(f)
        results = [run_phase(cluster, "THC", thc_keys, manifests["thc"], args.rounds, args.warmup),
                   run_phase(cluster, "float32", raw_keys, manifests["float32"], args.rounds,
                             args.warmup)]
        assert cluster.server_alive(), "the server died"
        errors = [line for line in cluster.server_text().splitlines()
                  if "THC key" in line and " registered: " not in line]
        assert not errors, "the server logged THC errors:\n" + "\n".join(errors[:5])
    finally:
        cluster.close()

    print(f"{'':10s} {'rounds/s':>9s} {'up MB/round':>12s} {'down MB/round':>14s} "
          f"{'wire MB/round':>14s} {'server CPU ms/round':>20s}")
    for r in results:
        print(f"{r['name']:10s} {r['rounds_per_s']:9.2f} {r['up'] / 1e6:12.1f} "
              f"{r['down'] / 1e6:14.1f} "
              f"{(r['up'] + r['down']) / 1e6:14.1f} {r['cpu_ms']:20.1f}")
    t, f = results
    print(f"THC / float32: bytes on the wire {(t['up'] + t['down']) / (f['up'] + f['down']):.3f}, "
          f"rounds/s {t['rounds_per_s'] / f['rounds_per_s']:.2f}x, "
          f"server CPU {t['cpu_ms'] / f['cpu_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
