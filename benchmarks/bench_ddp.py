#!/usr/bin/env python3
"""DDP comm hooks on an emulated network: plain all-reduce, fp16, PowerSGD and THC (no BytePS).

Run as root (network namespaces, tc), like bench_network.py, whose network it shares
(benchmarks/netem.py: one namespace per rank, a bridge, tbf on every link, 198.18.0.0/15 only).
Each run starts one rank per namespace (gloo over eth0) under the launcher's Supervisor:

    sudo .venv/bin/python benchmarks/bench_ddp.py --models resnet50 --bandwidths 1,10 \\
        --json benchmarks/results/bench_ddp.json

Workload: the replay models' real parameter shapes (byteps_thc.advisor.models) as one DDP model
(bucket_cap_mb 25), fixed synthetic gradients (the loss is sum_i <p_i, g_i>), no compute time.
Hooks: plain (DDP's all-reduce), fp16 (fp16_compress_hook), powersgd (powerSGD_hook, rank 4,
compression from step 2), thc (byteps_thc.ddp.thc_hook, defaults). BytePS with THC is
bench_network.py's `thc` on the same links.

Measured per run, over the measured steps: step time (median), bytes on the wire per step
(rank 0's eth0 counters, headers included: sent + received) and CPU seconds per step (rank 0's
process). Compare within one run: the host's cores are shared by every rank.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.netem import CleanupOnSignal, EmulatedNetwork, available, cleanup_stale  # noqa: E402
from byteps_thc.launch.supervisor import ProcSpec, Supervisor  # noqa: E402

HOOKS = ("plain", "fp16", "powersgd", "thc")
TAG = "DDPRESULT "
PORT = 29400


# -- one rank ------------------------------------------------------------------------------------
def _eth0(stat):
    with open(f"/sys/class/net/eth0/statistics/{stat}") as f:
        return int(f.read())


def worker(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from byteps_thc.advisor import models

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shapes = models.model_shapes(a.model)
    class Replay(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

        def forward(self, gs):  # the gradient of p_i is g_i
            return sum((p * g).sum() for p, g in zip(self.ps, gs))

    net = Replay()
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(s, generator=gen) * 0.01 for s in shapes]
    model = DDP(net, bucket_cap_mb=25)
    if a.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        model.register_comm_hook(psgd.PowerSGDState(process_group=None,
                                                    matrix_approximation_rank=4,
                                                    start_powerSGD_iter=2), psgd.powerSGD_hook)
    elif a.hook == "thc":
        from byteps_thc.ddp import ThcHookState, thc_hook
        model.register_comm_hook(ThcHookState(), thc_hook)

    def step():
        model.zero_grad(set_to_none=True)
        model(grads).backward()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    times = []
    tx0, rx0, cpu0 = _eth0("tx_bytes"), _eth0("rx_bytes"), time.process_time()
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    tx1, rx1, cpu1 = _eth0("tx_bytes"), _eth0("rx_bytes"), time.process_time()
    dist.barrier()
    if rank == 0:
        n_params = sum(p.numel() for p in net.parameters())
        print(TAG + json.dumps({
            "step_s": statistics.median(times), "bytes_per_step": (tx1 - tx0 + rx1 - rx0) / a.steps,
            "cpu_s_per_step": (cpu1 - cpu0) / a.steps, "params": n_params}), flush=True)
    dist.destroy_process_group()
    return 0


# -- the runs ------------------------------------------------------------------------------------
def run(net, a, model, hook, bw):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               MASTER_ADDR=net.addr["w0"], MASTER_PORT=str(PORT), WORLD_SIZE=str(a.ranks),
               GLOO_SOCKET_IFNAME="eth0")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--hook",
            hook, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    specs = [ProcSpec(f"rank {r}", "worker", net.argv(f"w{r}", argv), dict(env, RANK=str(r)))
             for r in range(a.ranks)]
    sup = Supervisor(specs, echo=False, keep_lines=True, err=sys.stderr, tag="bench_ddp",
                     grace=30.0, timeout=a.run_timeout, shutdown_timeout=5.0, poll_interval=0.2)
    try:
        with sup:
            outcome = sup.wait()
    finally:
        net.kill_all()
    rec = {"model": model, "hook": hook, "gbit": bw, "ranks": a.ranks, "status": outcome.kind}
    for _, line in sup.logs["rank 0"].lines:
        if line.startswith(TAG):
            rec.update(json.loads(line[len(TAG):]))
    if "step_s" not in rec:
        rec["error"] = outcome.message
        rec["log_tail"] = {n: sup.logs[n].tail(30) for n in sup.logs}
    return rec


def table(records):
    lines = ["model      Gbit/s hook      step s   bytes/step  x plain  CPU s/step"]
    for r in records:
        if "step_s" not in r:
            lines.append(f"{r['model']:<10} {r['gbit']:>6g} {r['hook']:<9} {r['status']}: "
                         f"{r.get('error', '')[:60]}")
            continue
        plain = next((p for p in records if p["model"] == r["model"] and p["gbit"] == r["gbit"]
                      and p["hook"] == "plain" and "step_s" in p), None)
        ratio = f"{r['step_s'] / plain['step_s']:.2f}" if plain else "-"
        lines.append(f"{r['model']:<10} {r['gbit']:>6g} {r['hook']:<9} {r['step_s']:>7.3f} "
                     f"{r['bytes_per_step'] / 1e6:>9.1f}MB {ratio:>8} {r['cpu_s_per_step']:>10.3f}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-base,vgg16")
    ap.add_argument("--bandwidths", default="1,10,25", help="Gbit/s per link")
    ap.add_argument("--hooks", default=",".join(HOOKS))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="PowerSGD compresses from step 2")
    ap.add_argument("--run-timeout", type=float, default=300.0,
                    help="seconds per run (powerSGD_hook on gloo has hung here: docs/RESULTS.md)")
    ap.add_argument("--json", metavar="PATH", help="write the records here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--hook", choices=HOOKS, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    why = available()
    if why:
        print(f"bench_ddp: {why}", file=sys.stderr)
        return 2
    hooks = a.hooks.split(",")
    bad = [h for h in hooks if h not in HOOKS]
    if bad:
        print(f"bench_ddp: unknown hooks {bad}; known: {', '.join(HOOKS)}", file=sys.stderr)
        return 2
    cleanup_stale()
    records = []
    with CleanupOnSignal(), EmulatedNetwork([f"w{r}" for r in range(a.ranks)]) as net:
        for bw in (float(b) for b in a.bandwidths.split(",")):
            net.set_rate(bw)
            for model in a.models.split(","):
                for hook in hooks:
                    rec = run(net, a, model, hook, bw)
                    print(json.dumps(rec), flush=True)
                    records.append(rec)
                    if a.json:
                        with open(a.json, "w") as f:
                            json.dump(records, f, indent=1)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
