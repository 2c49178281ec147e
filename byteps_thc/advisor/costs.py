"""What compression work costs on this host, per float32 element, and what a partition costs.

Costs per element (encode, decode, aggregate...) are measured once per host
(`measure_elem_costs`): THC through the real codec (byteps_thc._C), float sums/casts with NumPy,
BytePS's own compressors with NumPy stand-ins of the same work (their C++ is not callable from
Python). The calibration clusters of the real stack (byteps_thc.advisor.calibrate) add
`STACK_KEYS`: what moving the bytes costs BytePS's queues, ps-lite, ZeroMQ and the kernel's TCP,
and what each compressor's real code costs beyond its stand-in. `partition_cpu` turns them into
one partition's CPU seconds on a worker and on the server. Tests inject costs (`HostCosts`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import threading
import time
from typing import Dict, Optional, Tuple

import numpy as np

from ..thc import ThcConfig, reference
from .wire import (
    REGISTRY_COMPRESSORS,
    CompressorSpec,
    lhc_nonzeros,
    lhc_payload_bytes,
    thc_padded,
)

# The cache of this host's costs (byteps_thc.advisor.host.host_costs); a file measured by another
# version of the model (COST_VERSION) or on another kind of CPU (host_key) is measured anew.
COST_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "byteps_thc", "advise-costs.json")
COST_VERSION = 9

# Every cost is seconds per float32 element of a partition (per push where it says so).
COST_KEYS = (
    "copy",          # one plain copy of the CPU worker pipeline (two per step; none for THC)
    "add_f32",       # the server adds one float32 push into the sum
    "cast_f16",      # the framework casts to or from float16 (each way)
    "add_f16",       # the server adds one float16 push
    "thc_encode",    # norm + rotate + quantise + pack (+ error feedback)
    "thc_decode",    # unpack sums + inverse rotation
    "thc_add",       # the server adds one THC payload (lookup + integer add)
    "onebit_c", "onebit_d",
    "topk_c", "randomk_c", "sparse_d",     # sparse_d: scatter k pairs into a zeroed partition
    "dither_c", "dither_d",
    "tcp_byte",      # kernel TCP send + receive per payload byte (only when processes share a host)
)
# LHC's codec, timed alone (measure_lhc_costs). Optional, so that costs files of before LHC still
# load: without them the advisor prices no LHC (partition_cpu says so).
LHC_KEYS = (
    "lhc_enc",       # encode, per element of the partition (max_abs and bitmap scans)
    "lhc_enc_nz",    # encode, per encoded nonzero (quantise, three bucket updates)
    "lhc_topk",      # exact top-k with error feedback, per element (beyond lhc_enc)
    "lhc_dec",       # decode, per element (the dense output)
    "lhc_dec_nz",    # decode, per index of the summed support (peeling)
    "lhc_add",       # the server ORs and adds one payload: per payload byte
)
# Measured with calibration clusters of the real stack (byteps_thc.advisor.calibrate): what the
# per-element costs above leave out. Optional: without them (no BytePS here, injected costs) the
# model falls back to `tcp_byte` for the stack and to the per-element costs alone.
STACK_KEYS = (
    "stack_byte_w",  # one worker's CPU per payload byte it sends or receives (BytePS+ps-lite+TCP)
    "stack_byte_s",  # the server's CPU per payload byte through it
    "stack_part_w",  # one worker's CPU per partition it push_pulls
    "stack_part_s",  # the server's CPU per partition push
) + tuple(f"{c}_{r}" for c in ("fp16", "thc") + REGISTRY_COMPRESSORS for r in ("xw", "xs")) \
  + tuple(f"{c}_{r}" for c in ("none", "fp16", "thc") + REGISTRY_COMPRESSORS
          for r in ("lw", "ls"))
# lhc_xw/lhc_xs/lhc_lw/lhc_ls are what a calibration with LHC adds; they are left out of
# STACK_KEYS so that calibrations of before LHC still count as complete (0 where absent)
#   <c>_xw / <c>_xs: per compressed element, one worker's / the server's per push CPU beyond the
#   per-element costs and the stack (the real code against its stand-in or its timing alone)
#   <c>_lw / <c>_ls: the same per element of a tensor of at least LARGE_TENSOR_BYTES, beyond
#   what its elements cost in partition-sized tensors
# glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): a buffer this large is
# mapped afresh, and its pages faulted in, every time one is allocated (the framework's fp16 cast,
# BytePS's per-tensor buffers), where smaller ones are reused from the heap
LARGE_TENSOR_BYTES = 32 << 20


@dataclasses.dataclass
class HostCosts:
    per_elem: Dict[str, float]
    source: str = "injected"

    def __getitem__(self, key: str) -> float:
        return self.per_elem[key]

    def get(self, key: str, default: float = 0.0) -> float:
        return self.per_elem.get(key, default)

    @property
    def has_lhc(self) -> bool:
        return all(k in self.per_elem for k in LHC_KEYS)

    @property
    def has_stack(self) -> bool:
        return all(k in self.per_elem for k in STACK_KEYS)


def load_costs(path: str) -> HostCosts:
    """Costs from a JSON file in the cache's format ({"per_elem": {...}, "source": ...}), e.g. a
    copy of ~/.cache/byteps_thc/advise-costs.json from another host or another time."""
    with open(path) as f:
        data = json.load(f)
    per = data["per_elem"] if "per_elem" in data else data
    missing = [k for k in COST_KEYS if k not in per]
    if missing:
        raise ValueError(f"{path}: costs without {', '.join(missing)}")
    return HostCosts({k: float(v) for k, v in per.items()},
                     f"{data.get('source', 'file')} (from {path})")


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def tcp_cost_per_byte(nbytes: int = 64 << 20) -> float:
    """CPU seconds (both ends, kernel and user) per byte sent through loopback TCP."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = [0]

    def sink():
        c, _ = srv.accept()
        buf = bytearray(1 << 20)
        while True:
            k = c.recv_into(buf)
            if not k:
                break
            got[0] += k
        c.close()
    t = threading.Thread(target=sink)
    t.start()
    cli = socket.create_connection(srv.getsockname())
    chunk = b"\0" * (4 << 20)
    c0 = os.times()
    sent = 0
    while sent < nbytes:
        cli.sendall(chunk)
        sent += len(chunk)
    cli.close()
    t.join()
    c1 = os.times()
    srv.close()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return cpu / max(1, got[0])


def _memory_costs(elems: int) -> Dict[str, float]:
    """copy, add_f32, cast_f16, add_f16 per element, on arrays of `elems` (freed on return)."""
    c: Dict[str, float] = {}
    bx = np.ones(elems, np.float32)
    by = np.ones(elems, np.float32)
    c["copy"] = _best_of(lambda: np.copyto(by, bx), 3) / elems
    c["add_f32"] = _best_of(lambda: np.add(by, bx, out=by), 3) / elems
    try:  # the framework's cast is what runs (byteps_thc.torch's fp16 compressor); optional
        import torch
        tx = torch.from_numpy(bx)
        c["cast_f16"] = _best_of(lambda: tx.half(), 3) / elems
    except ImportError:
        c["cast_f16"] = _best_of(lambda: bx.astype(np.float16), 3) / elems
    # BytePS's server adds float16 with F16C (widen both, add, narrow): NumPy's float16 add is
    # emulated in software and ~30x dearer, which made fp16 look CPU-bound at every bandwidth
    c["add_f16"] = c["add_f32"] + 2 * c["cast_f16"]
    return c


def measure_elem_costs(elems: int = 1 << 20, repeats: int = 5,
                       thc_config: Optional[ThcConfig] = None) -> HostCosts:
    """Time each operation on `elems` elements (best of `repeats`); a few seconds.

    Memory-bound operations (copies, sums, casts) are timed on 16x larger arrays so that they
    stream from memory as a model's gradients do, not from the cache."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(elems).astype(np.float32)
    out = np.empty_like(x)
    c = _memory_costs(16 * elems)
    c["tcp_byte"] = tcp_cost_per_byte()
    source = "numpy"
    cfg = thc_config or ThcConfig()
    try:  # the codec needs the compiled extension (make ext); without it, the NumPy reference
        from ..thc.codec import ThcAggregator, ThcCodec
        codec = ThcCodec(cfg, elems, rank=0)
        agg = ThcAggregator(cfg, elems, 2)
        m = codec.norm(x)
        payload = codec.encode(x, m)

        def enc():
            codec.encode(x, codec.norm(x))

        def add():
            agg.reset()
            agg.add(payload)
        add()
        agg.add(payload)
        sums = agg.result()
        c["thc_encode"] = _best_of(enc, repeats) / elems
        c["thc_add"] = _best_of(add, repeats) / elems
        c["thc_decode"] = _best_of(lambda: codec.decode(sums, m, 2), repeats) / elems
        source += "+thc codec"
    except Exception as e:  # no (working) extension: the NumPy reference, slower
        n_small = min(elems, 1 << 16)
        xs = x[:n_small]
        pay, _ = reference.encode(cfg, xs, float(np.linalg.norm(xs)), 0, 0)[:2]
        c["thc_encode"] = _best_of(lambda: reference.encode(cfg, xs, 1.0, 0, 0), 1) / n_small
        s = reference.aggregate(cfg, [pay], n_small, 1)
        c["thc_add"] = _best_of(lambda: reference.aggregate(cfg, [pay], n_small, 1), 1) / n_small
        c["thc_decode"] = _best_of(lambda: reference.decode(cfg, s, n_small, 1, 1.0), 1) / n_small
        source += f"+thc NumPy reference (codec unavailable: {type(e).__name__}: {e}"[:160] + ")"
    # BytePS's own compressors: NumPy stand-ins doing the same passes over the data.
    k = max(1, elems // 100)
    scale = np.float32(np.abs(x).mean())
    bits = np.packbits(x < 0)

    def onebit_c():
        np.abs(x).mean()
        np.packbits(x < 0)

    def onebit_d():
        np.multiply(1 - 2 * np.unpackbits(bits)[:elems].astype(np.float32), scale, out=out)

    idx = rng.choice(elems, k, replace=False)
    vals = x[idx]

    thr = float(np.partition(np.abs(x), elems - k)[elems - k])

    def topk_c():
        # BytePS's top-k keeps a k-heap and compares each |x| with its top once; on gradient-like
        # data the heap changes only ~k*ln(n/k) times, so the cost is one pass that compares
        # magnitudes and gathers k pairs (an argpartition of the whole partition, 5-10x dearer,
        # made the advisor predict top-k 75% slower than measured)
        i = np.flatnonzero(np.abs(x) > thr)
        x[i]

    def randomk_c():
        i = rng.integers(0, elems, k)
        x[i]

    def sparse_d():
        out.fill(0)
        out[idx] = vals

    def dither_c():
        a = np.abs(x) * (8 / np.abs(x).max())
        f = np.floor(a)
        q = f + (rng.random(elems, dtype=np.float32) < a - f)
        np.flatnonzero(q)

    def dither_d():
        out.fill(0)
        out[idx] = vals
        np.multiply(out, scale, out=out)

    c["onebit_c"] = _best_of(onebit_c, repeats) / elems
    c["onebit_d"] = _best_of(onebit_d, repeats) / elems
    c["topk_c"] = _best_of(topk_c, repeats) / elems
    c["randomk_c"] = _best_of(randomk_c, repeats) / elems
    c["sparse_d"] = _best_of(sparse_d, repeats) / elems
    c["dither_c"] = _best_of(dither_c, repeats) / elems
    c["dither_d"] = _best_of(dither_d, repeats) / elems
    try:
        c.update(measure_lhc_costs(repeats=repeats))
        source += "+lhc codec"
    except (ImportError, RuntimeError) as e:   # no LHC core: the advisor prices no LHC
        source += f"; no LHC costs ({e})"[:120]
    return HostCosts(c, source + "; BytePS compressors: numpy stand-ins")


LHC_PARTITION = 1024000          # one BytePS partition (BYTEPS_PARTITION_BYTES / 4)


def measure_lhc_costs(elems: int = LHC_PARTITION, repeats: int = 5) -> Dict[str, float]:
    """LHC_KEYS, timed on the real codec (LhcCodec/LhcAggregator, 2 workers) at two densities,
    0.1% and 2%: each of encode and decode is a + b * count, solved from the two."""
    from ..lhc import LhcConfig
    from ..lhc.codec import LhcAggregator, LhcCodec, backend
    if backend() != "core":
        raise RuntimeError("LHC's C++ core is not built (make ext): the reference's times would "
                           "price a codec BytePS does not run")
    rng = np.random.default_rng(3)
    rows = []
    for rho in (0.001, 0.02):
        xs = []
        for r in range(2):
            x = np.zeros(elems, np.float32)
            idx = rng.choice(elems, int(rho * elems), replace=False)
            x[idx] = rng.standard_normal(idx.size).astype(np.float32)
            xs.append(x)
        union = int(np.count_nonzero(xs[0] != 0) + np.count_nonzero(xs[1] != 0)
                    - np.count_nonzero((xs[0] != 0) & (xs[1] != 0)))
        cfg = LhcConfig(capacity=union)
        codecs = [LhcCodec(cfg, elems, rank=r) for r in range(2)]
        m = max(c.max_abs(x) for c, x in zip(codecs, xs))
        pays = [c.encode(x, m, num_workers=2) for c, x in zip(codecs, xs)]
        agg = LhcAggregator(cfg, elems, num_workers=2)

        def add():
            agg.reset()
            agg.add(pays[0])
        t_add = _best_of(add, repeats)
        agg.reset()
        for p in pays:
            agg.add(p)
        total = agg.result()
        t_enc = _best_of(lambda: codecs[0].encode(xs[0], m, num_workers=2), repeats)
        t_dec = _best_of(lambda: codecs[0].decode(total, m, num_workers=2), repeats)
        rows.append((np.count_nonzero(xs[0]), union, t_enc, t_dec, t_add / pays[0].size))
    (k1, u1, e1, d1, a1), (k2, u2, e2, d2, a2) = rows
    c = {"lhc_enc_nz": max(0.0, (e2 - e1) / (k2 - k1)),
         "lhc_dec_nz": max(0.0, (d2 - d1) / (u2 - u1))}
    c["lhc_enc"] = max(0.0, e1 - c["lhc_enc_nz"] * k1) / elems
    c["lhc_dec"] = max(0.0, d1 - c["lhc_dec_nz"] * u1) / elems
    c["lhc_add"] = min(a1, a2)
    dense = rng.standard_normal(elems).astype(np.float32)
    cfg = LhcConfig(capacity=2 * LhcConfig(topk=0.01).keep(elems), topk=0.01)
    codec = LhcCodec(cfg, elems, rank=0)
    t_top = _best_of(lambda: codec.encode(dense, codec.max_abs(dense), num_workers=2), repeats)
    k = cfg.keep(elems)
    c["lhc_topk"] = max(0.0, t_top - c["lhc_enc_nz"] * k) / elems - c["lhc_enc"]
    return c


def host_key() -> str:
    """The kind of host costs were measured on: a cached file of another kind is not used."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    isa = ""
    try:  # the extension is optional here (see measure_elem_costs)
        from ..thc.codec import active_isa
        isa = active_isa()
    except (ImportError, OSError):
        pass
    return f"{platform.machine()}|{cpu}|{os.cpu_count()}|{isa}|v{COST_VERSION}"


def partition_cpu(spec: CompressorSpec, elems: int, compressed: bool, n: int,
                  costs: HostCosts, density: float = 1.0,
                  union: Optional[float] = None) -> Tuple[float, float]:
    """(one worker's seconds, the server's seconds) for one partition of `elems` float32 values
    compressed (or not) by `spec` among `n` workers: the per-element costs alone, without the
    stack (STACK_KEYS). `density`, `union`: the nonzero fraction of one worker's gradient and of
    the sum (LHC's work follows them; wire.lhc_nonzeros)."""
    if spec.name == "lhc" and compressed:
        missing = [k for k in LHC_KEYS if k not in costs.per_elem]
        if missing:
            raise ValueError(f"costs ({costs.source}) without LHC's {', '.join(missing)}: "
                             "measure them (python -m byteps_thc.advisor --refresh-costs) or "
                             "leave lhc out of the compressors")
        cfg = spec.lhc_config()
        mine, total = lhc_nonzeros(spec, elems, density, n, union)
        w = (costs["lhc_enc"] + costs["lhc_dec"]) * elems + costs["lhc_enc_nz"] * mine \
            + costs["lhc_dec_nz"] * total
        if cfg.topk is not None:
            w += costs["lhc_topk"] * elems
        # no host copies: LHC takes THC's zero-copy stages on a CPU-only worker
        return w, n * costs["lhc_add"] * lhc_payload_bytes(cfg, elems)
    if spec.name == "thc" and compressed:
        # the codec transforms, quantises and sums the padded partition; no copies (patch 0043:
        # it reads the input tensor and decodes into the output)
        pad = thc_padded(spec, elems)
        return (costs["thc_encode"] + costs["thc_decode"]) * pad, n * costs["thc_add"] * pad
    w = 2 * costs["copy"] * elems                     # the CPU pipeline's two copies
    if spec.name == "fp16":
        return w + 2 * costs["cast_f16"] * elems, n * costs["add_f16"] * elems
    if not compressed or spec.name == "none":
        return w, n * costs["add_f32"] * elems
    comp = {"onebit": "onebit_c", "topk": "topk_c", "randomk": "randomk_c",
            "dithering": "dither_c"}[spec.name]
    decomp = {"onebit": "onebit_d", "dithering": "dither_d"}.get(spec.name, "sparse_d")
    ef = (costs[decomp] + costs["add_f32"]) if spec.ef else 0.0   # residual update
    worker = w + (costs[comp] + costs[decomp] + ef) * elems
    server = (n * (costs[decomp] + costs["add_f32"]) + costs[comp]) * elems
    return worker, server


