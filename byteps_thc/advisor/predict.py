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
from typing import List, Optional, Sequence, Tuple

from .. import env
from .costs import LARGE_TENSOR_BYTES, HostCosts, partition_cpu
from .wire import (
    CompressorSpec,
    codec_elems,
    dithering_bits_per_element,
    parse_spec,
    partitions,
    wire_bytes,
)

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




def _stack_extra(spec: CompressorSpec, elems: int, compressed: bool, n: int,
                 costs: HostCosts) -> Tuple[float, float]:
    """(one worker's, the server's) CPU for a partition beyond partition_cpu, measured on the real
    stack (`<name>_xw`, `<name>_xs`; 0 without a calibration)."""
    if spec.name == "none" or (not compressed and spec.name != "fp16"):
        return 0.0, 0.0
    e = codec_elems(spec, elems, compressed)
    return (costs.get(f"{spec.name}_xw") * e, n * costs.get(f"{spec.name}_xs") * e)




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
        w, s = partition_cpu(spec, elems, comp, n, costs)
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


def predict(sc: Scenario, specs: Optional[Sequence[CompressorSpec]],
            costs: HostCosts) -> List[Prediction]:
    """Predictions for every compressor of `specs` (None: default_specs), fastest first;
    `speedup` is relative to `none`. `costs`: e.g. byteps_thc.advisor.host.host_costs()."""
    if specs is None:
        specs = default_specs(sc.workers)
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


