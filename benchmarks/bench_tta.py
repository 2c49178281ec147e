#!/usr/bin/env python3
"""Time to accuracy: a byte-level language model trained to a held-out loss through every
compressor, on the emulated links of bench_network.py.

Run as root (network namespaces, tc). The network is harness/netem.py's: one namespace per worker
and one for BytePS's scheduler and server, a bridge, tbf on every link, 198.18.0.0/15 only. The
task is benchmarks/stdlib_lm.py: a transformer of 3.3M parameters on the Python standard
library's own sources (why that model and corpus: its docstring). Every run trains the same model
from the same seed on the same batches (rank r's data order is seeded by the seed and r alone)
for --steps steps, and evaluates the held-out loss at step 0, every --eval-every steps and at the
end.

    sudo .venv/bin/python benchmarks/bench_tta.py --workers 2 --bandwidths 1 \\
        --compressors none,fp16,thc,topk-0.01+ef --json benchmarks/results/bench_tta.json \\
        --plot benchmarks/results

Compressors
  BytePS (bench_network.py's names, through bpslaunch's flags): none (float32), fp16 (the 16-bit
      baseline), thc (defaults), thc-n (ThcConfig.for_workers(n)), onebit+ef, topk-K+ef,
      randomk-K+ef, dithering-S, lhc-topk-F, lhc-cN
  DDP over gloo, no server (bench_ddp.py's hooks): ddp (plain all-reduce), ddp-fp16,
      ddp-powersgd (rank 4), ddp-thc (byteps_thc.ddp.thc_hook)
  FSDP2 over gloo (fully_shard on every transformer block and the root): fsdp (float32
      reduce-scatter), fsdp-bf16 (MixedPrecisionPolicy(reduce_dtype=bfloat16), the 16-bit
      baseline), fsdp-thc (byteps_thc.fsdp.ThcReduceScatter, float32 error feedback),
      fsdp-thc-ef-bf16 and fsdp-thc-ef-off (its other error-feedback modes)

Each run is one record (--json: all of them, rewritten after every run):
  compressor, system (byteps | ddp | fsdp), workers, bandwidth_gbit, link_gbit_measured
  steps, wall_s      training steps and their seconds on rank 0, the evaluations excluded
  step_s             the median step; first_step_s (BytePS declares its tensors then)
  bytes_per_step     every worker's eth0, sent + received, over the training steps, per step
                     (the kernel's counters, headers included; for BytePS this is also what the
                     server's link carried)
  curve              [[wall_s, step, val_loss], ...]: held-out loss (nats per byte)
  final_val_loss, target_val_loss, time_to_target_s, steps_to_target
                     the target is the fp32 run's (none, else ddp, else fsdp) final held-out
                     loss + 1% at the same workers and bandwidth, or --target; the time is the
                     wall_s of the first evaluation at or below it (null: never reached)
  loadavg            the 1-minute load average before and after the run
  invocation         when this invocation started: targets and plots compare runs of one only

This host's two cores are shared by every worker, the server and whatever else runs: compare
within one invocation, as ratios, and read the load averages.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

from benchmarks import bench_ddp, bench_network, gloo_ranks, stdlib_lm
from benchmarks.runs import Matrix, add_matrix_arguments, failure, load_records, parser
from byteps_thc.advisor import wire
from byteps_thc.launch import fork_missing
from harness.netem import EmulatedNetwork, available, measure_tcp, parse_rates

TAG = "TTA_RESULT "
DDP_PORT = 29500
DDP_ROWS = {"ddp": "plain", "ddp-fp16": "fp16", "ddp-powersgd": "powersgd", "ddp-thc": "thc"}


@dataclasses.dataclass(frozen=True)
class FsdpRow:
    reduce_dtype: str               # MixedPrecisionPolicy's reduce_dtype
    error_feedback: Optional[str]   # ThcReduceScatter's mode; None: FSDP's own reduce-scatter

    def argv(self) -> List[str]:
        """The worker's flags for this row."""
        return ["--reduce-dtype", self.reduce_dtype] + (
            ["--fsdp-ef", self.error_feedback] if self.error_feedback else [])


FSDP_ROWS = {"fsdp": FsdpRow("float32", None), "fsdp-bf16": FsdpRow("bfloat16", None),
             "fsdp-thc": FsdpRow("float32", "fp32"), "fsdp-thc-ef-bf16": FsdpRow("float32", "bf16"),
             "fsdp-thc-ef-off": FsdpRow("float32", "off")}
FP32_ROWS = ("none", "ddp", "fsdp")  # the target's source, in order of preference
DEFAULT_COMPRESSORS = ("none,fp16,thc,thc-n,onebit+ef,topk-0.01+ef,dithering-8,lhc-topk-0.01,"
                       "ddp,ddp-fp16,ddp-powersgd,ddp-thc,fsdp,fsdp-bf16,fsdp-thc")


def log(msg: str) -> None:
    print(f"[bench_tta {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# Rows
# ------------------------------------------------------------------------------------------------
def parse_rows(text: str, workers: int) -> List[Tuple[str, object]]:
    """[(label, spec)]: spec a wire.CompressorSpec (BytePS), a bench_ddp hook name (DDP) or an
    FsdpRow.
    ValueError naming the bad entry for an unknown one; the fp32 rows first (the target)."""
    rows = []
    for name in (t.strip() for t in text.split(",")):
        if not name:
            continue
        if name in DDP_ROWS or name in FSDP_ROWS:
            rows.append((name, DDP_ROWS.get(name) or FSDP_ROWS[name]))
            continue
        try:
            spec = wire.parse_spec(name, workers)
        except ValueError as e:
            raise ValueError(f"compressor {name!r}: {e}; the DDP rows are "
                             f"{', '.join(DDP_ROWS)}, the FSDP rows {', '.join(FSDP_ROWS)}"
                             ) from None
        rows.append((spec.label, spec))
    labels = [r[0] for r in rows]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"compressors named twice: {', '.join(dup)}")
    if not rows:
        raise ValueError(f"no compressor in {text!r}")
    return sorted(rows, key=lambda r: r[0] not in FP32_ROWS)


# ------------------------------------------------------------------------------------------------
# One worker (inside a namespace)
# ------------------------------------------------------------------------------------------------
def _task(a, rank):
    import torch
    torch.set_num_threads(1)
    cfg = stdlib_lm.LmConfig(dim=a.dim, layers=a.layers, heads=a.heads, seq=a.seq)
    corpus = stdlib_lm.load_corpus()
    data = stdlib_lm.Batches(corpus, cfg.seq, a.batch, rank, a.seed, a.eval_windows)
    model = stdlib_lm.make_model(cfg, a.seed)
    return cfg, corpus, data, model


def _optimizer(a, params):
    import torch
    # a constant learning rate: BytePS's vanilla error feedback reads its ratio from ./lr.s,
    # which bench_network.run_cluster writes once (1.0)
    return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)


def _progress(rank):
    def on_eval(p):
        if rank == 0:
            print(f"tta: step {p[1]} train {p[0]:.1f}s val_loss {p[2]:.4f}", flush=True)
    return on_eval


def _eth0_bytes() -> int:
    return gloo_ranks.eth0("tx_bytes") + gloo_ranks.eth0("rx_bytes")


def _result(rank, cfg, corpus, model, res, nbytes) -> dict:
    out = {"rank": rank, "eth0_bytes": nbytes}
    if rank == 0:
        out.update(res, params=stdlib_lm.param_count(model), model=dataclasses.asdict(cfg),
                   corpus=corpus.info(), first_step_s=res["step_times_s"][0])
    return out


def worker_byteps(a) -> int:
    import byteps.torch as bps
    bps.init()
    rank = bps.rank()
    cfg, corpus, data, model = _task(a, rank)
    # compression: none here, so that bpslaunch --compressor decides
    opt = bps.DistributedOptimizer(_optimizer(a, model.parameters()),
                                   named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    b0 = _eth0_bytes()
    res = stdlib_lm.train(model, model, opt, data, a.steps, a.eval_every, _progress(rank))
    rec = _result(rank, cfg, corpus, model, res, _eth0_bytes() - b0)
    print(TAG + json.dumps(rec), flush=True)
    bps.shutdown()
    return 0


def worker_ddp(a) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg, corpus, data, model = _task(a, rank)
    ddp = DDP(model, bucket_cap_mb=25)
    bench_ddp.register_hook(ddp, a.hook)
    return _train_gloo(a, rank, cfg, corpus, data, model, ddp)


def _train_gloo(a, rank, cfg, corpus, data, model, step_model) -> int:
    """The training and the record of a DDP or FSDP rank."""
    import torch
    import torch.distributed as dist
    opt = _optimizer(a, model.parameters())
    b0 = _eth0_bytes()
    res = stdlib_lm.train(step_model, model, opt, data, a.steps, a.eval_every, _progress(rank))
    total = torch.tensor([float(_eth0_bytes() - b0)], dtype=torch.float64)
    dist.all_reduce(total)      # every rank's bytes, as BytePS's records sum every worker's
    rec = _result(rank, cfg, corpus, model, res, int(total.item()))
    if rank == 0:
        print(TAG + json.dumps(rec), flush=True)
    dist.destroy_process_group()
    return 0


def worker_fsdp(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from byteps_thc.fsdp import ThcReduceScatter
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg, corpus, data, model = _task(a, rank)
    policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, a.reduce_dtype))
    # each block its own param group, then the root (embeddings, final norm, head)
    for key, module in enumerate(list(model.blocks) + [model]):
        fully_shard(module, mp_policy=policy)
        if a.fsdp_ef:
            module.set_custom_reduce_scatter(ThcReduceScatter(error_feedback=a.fsdp_ef, key=key))
    return _train_gloo(a, rank, cfg, corpus, data, model, model)


def _worker_argv(a, system: str, extra: Sequence[str] = ()) -> List[str]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", system,
            "--steps", str(a.steps), "--eval-every", str(a.eval_every),
            "--eval-windows", str(a.eval_windows), "--batch", str(a.batch),
            "--lr", repr(a.lr), "--seed", str(a.seed), "--dim", str(a.dim),
            "--layers", str(a.layers), "--heads", str(a.heads), "--seq", str(a.seq)]
    return argv + list(extra)


# ------------------------------------------------------------------------------------------------
# The runs
# ------------------------------------------------------------------------------------------------
def _record(a, label, system, bw, link, load0, t0) -> dict:
    return {"compressor": label, "system": system, "workers": a.workers, "bandwidth_gbit": bw,
            "invocation": a.invocation,
            "link_gbit_measured": link, "batch_per_worker": a.batch, "lr": a.lr,
            "seed": a.seed, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"), "loadavg": [load0, os.getloadavg()[0]],
            "run_wall_s": time.time() - t0}


def _finish(rec: dict, rank0: Optional[dict], total_bytes: Optional[int]) -> dict:
    """The record's measured fields from rank 0's result and every worker's bytes."""
    if rank0 is None or total_bytes is None:
        rec["status"] = "failed" if rec.get("status") in (None, "ok") else rec["status"]
        rec["error"] = rec.get("error") or "no result from every worker"
        return rec
    curve = rank0["curve"]
    rec.update(status="ok", steps=curve[-1][1], wall_s=rank0["wall_s"], step_s=rank0["step_s"],
               first_step_s=rank0["first_step_s"], bytes_per_step=total_bytes / curve[-1][1],
               curve=curve, initial_val_loss=curve[0][2], final_val_loss=curve[-1][2],
               train_loss_last=statistics.mean(rank0["train_losses"][-20:]),
               step_times_s=rank0["step_times_s"], params=rank0["params"],
               model=rank0["model"], corpus=rank0["corpus"])
    return rec


def run_byteps(net, a, label, spec, bw, link, logdir) -> dict:
    t0, load0 = time.time(), os.getloadavg()[0]
    res = bench_network.run_cluster(net, a.workers, spec, _worker_argv(a, "byteps"), logdir,
                                    a.run_timeout, 0, tag=f"tta{spec.name[:4]}",
                                    done_marker=TAG)
    rec = _record(a, label, "byteps", bw, link, load0, t0)
    rec.update(status=res["status"], error=res["error"], rundir=res["rundir"])
    if spec.name == "thc":
        c = spec.thc_config()
        rec["thc"] = {"bits": c.bits, "granularity": c.granularity,
                      "overflow_prob": c.overflow_prob}
    results = [json.loads(line[len(TAG):]) for p in res["procs"] for _, line in p.lines
               if line.startswith(TAG)]
    rank0 = next((r for r in results if r["rank"] == 0), None)
    total = sum(r["eth0_bytes"] for r in results) if len(results) == a.workers else None
    if res["status"] != "ok":
        rec["error"] = bench_network._failure_reason(res)
    return _finish(rec, rank0 if res["status"] == "ok" else None, total)


def run_gloo(net, a, label, spec, bw, link) -> dict:
    """A DDP row (spec: the hook's name) or an FSDP one (an FsdpRow): gloo ranks, no server."""
    t0, load0 = time.time(), os.getloadavg()[0]
    fsdp = isinstance(spec, FsdpRow)
    system = "fsdp" if fsdp else "ddp"
    argv = _worker_argv(a, system, spec.argv() if fsdp else ["--hook", spec])
    got = gloo_ranks.run_ranks(net, a.workers, argv, DDP_PORT, TAG, a.run_timeout, {},
                               "bench_tta")
    rec = _record(a, label, system, bw, link, load0, t0)
    if fsdp:
        rec["fsdp"] = dataclasses.asdict(spec)
    if "curve" not in got:
        rec.update(status="failed" if got["status"] == "ok" else got["status"],
                   error=got.get("error", ""), log_tail=got.get("log_tail"))
        return _finish(rec, None, None)
    return _finish(rec, got, got["eth0_bytes"])


def group(r: dict) -> tuple:
    """What a record is compared within: one invocation's runs of one workers and bandwidth."""
    return r.get("invocation"), r["workers"], r["bandwidth_gbit"]


def apply_targets(records: List[dict], target: Optional[float]) -> None:
    """Each record's target_val_loss (--target, else its group's fp32 run's final + 1%) and its
    time and steps to it."""
    for r in records:
        fp32 = None
        for name in FP32_ROWS:
            fp32 = next((x for x in records if x["compressor"] == name and x["status"] == "ok"
                         and group(x) == group(r)), None)
            if fp32:
                break
        r["target_val_loss"] = target if target is not None else (
            fp32["final_val_loss"] * 1.01 if fp32 else None)
        r["target_from"] = "--target" if target is not None else (
            fp32["compressor"] if fp32 else None)
        wall, step = stdlib_lm.time_to_target(r.get("curve") or [], r["target_val_loss"])
        r["time_to_target_s"], r["steps_to_target"] = wall, step


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def table(records: List[dict]) -> str:
    lines = ["| workers | Gbit/s | compressor | step ms | MB/step | final val loss | "
             "time to target (step) | x fp32 | x fp16 | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def ref(r, name):
        x = next((x for x in records if x["compressor"] == name and x["status"] == "ok"
                  and group(x) == group(r) and x.get("time_to_target_s") is not None), None)
        t = r.get("time_to_target_s")
        return f"{t / x['time_to_target_s']:.2f}" if x and t is not None else "-"
    for r in records:
        load = "-".join(f"{x:.1f}" for x in r.get("loadavg", []))
        head = f"| {r['workers']} | {r['bandwidth_gbit']:g} | {r['compressor']} |"
        if r["status"] != "ok":
            lines.append(f"{head} {failure(r)} | | | | | | {load} |")
            continue
        t = r.get("time_to_target_s")
        tt = "not reached" if t is None else f"{t:.1f} s ({r['steps_to_target']})"
        lines.append(f"{head} {r['step_s'] * 1e3:.0f} | {r['bytes_per_step'] / 1e6:.2f} | "
                     f"{r['final_val_loss']:.4f} | {tt} | {ref(r, 'none')} | {ref(r, 'fp16')} "
                     f"| {load} |")
    return "\n".join(lines)


def plot(records: List[dict], outdir: str) -> List[str]:
    """Per (workers, bandwidth): held-out loss against training wall-clock and against bytes
    (every worker's, to that step), one line per compressor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(outdir, exist_ok=True)
    written = []
    ok = [r for r in records if r["status"] == "ok"]
    palette = plt.get_cmap("tab20").colors
    colors = {c: palette[i % len(palette)]
              for i, c in enumerate(dict.fromkeys(r["compressor"] for r in ok))}
    groups = list(dict.fromkeys(group(r) for r in ok))
    for g in groups:
        inv, n, bw = g
        rs = [r for r in ok if group(r) == g]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
        for r in rs:
            # THC's lines solid, DDP's dash-dotted; one colour per compressor in every figure
            style = "-" if "thc" in r["compressor"] else "-." if r["system"] != "byteps" else "--"
            kw = dict(color=colors[r["compressor"]], lw=2.0 if "thc" in r["compressor"] else 1.2)
            wall = [p[0] for p in r["curve"]]
            mb = [p[1] * r["bytes_per_step"] / 1e6 for p in r["curve"]]
            loss = [p[2] for p in r["curve"]]
            axes[0].plot(wall, loss, style, marker=".", ms=3, label=r["compressor"], **kw)
            axes[1].plot(mb, loss, style, marker=".", ms=3, label=r["compressor"], **kw)
        target = rs[0].get("target_val_loss")
        for ax in axes:
            if target is not None:
                ax.axhline(target, color="gray", lw=0.8, ls=":")
            ax.set_ylabel("held-out loss (nats/byte)")
            ax.grid(True, alpha=0.3)
            lo = min(p[2] for r in rs for p in r["curve"])
            ax.set_ylim(lo - 0.05, min(max(r["curve"][1][2] for r in rs if len(r["curve"]) > 1)
                                       + 0.2, 6.0))
        axes[0].set_xlabel("training wall-clock (s, evaluations excluded)")
        axes[1].set_xlabel("MB on the wire, all workers (step x measured bytes per step)")
        axes[1].set_xscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"byte LM on the stdlib, {n} workers, {bw:g} Gbit/s links "
                     f"(dotted: target {target:.3f})" if target is not None else
                     f"byte LM on the stdlib, {n} workers, {bw:g} Gbit/s links", fontsize=9)
        fig.tight_layout()
        # merged records (--from-json) may hold one group per invocation: each its own file
        again = sum(x[1:] == g[1:] for x in groups) > 1 and inv
        path = os.path.join(outdir, f"bench_tta_w{n}_{bw:g}gbit" +
                            (f"_{inv}" if again else "") + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bandwidths", type=parse_rates, default="1,10",
                    help="Gbit/s per link (1,10)")
    ap.add_argument("--compressors", default=DEFAULT_COMPRESSORS,
                    help=f"comma-separated ({DEFAULT_COMPRESSORS})")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=64,
                    help="held-out windows of --seq bytes per evaluation")
    ap.add_argument("--batch", type=int, default=4, help="windows per worker and step")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW, constant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=stdlib_lm.LmConfig.dim)
    ap.add_argument("--layers", type=int, default=stdlib_lm.LmConfig.layers)
    ap.add_argument("--heads", type=int, default=stdlib_lm.LmConfig.heads)
    ap.add_argument("--seq", type=int, default=stdlib_lm.LmConfig.seq)
    ap.add_argument("--target", type=float, default=None,
                    help="held-out loss to reach (default: the fp32 run's final + 1%%)")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run")
    add_matrix_arguments(ap, subnet="198.18.1.0/24")
    ap.add_argument("--from-json", metavar="PATHS",
                    help="run nothing: the table and --plot of these records (comma-separated)")
    ap.add_argument("--worker", choices=("byteps", "ddp", "fsdp"), help=argparse.SUPPRESS)
    ap.add_argument("--reduce-dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--fsdp-ef", choices=("fp32", "bf16", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--hook", choices=bench_ddp.DDP_HOOKS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("workers", "steps", "eval_every", "eval_windows", "batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.lr <= 0:
        ap.error(f"--lr must be positive, got {a.lr}")
    a.invocation = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return a


def report(records: List[dict], a) -> None:
    print()
    print(table(records))
    if a.plot and records:
        for p in plot(records, a.plot):
            log(f"wrote {p}")


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker == "byteps":
        return worker_byteps(a)
    if a.worker == "ddp":
        return worker_ddp(a)
    if a.worker == "fsdp":
        return worker_fsdp(a)
    if a.from_json:
        records = load_records(a.from_json)
        apply_targets(records, a.target)
        report(records, a)
        return 0
    try:
        rows = parse_rows(a.compressors, a.workers)
        stdlib_lm.LmConfig(dim=a.dim, layers=a.layers, heads=a.heads, seq=a.seq)
    except ValueError as e:
        print(f"bench_tta: {e}", file=sys.stderr)
        return 2
    why = available()
    if why is None and any(isinstance(s, wire.CompressorSpec) for _, s in rows):
        why = fork_missing()
    if why:
        print(f"bench_tta: cannot run: {why}", file=sys.stderr)
        return 2
    logdir = a.logdir or tempfile.mkdtemp(prefix="thctta-")
    os.makedirs(logdir, exist_ok=True)
    matrix = Matrix(a.json, a.time_budget, log, lambda records: apply_targets(records, a.target))

    def runs(net: EmulatedNetwork) -> None:
        log(f"namespaces {net.prefix}-*, logs in {logdir}")
        for bw in a.bandwidths:
            net.set_rate(bw)
            link = measure_tcp(net, "w0", "srv", seconds=1.5)
            log(f"links at {bw:g} Gbit/s (tbf): one TCP stream carries {link:.2f}")
            for label, spec in rows:
                if not matrix.due(f"{label}@{bw:g}"):
                    continue
                log(f"{label} at {bw:g} Gbit/s, {a.workers} workers, {a.steps} steps "
                    f"(load {os.getloadavg()[0]:.1f})")
                if not isinstance(spec, wire.CompressorSpec):
                    rec = run_gloo(net, a, label, spec, bw, link)
                else:
                    rec = run_byteps(net, a, label, spec, bw, link, logdir)
                matrix.add(rec)
                if rec["status"] == "ok":
                    log(f"  {rec['step_s'] * 1e3:.0f} ms/step, "
                        f"{rec['bytes_per_step'] / 1e6:.2f} MB/step, val loss "
                        f"{rec['initial_val_loss']:.3f} -> {rec['final_val_loss']:.4f}, "
                        f"time to target {rec['time_to_target_s']}")
                else:
                    log(f"  {rec['status']}: {str(rec.get('error', ''))[:300]}")

    nodes = ["srv"] + [f"w{i}" for i in range(a.workers)]
    interrupted = matrix.run(nodes, a.subnet, runs)
    if a.json:
        log(f"wrote {a.json} ({len(matrix.records)} records)")
    report(matrix.records, a)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
