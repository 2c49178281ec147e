"""When does compression pay? A step-time model of BytePS training with THC and the alternatives.

    python -m byteps_thc.advise --model-bytes 102M --bandwidth 10 --compute-ms 174 --workers 8
    python -m byteps_thc.advise --model resnet50 --bandwidth 1,10,25 --compute-ms 174

    from byteps_thc.advise import Scenario, predict, host_costs
    preds = predict(Scenario(tensors=model_tensors("resnet50"), bandwidth_gbit=10, compute_s=0.174,
                             workers=8), costs=host_costs())

The model (one step of synchronous data-parallel training through one parameter server):

1. BytePS cuts every gradient into partitions of BYTEPS_PARTITION_BYTES; tensors smaller than
   BYTEPS_MIN_COMPRESS_BYTES travel as float32 whatever the compressor.
2. Bytes per partition, up (worker -> server) and down (server -> worker):
   - none: 32 bits a coordinate each way; fp16: 16 each way (a cast in the framework, summed in
     fp16 by the server);
   - thc: b bits up (the partition padded to its rotation block) and the integer sums down, in a
     lane of 8/16/32 bits wide enough for n*g: the server adds table values, nothing else;
   - onebit/topk/randomk/dithering (BytePS's registry compressors): the server decompresses every
     push, sums floats and recompresses the sum, so the way down is compressed by the same
     compressor: onebit 1 bit + a scale, topk/randomk k (index, value) pairs of 4+4 bytes,
     dithering its Elias-delta stream (size estimated on Gaussian data).
3. The network: the server's link carries n times what one worker sends and n times what one
   worker receives; it is the bottleneck. Up and down overlap across partitions (pull of one
   partition while later ones are pushed), so
       t_net = max(n*up, n*down) / B + n*(up_p + down_p) / B          (B: usable bytes/s)
   where the second term is the pipeline's fill and drain (the largest partition p).
4. CPU: per worker encode + decode (and the two plain copies of the CPU pipeline); on the server,
   per push the decompress-and-add (THC: table lookup and integer add) and per round the
   recompression. Partitions pipeline with the network, so
       t_cpu = max(worker, server)          (every process on its own machine), or
       t_cpu = max(worker', server', (n*worker' + server') / cores)   (all on one host of
   `cores`), where worker' and server' add the stack: what moving the bytes costs BytePS's
   queues, ps-lite, ZeroMQ and the kernel's TCP on both ends, per payload byte and per partition
   (stack_byte_w/s, stack_part_w/s), measured on a calibration cluster of the real stack
   (byteps_thc.stackcost); without a calibration, loopback TCP alone (`tcp_byte`, per byte)
   plus one partition's encode+decode as fill.
5. step = compute + max(t_net, t_cpu) + fills + 2 round trips (THC adds its norm round trip).

Costs per element (encode, decode, aggregate...) are measured on this host once (`host_costs`,
cached in ~/.cache/byteps_thc/advise-costs.json): THC through the real codec (byteps_thc._C),
float sums/casts with NumPy, BytePS's own compressors with NumPy stand-ins of the same work (their
C++ is not callable from Python). Then, where BytePS is installed, calibration clusters of the real
stack (`bpslaunch --local 2`, loopback, about two minutes; byteps_thc.stackcost) price the stack
(above) and, per compressor, what its real code costs beyond those figures (`<c>_xw` per element
on a worker, `<c>_xs` per element and push on the server: the real C++ of top-k, random-k,
dithering and 1-bit against their stand-ins, BytePS's THC stages against the codec timed alone;
measured at k=0.01, 8 levels, with error feedback, 2 workers). Tests inject costs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import sys
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

DEFAULT_PARTITION_BYTES = 4096000      # BytePS's BYTEPS_PARTITION_BYTES default
DEFAULT_MIN_COMPRESS_BYTES = 65536     # BytePS's BYTEPS_MIN_COMPRESS_BYTES default
DEFAULT_EFFICIENCY = 0.93              # TCP goodput / line rate (measured 0.95 at 1 Gbit/s, tbf)
COST_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "byteps_thc", "advise-costs.json")
COST_VERSION = 8

# ------------------------------------------------------------------------------------------------
# Models: the parameter (gradient) shapes, in the order the layers are defined.
# ------------------------------------------------------------------------------------------------


def _resnet50_shapes() -> List[Tuple[int, ...]]:
    s: List[Tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]       # conv1, bn1 weight/bias
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            s += [(planes, inplanes, 1, 1), (planes,), (planes,),
                  (planes, planes, 3, 3), (planes,), (planes,),
                  (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:  # projection shortcut
                s += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    s += [(1000, 2048), (1000,)]
    return s


def _vgg16_shapes() -> List[Tuple[int, ...]]:
    s: List[Tuple[int, ...]] = []
    cin = 3
    for cout in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        s += [(cout, cin, 3, 3), (cout,)]
        cin = cout
    s += [(4096, 512 * 7 * 7), (4096,), (4096, 4096), (4096,), (1000, 4096), (1000,)]
    return s


def _bert_base_shapes() -> List[Tuple[int, ...]]:
    h, ff, vocab, pos, types, layers = 768, 3072, 30522, 512, 2, 12
    s: List[Tuple[int, ...]] = [(vocab, h), (pos, h), (types, h), (h,), (h,)]   # embeddings + LN
    for _ in range(layers):
        s += [(h, h), (h,)] * 4                       # query, key, value, attention output
        s += [(h,), (h,)]                             # attention LayerNorm
        s += [(ff, h), (ff,), (h, ff), (h,)]          # intermediate, output
        s += [(h,), (h,)]                             # output LayerNorm
    s += [(h, h), (h,)]                               # pooler
    return s


# name -> (shapes function, published per-GPU step time in ms, samples per step, note)
MODELS = {
    "resnet50": (_resnet50_shapes, 174.0, 64,
                 "ResNet-50 v1.5, batch 64: 367 img/s on one V100 16GB, FP32 (NVIDIA "
                 "DeepLearningExamples, PyTorch ResNet50 v1.5 README)"),
    "vgg16": (_vgg16_shapes, 140.0, 32,
              "VGG-16, batch 32: about 230 img/s on one V100, FP32 (approximate, of the order "
              "of the TensorFlow tf_cnn_benchmarks figures)"),
    "bert-base": (_bert_base_shapes, 160.0, 32,
                  "BERT-base, sequence 128, batch 32: about 200 sequences/s on one V100, FP32 "
                  "(approximate)"),
}
PARAM_COUNTS = {"resnet50": 25557032, "vgg16": 138357544, "bert-base": 109482240}


def model_shapes(name: str) -> List[Tuple[int, ...]]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name][0]()


def model_tensors(name: str) -> List[int]:
    """Element counts of the model's gradients (one per parameter tensor)."""
    return [math.prod(s) for s in model_shapes(name)]


# ------------------------------------------------------------------------------------------------
# Compressors
# ------------------------------------------------------------------------------------------------
REGISTRY_COMPRESSORS = ("onebit", "topk", "randomk", "dithering")
KNOWN = ("none", "fp16", "thc") + REGISTRY_COMPRESSORS


@dataclasses.dataclass(frozen=True)
class CompressorSpec:
    """One compressor as the benchmark runs it and the model prices it.

    name: none | fp16 | thc | onebit | topk | randomk | dithering
    k:    topk/randomk: fraction of a partition (< 1) or a count; dithering: levels s
    ef:   error feedback (BytePS's vanilla EF for the registry compressors; THC's own for thc)
    thc:  a ThcConfig for name == "thc" (None: the defaults)
    label: how it is shown ("thc", "thc-n8", "topk-0.01+ef", ...)
    """
    name: str
    k: Optional[float] = None
    ef: bool = False
    thc: Optional[object] = None
    label: str = ""

    def __post_init__(self):
        if self.name not in KNOWN:
            raise ValueError(f"unknown compressor {self.name!r}; known: {', '.join(KNOWN)}")
        if self.name in ("topk", "randomk", "dithering") and (self.k is None or self.k <= 0):
            raise ValueError(f"{self.name} needs k > 0")
        if not self.label:
            object.__setattr__(self, "label", self._default_label())

    def _default_label(self) -> str:
        if self.name in ("topk", "randomk", "dithering"):
            base = f"{self.name}-{self.k:g}"
        else:
            base = self.name
        return base + ("+ef" if self.ef and self.name in REGISTRY_COMPRESSORS else "")

    def thc_config(self):
        from .config import ThcConfig
        return self.thc if self.thc is not None else ThcConfig()


def parse_spec(text: str, workers: int = 2) -> CompressorSpec:
    """'none', 'fp16', 'thc', 'thc-n' (ThcConfig.for_workers(n)), 'onebit', 'onebit+ef',
    'topk-0.01', 'randomk-0.01+ef', 'dithering-8'."""
    t = text.strip().lower()
    ef = t.endswith("+ef")
    if ef:
        t = t[:-3]
    if t == "thc-n":
        from .config import ThcConfig
        return CompressorSpec("thc", thc=ThcConfig.for_workers(workers), label="thc-n")
    if t == "thc" or t == "thc-default":
        return CompressorSpec("thc", label="thc")
    name, _, k = t.partition("-")
    if name not in KNOWN:
        raise ValueError(f"unknown compressor {text!r}; known: {', '.join(KNOWN)}, thc-n")
    if name in ("topk", "randomk", "dithering"):
        if not k:
            raise ValueError(f"{name} needs a k: {name}-0.01 (fraction) or {name}-1000 (count)")
        return CompressorSpec(name, k=float(k), ef=ef)
    if k:
        raise ValueError(f"{name} takes no k ({text!r})")
    return CompressorSpec(name, ef=ef)


def partitions(tensors: Sequence[int], partition_bytes: int = DEFAULT_PARTITION_BYTES,
               min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES) -> List[Tuple[int, bool]]:
    """(elements, compressed?) of every partition BytePS makes of float32 tensors."""
    per = max(1, partition_bytes // 4)
    out = []
    for n in tensors:
        big = n * 4 >= min_compress_bytes
        full, rest = divmod(int(n), per)
        out += [(per, big)] * full
        if rest:
            out.append((rest, big))
    return out


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _elias_delta_bits(x):
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    n = np.floor(np.log2(x))
    return n + 2 * np.floor(np.log2(n + 1)) + 1


_DITHER_CACHE: Dict[int, float] = {}


def dithering_bits_per_element(levels: int) -> float:
    """Bits per coordinate of BytePS's dithering stream (linear levels, max normalisation) on
    Gaussian data: for every non-zero level, Elias-delta(gap) + sign + Elias-delta(level)."""
    levels = int(levels)
    if levels in _DITHER_CACHE:
        return _DITHER_CACHE[levels]
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 18)
    norm = np.abs(x) / np.abs(x).max() * levels
    q = np.floor(norm) + (rng.random(x.size) < (norm - np.floor(norm)))
    nz = np.flatnonzero(q)
    if nz.size == 0:
        bits = 64.0 / x.size
    else:
        gaps = np.diff(np.concatenate(([-1], nz)))
        bits = float(_elias_delta_bits(gaps).sum() + nz.size + _elias_delta_bits(q[nz]).sum())
    rate = (bits + 64) / x.size
    _DITHER_CACHE[levels] = rate
    return rate


def thc_padded(spec: CompressorSpec, elems: int) -> int:
    """Coordinates THC encodes for a partition of `elems`: padded to its rotation block (the
    partition's next power of two by default); the codec's work and bytes follow this length."""
    block = spec.thc_config().rotation_block
    p2 = _next_pow2(elems)
    return p2 if not block else math.ceil(elems / min(block, p2)) * min(block, p2)


def wire_bytes(spec: CompressorSpec, elems: int, compressed: bool, workers: int,
               dithering_rate: Optional[float] = None) -> Tuple[float, float]:
    """Payload bytes of one partition of `elems` float32 values: (one worker's push, its pull)."""
    if spec.name == "fp16":
        return 2.0 * elems, 2.0 * elems
    if not compressed or spec.name == "none":
        return 4.0 * elems, 4.0 * elems
    if spec.name == "thc":
        cfg = spec.thc_config()
        pad = thc_padded(spec, elems)
        up = math.ceil(pad * cfg.bits / 8)
        down = pad * cfg.lane_bits(workers) / 8
        return float(up), float(down)
    if spec.name == "onebit":
        b = math.ceil(elems / 32) * 4 + 4
        return float(b), float(b)
    if spec.name in ("topk", "randomk"):
        k = spec.k * elems if spec.k < 1 else spec.k
        k = max(1, min(int(k), elems // 2))
        return 8.0 * k, 8.0 * k
    if spec.name == "dithering":
        rate = dithering_rate if dithering_rate is not None else \
            dithering_bits_per_element(int(spec.k))
        b = math.ceil(elems * rate / 32) * 4 + 8
        return float(b), float(b)
    raise AssertionError(spec.name)


# ------------------------------------------------------------------------------------------------
# Per-element costs on this host
# ------------------------------------------------------------------------------------------------
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
# Measured with calibration clusters of the real stack (byteps_thc.stackcost.calibrate): what the
# per-element costs above leave out. Optional: without them (no BytePS here, injected costs) the
# model falls back to `tcp_byte` for the stack and to the per-element costs alone.
STACK_KEYS = (
    "stack_byte_w",  # one worker's CPU per payload byte it sends or receives (BytePS+ps-lite+TCP)
    "stack_byte_s",  # the server's CPU per payload byte through it
    "stack_part_w",  # one worker's CPU per partition it push_pulls
    "stack_part_s",  # the server's CPU per partition push
) + tuple(f"{c}_{r}" for c in ("fp16", "thc") + REGISTRY_COMPRESSORS for r in ("xw", "xs")) \
  + tuple(f"{c}_{r}" for c in KNOWN for r in ("lw", "ls"))
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
    import socket
    import threading
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


def measure_costs(elems: int = 1 << 20, repeats: int = 5, thc_config=None,
                  stack: bool = True, log=None) -> HostCosts:
    """Time each operation on `elems` elements (best of `repeats`); a few seconds. With `stack`
    and BytePS installed, then the calibration clusters of byteps_thc.stackcost (STACK_KEYS; about
    two minutes on a 2-core host; `log` gets a line per calibration run).

    Memory-bound operations (copies, sums, casts) are timed on 16x larger arrays so that they
    stream from memory as a model's gradients do, not from the cache."""
    costs = _measure_elem_costs(elems, repeats, thc_config)
    if not stack:
        return costs
    from . import stackcost
    why = stackcost.available()
    if why is None:
        try:
            costs.per_elem.update(stackcost.calibrate(costs, log=log))
            costs.source += "; stack: calibration clusters (bpslaunch --local 2, loopback)"
            return costs
        except (RuntimeError, OSError) as e:
            why = f"{type(e).__name__}: {e}"[:200]
    costs.source += f"; stack: loopback TCP only ({why})"
    return costs


def _measure_elem_costs(elems: int, repeats: int, thc_config) -> HostCosts:
    import numpy as np
    rng = np.random.default_rng(1)
    x = rng.standard_normal(elems).astype(np.float32)
    y = rng.standard_normal(elems).astype(np.float32)
    out = np.empty_like(x)
    c: Dict[str, float] = {}
    big = 16 * elems
    bx = np.ones(big, np.float32)
    by = np.ones(big, np.float32)
    c["copy"] = _best_of(lambda: np.copyto(by, bx), 3) / big
    c["add_f32"] = _best_of(lambda: np.add(by, bx, out=by), 3) / big
    try:  # the framework's cast is what runs (byteps_thc.torch's fp16 compressor)
        import torch
        tx = torch.from_numpy(bx)
        c["cast_f16"] = _best_of(lambda: tx.half(), 3) / big
    except ImportError:
        c["cast_f16"] = _best_of(lambda: bx.astype(np.float16), 3) / big
    # BytePS's server adds float16 with F16C (widen both, add, narrow): NumPy's float16 add is
    # emulated in software and ~30x dearer, which made fp16 look CPU-bound at every bandwidth
    c["add_f16"] = c["add_f32"] + 2 * c["cast_f16"]
    del bx, by
    c["tcp_byte"] = tcp_cost_per_byte()
    source = "numpy"
    try:
        from .codec import ThcAggregator, ThcCodec
        from .config import ThcConfig
        cfg = thc_config or ThcConfig()
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
    except Exception as e:  # noqa: BLE001 - no (working) extension: the NumPy reference, slower
        from . import reference
        from .config import ThcConfig
        cfg = thc_config or ThcConfig()
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
    return HostCosts(c, source + "; BytePS compressors: numpy stand-ins")


def _host_key() -> str:
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
    try:
        from .codec import active_isa
        isa = active_isa()
    except (ImportError, OSError):
        pass
    return f"{platform.machine()}|{cpu}|{os.cpu_count()}|{isa}|v{COST_VERSION}"


def host_costs(cache_path: Optional[str] = COST_CACHE, refresh: bool = False) -> HostCosts:
    """The costs of this host: from the cache when it was measured on the same kind of CPU."""
    key = _host_key()
    if cache_path and not refresh:
        try:
            with open(cache_path) as f:
                data = json.load(f)
            if data.get("host") == key and set(COST_KEYS) <= set(data["per_elem"]):
                return HostCosts(data["per_elem"], data.get("source", "cache") + " (cached)")
        except (OSError, ValueError, KeyError):
            pass
    def log(msg: str) -> None:  # progress on stderr: the first call on a host takes minutes
        print(f"byteps_thc.advise: {msg}", file=sys.stderr, flush=True)

    log("measuring this host's costs once (per-element timings, then calibration clusters of "
        f"the real stack: about 2-4 minutes); cached in {cache_path or 'nothing'}")
    costs = measure_costs(log=log)
    if cache_path and "reference" not in costs.source:  # never cache a stand-in for the codec
        try:
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
            with open(cache_path, "w") as f:
                json.dump({"host": key, "per_elem": costs.per_elem, "source": costs.source}, f,
                          indent=1)
        except OSError:
            pass
    return costs


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Scenario:
    """What is trained where.

    tensors:        element counts of the gradients (model_tensors("resnet50"), or one number)
    bandwidth_gbit: line rate of every link (each machine's NIC), Gbit/s
    compute_s:      forward + backward time of one step on one worker, seconds
    workers:        n; one server (BytePS's PS; `servers` spreads the server's traffic)
    efficiency:     usable fraction of the line rate (TCP goodput)
    cores:          None: every process has its own machine; an int: all processes share a host
                    with this many cores (the emulated benchmark)
    latency_s:      one-way latency of a link
    """
    tensors: Sequence[int]
    bandwidth_gbit: float
    compute_s: float
    workers: int = 2
    servers: int = 1
    efficiency: float = DEFAULT_EFFICIENCY
    cores: Optional[int] = None
    latency_s: float = 50e-6
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    worker_threads: int = 1      # BYTEPS_THREADPOOL_SIZE per worker (compression threads)

    def __post_init__(self):
        if self.bandwidth_gbit <= 0:
            raise ValueError("bandwidth_gbit must be positive")
        if self.compute_s < 0:
            raise ValueError("compute_s must be >= 0")
        if self.workers < 1 or self.servers < 1:
            raise ValueError("workers and servers must be >= 1")
        if not 0 < self.efficiency <= 1:
            raise ValueError("efficiency must lie in (0, 1]")


@dataclasses.dataclass
class Prediction:
    compressor: str
    step_s: float
    compute_s: float
    network_s: float        # the communication phase's network time (incl. fill)
    worker_cpu_s: float     # one worker's compression work per step
    server_cpu_s: float     # the server's work per step
    up_bytes: float         # one worker's push payload per step
    down_bytes: float       # one worker's pull payload per step
    wire_bytes_per_step: float   # payload over all links: n * (up + down)
    bound: str              # "network" or "cpu": what the communication phase waits for
    speedup: float = 1.0    # step time of "none" / this one

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cpu_costs(spec: CompressorSpec, elems: int, compressed: bool, n: int,
               costs: HostCosts) -> Tuple[float, float]:
    """(one worker's seconds, the server's seconds) for one partition."""
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


def _stack_extra(spec: CompressorSpec, elems: int, compressed: bool, n: int,
                 costs: HostCosts) -> Tuple[float, float]:
    """(one worker's, the server's) CPU for a partition beyond _cpu_costs, measured on the real
    stack (`<name>_xw`, `<name>_xs`; 0 without a calibration)."""
    if spec.name == "none" or (not compressed and spec.name != "fp16"):
        return 0.0, 0.0
    e = codec_elems(spec, elems, compressed)
    return (costs.get(f"{spec.name}_xw") * e, n * costs.get(f"{spec.name}_xs") * e)


def codec_elems(spec: CompressorSpec, elems: int, compressed: bool) -> int:
    """The elements a compressor's per-element costs apply to (THC: the padded length)."""
    return thc_padded(spec, elems) if spec.name == "thc" and compressed else elems


def predict_one(sc: Scenario, spec: CompressorSpec, costs: HostCosts) -> Prediction:
    n = sc.workers
    parts = partitions(sc.tensors, sc.partition_bytes, sc.min_compress_bytes)
    rate = None
    if spec.name == "dithering":
        rate = dithering_bits_per_element(int(spec.k))
    up = down = wcpu = scpu = 0.0
    fill_bytes = fill_cpu = 0.0
    for elems, comp in parts:
        u, d = wire_bytes(spec, elems, comp, n, rate)
        w, s = _cpu_costs(spec, elems, comp, n, costs)
        xw, xs = _stack_extra(spec, elems, comp, n, costs)
        w, s = max(0.0, w + xw), max(0.0, s + xs)     # the real code may beat its stand-in
        up, down, wcpu, scpu = up + u, down + d, wcpu + w, scpu + s
        fill_bytes = max(fill_bytes, u + d)
        fill_cpu = max(fill_cpu, w)
    large = sum(int(t) for t in sc.tensors if 4 * int(t) >= LARGE_TENSOR_BYTES)
    if large:   # calibrated: what a large tensor's elements cost beyond partition-sized ones
        wcpu = max(0.0, wcpu + costs.get(f"{spec.name}_lw") * large)
        scpu = max(0.0, scpu + n * costs.get(f"{spec.name}_ls") * large)
    bw = sc.bandwidth_gbit * 1e9 / 8 * sc.efficiency          # bytes/s of one link
    # the server's link (spread over `servers`) carries n workers' traffic each way
    net = max(n * up, n * down) / (bw * sc.servers) + n * fill_bytes / (bw * sc.servers)
    wcpu_t = wcpu / max(1, sc.worker_threads)
    scpu_t = scpu / sc.servers
    if sc.cores is None:
        cpu = max(wcpu_t, scpu_t)
    elif costs.has_stack:
        # one host: the workers, the server and everything that moves their bytes (BytePS's
        # queues, ps-lite, ZeroMQ, the kernel's TCP on both ends), measured per payload byte and
        # per partition on a calibration cluster of the real stack, share its cores
        wstack = (up + down) * costs["stack_byte_w"] + len(parts) * costs["stack_part_w"]
        sstack = n * ((up + down) * costs["stack_byte_s"] + len(parts) * costs["stack_part_s"])
        sstack /= sc.servers
        cpu = max(wcpu_t + wstack, scpu_t + sstack,
                  (n * (wcpu + wstack) + scpu + sstack * sc.servers) / sc.cores)
        wcpu_t, scpu_t = wcpu_t + wstack, scpu_t + sstack    # what each process's CPU shows
    else:  # one host: the workers, the server and the kernel's TCP work share its cores
        tcp = n * (up + down) * costs.per_elem.get("tcp_byte", 0.0)
        cpu = max(wcpu_t, scpu_t, (n * wcpu + scpu + tcp) / sc.cores)
    cpu += fill_cpu
    rtts = 2 if spec.name == "thc" and any(c for _, c in parts) else 1
    comm = max(net, cpu) + rtts * 2 * sc.latency_s
    step = sc.compute_s + comm
    return Prediction(spec.label, step, sc.compute_s, net, wcpu_t, scpu_t, up, down,
                      n * (up + down), "network" if net >= cpu else "cpu")


def predict(sc: Scenario, specs: Optional[Sequence[CompressorSpec]] = None,
            costs: Optional[HostCosts] = None) -> List[Prediction]:
    """Predictions for every compressor, fastest first; `speedup` is relative to `none`."""
    if specs is None:
        specs = default_specs(sc.workers)
    if costs is None:
        costs = host_costs()
    preds = [predict_one(sc, s, costs) for s in specs]
    base = predict_one(sc, CompressorSpec("none"), costs).step_s
    for p in preds:
        p.speedup = base / p.step_s
    return sorted(preds, key=lambda p: p.step_s)


def default_specs(workers: int) -> List[CompressorSpec]:
    return [parse_spec(s, workers) for s in
            ("none", "fp16", "thc", "thc-n", "onebit+ef", "topk-0.01+ef", "randomk-0.01+ef",
             "dithering-8")]


def recommend(preds: Sequence[Prediction]) -> str:
    """One sentence: the winner, by how much against none and the runner-up, and why."""
    best = min(preds, key=lambda p: p.step_s)
    others = [p for p in preds if p is not best]
    runner = min(others, key=lambda p: p.step_s) if others else None
    msg = (f"{best.compressor} wins: {best.step_s * 1e3:.0f} ms/step, "
           f"{best.speedup:.2f}x the uncompressed step rate")
    if runner is not None:
        msg += f", {runner.step_s / best.step_s:.2f}x ahead of {runner.compressor}"
    if best.compressor == "none":
        msg += " (the network is fast enough: compression would only add CPU work)"
    else:
        msg += f" (communication is {best.bound}-bound)"
    return msg + "."


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1024, "mi": 1 << 20, "gi": 1 << 30}


def parse_bytes(text: str) -> int:
    """'102M', '97.5MiB', '25e6', '4096000' -> bytes (K/M/G are powers of 1000, Ki/Mi/Gi of 1024)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmg]i?)?b?\s*", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 102M, 97.5MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def format_table(preds: Sequence[Prediction]) -> str:
    rows = [f"{'compressor':<16}{'step ms':>9}{'speedup':>9}{'net ms':>8}{'cpu w/s ms':>12}"
            f"{'MB up':>8}{'MB down':>9}  bound"]
    for p in preds:
        rows.append(f"{p.compressor:<16}{p.step_s * 1e3:>9.1f}{p.speedup:>8.2f}x"
                    f"{p.network_s * 1e3:>8.1f}{p.worker_cpu_s * 1e3:>6.0f}/{p.server_cpu_s * 1e3:<5.0f}"
                    f"{p.up_bytes / 1e6:>8.2f}{p.down_bytes / 1e6:>9.2f}  {p.bound}")
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m byteps_thc.advise",
        description="Predict the step time of BytePS training per compressor and say which wins.",
        epilog="Models: " + "; ".join(f"{k}: {v[3]}" for k, v in MODELS.items()))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--model-bytes", type=parse_bytes, metavar="BYTES",
                   help="float32 gradient bytes per step, e.g. 102M (all in large tensors)")
    g.add_argument("--model", choices=sorted(MODELS), help="a known model's real tensor shapes")
    ap.add_argument("--bandwidth", required=True, metavar="GBIT",
                    help="line rate of each machine's link, Gbit/s (comma-separated for several)")
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="forward+backward time per step (default: the model's published figure)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                    help=f"usable fraction of the line rate ({DEFAULT_EFFICIENCY})")
    ap.add_argument("--shared-host-cores", type=int, default=None, metavar="C",
                    help="all processes share one host of C cores (an emulated cluster)")
    ap.add_argument("--compressors", default=None,
                    help="comma-separated, e.g. none,fp16,thc,thc-n,onebit+ef,topk-0.01+ef")
    ap.add_argument("--refresh-costs", action="store_true", help="re-measure this host's costs")
    ap.add_argument("--costs", metavar="PATH", default=None,
                    help="per-element costs from this JSON file (the cache's format) instead of "
                         "this host's")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    if a.model:
        tensors = model_tensors(a.model)
        compute_ms = a.compute_ms if a.compute_ms is not None else MODELS[a.model][1]
    else:
        tensors = [max(1, a.model_bytes // 4)]
        if a.compute_ms is None:
            ap.error("--compute-ms is needed with --model-bytes")
        compute_ms = a.compute_ms
    specs = (default_specs(a.workers) if a.compressors is None else
             [parse_spec(s, a.workers) for s in a.compressors.split(",") if s.strip()])
    costs = load_costs(a.costs) if a.costs else host_costs(refresh=a.refresh_costs)
    out = []
    for bw in [float(b) for b in str(a.bandwidth).split(",")]:
        sc = Scenario(tensors, bw, compute_ms / 1e3, a.workers, a.servers, a.efficiency,
                      a.shared_host_cores)
        preds = predict(sc, specs, costs)
        if a.json:
            out.append({"bandwidth_gbit": bw, "predictions": [p.as_dict() for p in preds],
                        "advice": recommend(preds)})
            continue
        print(f"\n{sum(tensors) * 4 / 1e6:.1f} MB of gradients, {a.workers} workers, {bw:g} Gbit/s, "
              f"compute {compute_ms:g} ms")
        print(format_table(preds))
        print(recommend(preds))
    if a.json:
        print(json.dumps({"costs_source": costs.source, "runs": out}, indent=1))
    else:
        print(f"\n(costs per element measured on this host: {costs.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
