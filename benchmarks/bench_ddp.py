#!/usr/bin/env python3
"""DDP comm hooks on an emulated network: plain all-reduce, fp16, PowerSGD, THC, and BytePS+THC.

Run as root (network namespaces, tc), like bench_network.py, whose network it shares
(harness/netem.py: one namespace per rank and one for BytePS's server, a bridge, tbf on every
link, 198.18.0.0/15 only). Each DDP run starts one rank per namespace (gloo over eth0) under the
launcher's Supervisor:

    sudo .venv/bin/python benchmarks/bench_ddp.py --models resnet50 --bandwidths 1,10 \\
        --json benchmarks/results/bench_ddp.json --plot benchmarks/results

Workload: the replay models' real parameter shapes (byteps_thc.advisor.models) as one DDP model
(bucket_cap_mb 25), fixed synthetic gradients (the loss is sum_i <p_i, g_i>), no compute time.
Systems:
  plain     DDP's own all-reduce
  fp16      fp16_compress_hook
  powersgd  powerSGD_hook (rank 4, compression from step 2), each bucket's future waited in the
            hook: as shipped, the hook issues its second and third all-reduce from future
            callbacks, which on gloo run in completion order, so that ranks can issue different
            buckets' collectives in different orders (docs/RESULTS.md)
  powersgd-async  powerSGD_hook as shipped (to show that failure)
  thc       byteps_thc.ddp.thc_hook, defaults (on the CPU a scale per rotation block of <= 2^16)
  thc-one   thc_hook with one norm a bucket (block_scale=False) in the rule's large blocks
  thc-block16  thc_hook with one norm a bucket in rotation blocks of 2^16: less CPU and padding
            than the rule's larger blocks, for more error where a bucket's parameters differ in
            scale (benchmarks/bench_ddp_blocks.py)
  byteps-thc  BytePS with THC (defaults), no DDP: bench_network.py's replay runner with
            --compute-ms 0, one server in its own namespace, on the same links

Measured per run, over the measured steps: step time (median), bytes on the wire per step and
rank (eth0 counters, headers included: sent + received; BytePS: the mean over workers) and CPU
seconds per step (rank 0's process; BytePS: a worker's mean, and the server's apart). Each record
has the load average before and after it: the host's cores are shared by every rank and by other
work, so compare within one run, as ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks import gloo_ranks
from benchmarks.runs import load_records
from harness.netem import CleanupOnSignal, EmulatedNetwork, cleanup_stale, measure_tcp

HOOKS = ("plain", "fp16", "powersgd", "powersgd-async", "thc", "thc-one", "thc-block16",
         "byteps-thc")
DDP_HOOKS = HOOKS[:-1]
TAG = "DDPRESULT "
PORT = 29400


def register_hook(model, hook: str) -> None:
    """Register the comm hook `hook` (one of DDP_HOOKS; plain: none) on the DDP `model`, as the
    module docstring describes each (bench_tta.py trains with the same hooks)."""
    import torch.distributed as dist
    if hook not in DDP_HOOKS:
        raise ValueError(f"unknown DDP hook {hook!r}; known: {', '.join(DDP_HOOKS)}")
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook.startswith("powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        psgd_state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                        start_powerSGD_iter=2)
        if hook == "powersgd":
            def serial(state, bucket):  # this bucket's collectives all issued before the next's
                fut = psgd.powerSGD_hook(state, bucket)
                fut.wait()
                return fut
            model.register_comm_hook(psgd_state, serial)
        else:
            model.register_comm_hook(psgd_state, psgd.powerSGD_hook)
    elif hook in ("thc", "thc-one", "thc-block16"):
        import dataclasses

        from byteps_thc.ddp import ThcHookState, default_config, thc_hook
        cfg = default_config(dist.get_world_size())
        if hook != "thc":
            cfg = dataclasses.replace(cfg, block_scale=False,
                                      rotation_block=1 << 16 if hook == "thc-block16" else None)
        model.register_comm_hook(ThcHookState(config=cfg), thc_hook)


# -- one rank ------------------------------------------------------------------------------------
def worker(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from byteps_thc.advisor import models

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shapes = models.model_shapes(a.model)
    net = gloo_ranks.replay_module(shapes)
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(s, generator=gen) * 0.01 for s in shapes]
    model = DDP(net, bucket_cap_mb=25)
    register_hook(model, a.hook)

    def step():
        model.zero_grad(set_to_none=True)
        model(grads).backward()

    rec = gloo_ranks.timed_steps(step, a.warmup, a.steps)
    if rank == 0:
        rec["params"] = sum(p.numel() for p in net.parameters())
        print(TAG + json.dumps(rec), flush=True)
    dist.destroy_process_group()
    return 0


# -- the runs ------------------------------------------------------------------------------------
def run(net, a, model, hook, bw):
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--hook",
            hook, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    return gloo_ranks.run_ranks(net, a.ranks, argv, PORT, TAG, a.run_timeout,
                                {"model": model, "hook": hook, "gbit": bw, "ranks": a.ranks},
                                "bench_ddp")


def run_byteps(net, a, model, bw, link, costs, logdir):
    """BytePS with THC on the same links: bench_network's replay runner, no compute time."""
    from benchmarks import bench_network
    from byteps_thc.advisor import wire
    load0 = os.getloadavg()[0]
    ns = argparse.Namespace(compute_ms=0.0, min_steps=a.steps, steps=a.steps, run_seconds=0.0,
                            warmup=a.warmup, run_timeout=a.run_timeout, nice=0,
                            workers=a.ranks, latency_ms=0.0)
    r = bench_network.run_replay(net, ns, model, wire.parse_spec("thc", a.ranks), bw, link,
                                 costs, logdir)
    rec = {"model": model, "hook": "byteps-thc", "gbit": bw, "ranks": a.ranks,
           "status": r["status"], "loadavg": [load0, os.getloadavg()[0]]}
    if r["status"] == "ok":
        rec.update(step_s=r["step_time_s"], step_times_s=r["step_times_s"],
                   bytes_per_step=r["wire_bytes_per_step"] / a.ranks,
                   cpu_s_per_step=r["worker_cpu_s_per_step"],
                   server_cpu_s_per_step=r["server_cpu_s_per_step"])
    else:
        rec["error"] = r.get("error", "")
    return rec


def _plain_of(records, r):
    return next((p for p in records if p["model"] == r["model"] and p["gbit"] == r["gbit"]
                 and p["ranks"] == r["ranks"] and p["hook"] == "plain" and "step_s" in p), None)


def table(records):
    lines = ["| model | Gbit/s | system | step s | x plain | MB/step/rank | x plain | "
             "CPU s/step | load avg |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        load = "-".join(f"{x:.1f}" for x in r.get("loadavg", []))
        if "step_s" not in r:
            lines.append(f"| {r['model']} | {r['gbit']:g} | {r['hook']} | {r['status']}: "
                         f"{r.get('error', '')[:70]} | | | | | {load} |")
            continue
        plain = _plain_of(records, r)
        ts = f"{r['step_s'] / plain['step_s']:.2f}" if plain else "-"
        tb = f"{r['bytes_per_step'] / plain['bytes_per_step']:.3f}" if plain else "-"
        cpu = f"{r['cpu_s_per_step']:.2f}"
        if r.get("server_cpu_s_per_step") is not None:
            cpu += f" (server {r['server_cpu_s_per_step']:.2f})"
        lines.append(f"| {r['model']} | {r['gbit']:g} | {r['hook']} | {r['step_s']:.3f} | {ts} | "
                     f"{r['bytes_per_step'] / 1e6:.1f} | {tb} | {cpu} | {load} |")
    return "\n".join(lines)


def plot(records, outdir, name="bench_ddp.png"):
    """Step time relative to plain DDP, one panel per model, one group of bars per bandwidth."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in records if "step_s" in r and _plain_of(records, r)]
    models = list(dict.fromkeys(r["model"] for r in ok))
    if not models:
        return None
    hooks = [h for h in HOOKS if any(r["hook"] == h for r in ok)]
    fig, axes = plt.subplots(1, len(models), figsize=(4.4 * len(models), 3.6), squeeze=False,
                             dpi=80)
    width = 0.8 / len(hooks)
    for ax, m in zip(axes[0], models):
        bws = sorted({r["gbit"] for r in ok if r["model"] == m})
        for k, h in enumerate(hooks):
            xs, ys = [], []
            for i, bw in enumerate(bws):
                r = next((r for r in ok if r["model"] == m and r["gbit"] == bw
                          and r["hook"] == h), None)
                if r is not None:
                    xs.append(i + (k - (len(hooks) - 1) / 2) * width)
                    ys.append(r["step_s"] / _plain_of(records, r)["step_s"])
            ax.bar(xs, ys, width, label=h)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(bws)))
        ax.set_xticklabels([f"{bw:g} Gbit/s" for bw in bws])
        ax.set_ylabel("step time / plain DDP's")
        ax.set_title(f"{m}, {ok[0]['ranks']} ranks, no compute", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path = os.path.join(outdir, name)
    fig.savefig(path)
    plt.close(fig)
    return path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gloo_ranks.add_arguments(
        ap, models="resnet50,bert-base,vgg16", bandwidths="1,10,25", warmup=3,
        warmup_help="PowerSGD compresses from step 2",
        timeout_help="seconds per run (powerSGD_hook on gloo has hung here: docs/RESULTS.md)")
    ap.add_argument("--hooks", default=",".join(HOOKS))
    ap.add_argument("--hook", choices=DDP_HOOKS, help=argparse.SUPPRESS)
    ap.add_argument("--plot", metavar="DIR", help="write bench_ddp.png here")
    ap.add_argument("--from-json", metavar="PATHS",
                    help="run nothing: the table and plot of these records (comma-separated)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    if a.from_json:
        records = load_records(a.from_json)
        print(table(records))
        if a.plot:
            print(plot(records, a.plot))
        return 0
    hooks = gloo_ranks.pick("bench_ddp", "hooks", a.hooks, HOOKS)
    if hooks is None:
        return 2
    costs = None
    if "byteps-thc" in hooks:
        from byteps_thc.advisor import host
        from byteps_thc.launch import fork_missing
        why = fork_missing()
        if why:
            print(f"bench_ddp: byteps-thc: {why}", file=sys.stderr)
            return 2
        costs = host.host_costs()
    cleanup_stale()
    records = []
    logdir = tempfile.mkdtemp(prefix="thcddp-")
    nodes = [f"w{r}" for r in range(a.ranks)] + (["srv"] if costs is not None else [])
    with CleanupOnSignal(), EmulatedNetwork(nodes) as net:
        for bw in a.bandwidths:
            net.set_rate(bw)
            link = measure_tcp(net, "w0", "w1", seconds=1.5)
            for model in a.models.split(","):
                for hook in hooks:
                    if hook == "byteps-thc":
                        rec = run_byteps(net, a, model, bw, link, costs, logdir)
                    else:
                        rec = run(net, a, model, hook, bw)
                    rec["link_gbit_measured"] = link
                    gloo_ranks.keep(records, rec, a.json)
    print(table(records))
    if a.plot:
        print(plot(records, a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
