"""The step-time model: one step of synchronous data-parallel training through one parameter
server, per compressor, given the bytes (byteps_thc.advisor.wire) and costs (.costs).

1. The network: the server's link carries n times what one worker sends and n times what one
   worker receives; it is the bottleneck. Up and down overlap across partitions (pull of one
   partition while later ones are pushed), so
       t_net = max(n*up, n*down) / B + n*(up_p + down_p) / B          (B: usable bytes/s)
   where the second term is the pipeline's fill and drain (the largest partition p).
2. CPU: per worker encode + decode (and the two plain copies of the CPU pipeline); on the server,
   per push the decompress-and-add (THC: table lookup and integer add) and per round the
   recompression. Partitions pipeline with the network, so
       t_cpu = max(worker, server)          (every process on its own machine), or
       t_cpu = max(worker', server', (n*worker' + server') / cores)   (all on one host of
   `cores`), where worker' and server' add the stack: what moving the bytes costs BytePS's
   queues, ps-lite, ZeroMQ and the kernel's TCP on both ends, per payload byte and per partition
   (stack_byte_w/s, stack_part_w/s), measured on a calibration cluster of the real stack
   (byteps_thc.advisor.calibrate); without a calibration, loopback TCP alone (`tcp_byte`, per
   byte) plus one partition's encode+decode as fill.
3. step = compute + max(t_net, t_cpu) + fills + 2 round trips (THC adds its norm round trip).
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

from .. import env
from ..lhc import LhcConfig
from .costs import LARGE_TENSOR_BYTES, HostCosts, partition_cpu
from .wire import (
    CompressorSpec,
    codec_elems,
    dithering_bits_per_element,
    lhc_fallback_indices,
    lhc_nonzeros,
    parse_spec,
    partitions_with_density,
    wire_bytes,
)

# plain `lhc` is sized for this many times the largest expected summed support of a partition:
# a partition's support varies around its expectation (for the ncf tables, by about 1/sqrt of its
# rows touched), and a sketch at LhcConfig's design load 0.75 for 1.25x the mean still peels a
# support 1.33x the mean (load 1.0 * 0.8185 / 0.75)
LHC_CAPACITY_MARGIN = 1.25

DEFAULT_EFFICIENCY = 0.93              # TCP goodput / line rate (measured 0.95 at 1 Gbit/s, tbf)


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
    density:        per tensor, the nonzero fraction of one worker's gradient (None: all dense);
                    LHC's bytes and work follow it (models.densities for a known model)
    union_density:  per tensor, that of the workers' summed gradient (None: independent
                    supports, 1 - (1 - density)^n)
    """
    tensors: Sequence[int]
    bandwidth_gbit: float
    compute_s: float
    workers: int = 2
    servers: int = 1
    efficiency: float = DEFAULT_EFFICIENCY
    cores: Optional[int] = None
    latency_s: float = 50e-6
    partition_bytes: int = env.PARTITION_BYTES.default
    min_compress_bytes: int = env.MIN_COMPRESS_BYTES.default
    worker_threads: int = 1      # BYTEPS_THREADPOOL_SIZE per worker (compression threads)
    density: Optional[Sequence[float]] = None
    union_density: Optional[Sequence[float]] = None

    def __post_init__(self):
        for name in ("density", "union_density"):
            v = getattr(self, name)
            if v is None:
                continue
            if len(v) != len(self.tensors):
                raise ValueError(f"{name}: {len(v)} values for {len(self.tensors)} tensors "
                                 "(one per tensor)")
            bad = [x for x in v if not 0.0 <= float(x) <= 1.0]
            if bad:
                raise ValueError(f"{name} {bad[0]!r} must lie in [0, 1] (the fraction of a "
                                 "gradient's values that are nonzero)")
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




def _stack_extra(spec: CompressorSpec, elems: int, compressed: bool, n: int,
                 costs: HostCosts) -> Tuple[float, float]:
    """(one worker's, the server's) CPU for a partition beyond partition_cpu, measured on the real
    stack (`<name>_xw`, `<name>_xs`; 0 without a calibration)."""
    if spec.name == "none" or (not compressed and spec.name != "fp16"):
        return 0.0, 0.0
    e = codec_elems(spec, elems, compressed)
    return (costs.get(f"{spec.name}_xw") * e, n * costs.get(f"{spec.name}_xs") * e)




def size_lhc(sc: Scenario, spec: CompressorSpec) -> CompressorSpec:
    """Plain `lhc` (no capacity given) sized for the scenario: the capacity
    LHC_CAPACITY_MARGIN times the largest expected summed support of a compressed partition,
    rounded up to a multiple of 1024 (what `--lhc-capacity` should be); any other spec as it is."""
    if spec.name != "lhc" or spec.lhc is not None:
        return spec
    parts = partitions_with_density(sc.tensors, sc.density, sc.union_density,
                                    sc.partition_bytes, sc.min_compress_bytes)
    bare = CompressorSpec("lhc", lhc=LhcConfig(capacity=1))
    need = max([lhc_nonzeros(bare, e, rho, sc.workers, rho_u)[1]
                for e, c, rho, rho_u in parts if c] or [1.0])
    cap = max(1024, 1024 * math.ceil(LHC_CAPACITY_MARGIN * need / 1024))
    return CompressorSpec("lhc", lhc=LhcConfig(capacity=cap), label=f"lhc-c{cap}")


def predict_one(sc: Scenario, spec: CompressorSpec, costs: HostCosts) -> Prediction:
    n = sc.workers
    spec = size_lhc(sc, spec)
    parts = partitions_with_density(sc.tensors, sc.density, sc.union_density,
                                    sc.partition_bytes, sc.min_compress_bytes)
    rate = None
    if spec.name == "dithering":
        rate = dithering_bits_per_element(int(spec.k))
    up = down = wcpu = scpu = 0.0
    fill_bytes = fill_cpu = 0.0
    fallback = False
    for elems, comp, rho, rho_u in parts:
        u, d = wire_bytes(spec, elems, comp, n, rate, rho, rho_u)
        w, s = partition_cpu(spec, elems, comp, n, costs, rho, rho_u)
        if spec.name == "lhc" and comp:
            fallback |= lhc_fallback_indices(
                spec, elems, lhc_nonzeros(spec, elems, rho, n, rho_u)[1]) > 0
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
    # THC and LHC add the max round's round trip; LHC's exact fallback one more
    rtts = 2 if spec.name in ("thc", "lhc") and any(p[1] for p in parts) else 1
    rtts += 1 if fallback else 0
    comm = max(net, cpu) + rtts * 2 * sc.latency_s
    step = sc.compute_s + comm
    return Prediction(spec.label, step, sc.compute_s, net, wcpu_t, scpu_t, up, down,
                      n * (up + down), "network" if net >= cpu else "cpu")


def predict(sc: Scenario, specs: Optional[Sequence[CompressorSpec]],
            costs: HostCosts) -> List[Prediction]:
    """Predictions for every compressor of `specs` (None: default_specs, without LHC where the
    costs have none), fastest first;
    `speedup` is relative to `none`. `costs`: e.g. byteps_thc.advisor.host.host_costs()."""
    if specs is None:   # costs measured before LHC price no LHC (asked for, it raises)
        specs = [s for s in default_specs(sc.workers) if s.name != "lhc" or costs.has_lhc]
    preds = [predict_one(sc, s, costs) for s in specs]
    base = predict_one(sc, CompressorSpec("none"), costs).step_s
    for p in preds:
        p.speedup = base / p.step_s
    return sorted(preds, key=lambda p: p.step_s)


def default_specs(workers: int) -> List[CompressorSpec]:
    return [parse_spec(s, workers) for s in
            ("none", "fp16", "thc", "thc-n", "lhc", "lhc-topk-0.01", "onebit+ef", "topk-0.01+ef",
             "randomk-0.01+ef", "dithering-8")]


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


