#!/usr/bin/env python3
"""FSDP2 on an emulated network: plain fp32, a bf16 reduce_dtype, and THC's reduce-scatter.

Run as root (network namespaces, tc), on bench_network.py's network (harness/netem.py: one
namespace per rank, a bridge, tbf on every link, 198.18.0.0/15 only). Each run starts one rank per
namespace (gloo over eth0) under the launcher's Supervisor:

    sudo .venv/bin/python benchmarks/bench_fsdp.py --models resnet50 --bandwidths 1 \\
        --json benchmarks/results/bench_fsdp.json

Workload: a replay model's real parameter shapes (byteps_thc.advisor.models), cut in param
groups of about --group-mb each (each its own fully_shard module), fixed synthetic gradients (the
loss is sum_i <p_i, g_i>), no compute time. Systems:
  fp32   FSDP's own reduce-scatter in float32
  bf16   MixedPrecisionPolicy(reduce_dtype=torch.bfloat16): the 16-bit baseline
  thc    byteps_thc.fsdp.ThcReduceScatter on every group (defaults: b = 4, fp32 error feedback)
Every system all-gathers the float32 parameters in the forward pass alike; the bytes per step are
the all-gather's plus the reduce-scatter's (eth0 counters, headers included: sent + received, of
rank 0). Step time is the median over the measured steps. Each record has the load average
before and after it: the host's cores are shared by every rank and by other work, so compare
within one run, as ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks import gloo_ranks
from harness.netem import CleanupOnSignal, EmulatedNetwork, cleanup_stale

SYSTEMS = ("fp32", "bf16", "thc")
TAG = "FSDPRESULT "
PORT = 29450


def groups_of(shapes, group_mb):
    """Consecutive shapes in groups of about group_mb MiB of float32 (at least one each)."""
    out, cur, size = [], [], 0
    for s in shapes:
        n = 1
        for k in s:
            n *= k
        cur.append(s)
        size += 4 * n
        if size >= group_mb * 2 ** 20:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def worker(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from byteps_thc.advisor import models

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = groups_of(models.model_shapes(a.model), a.group_mb)

    class Replay(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.groups = torch.nn.ModuleList([gloo_ranks.replay_module(s) for s in groups])

        def forward(self, gss):
            return sum(g(gs) for g, gs in zip(self.groups, gss))

    net = Replay()
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if a.system == "bf16" else None)
    comms = []
    for i, g in enumerate(net.groups):
        fully_shard(g, mp_policy=policy)
        if a.system == "thc":
            from byteps_thc.fsdp import ThcReduceScatter
            comms.append(ThcReduceScatter(key=i))
            g.set_custom_reduce_scatter(comms[-1])
    fully_shard(net, mp_policy=policy)
    gen = torch.Generator().manual_seed(rank)
    grads = [[torch.randn(s, generator=gen) * 0.01 for s in shapes] for shapes in groups]

    def step():
        net.zero_grad(set_to_none=True)
        net(grads).backward()

    rec = gloo_ranks.timed_steps(step, a.warmup, a.steps)
    if rank == 0:
        rec.update(params=sum(p.numel() for p in net.parameters()), groups=len(groups))
        if comms:
            rec["thc_residual_bytes"] = sum(c.residual_bytes() for c in comms)
        print(TAG + json.dumps(rec), flush=True)
    dist.destroy_process_group()
    return 0


def run(net, a, model, system, bw):
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--system",
            system, "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--group-mb", str(a.group_mb)]
    return gloo_ranks.run_ranks(net, a.ranks, argv, PORT, TAG, a.run_timeout,
                                {"model": model, "system": system, "gbit": bw, "ranks": a.ranks,
                                 "group_mb": a.group_mb}, "bench_fsdp")


def table(records):
    rows = ["model      Gbit/s  system  step s   x fp32  MB/step  x fp32  load"]
    base = {(r["model"], r["gbit"]): r for r in records if r["system"] == "fp32" and "step_s" in r}
    for r in records:
        if "step_s" not in r:
            rows.append(f"{r['model']:<10} {r['gbit']:>6g}  {r['system']:<6}  {r['status']}")
            continue
        b = base.get((r["model"], r["gbit"]))
        ts = f"{r['step_s'] / b['step_s']:.2f}" if b else "-"
        bs = f"{r['bytes_per_step'] / b['bytes_per_step']:.2f}" if b else "-"
        rows.append(f"{r['model']:<10} {r['gbit']:>6g}  {r['system']:<6}  {r['step_s']:7.3f}  "
                    f"{ts:>6}  {r['bytes_per_step'] / 1e6:7.1f}  {bs:>6}  "
                    f"{r['loadavg'][0]:.1f}-{r['loadavg'][1]:.1f}")
    return "\n".join(rows)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gloo_ranks.add_arguments(ap, models="resnet50", bandwidths="1", warmup=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--group-mb", type=float, default=25.0)
    ap.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    systems = gloo_ranks.pick("bench_fsdp", "systems", a.systems, SYSTEMS)
    if systems is None:
        return 2
    cleanup_stale()
    records = []
    with CleanupOnSignal(), EmulatedNetwork([f"w{r}" for r in range(a.ranks)]) as net:
        for bw in a.bandwidths:
            net.set_rate(bw)
            for model in a.models.split(","):
                for system in systems:
                    gloo_ranks.keep(records, run(net, a, model, system, bw), a.json)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
