#!/usr/bin/env python3
"""End-to-end BytePS benchmark on an emulated network: THC against the other compressors.

Run as root (network namespaces, tc). It builds its own cluster on this host: one network
namespace per worker and one for the server and scheduler, joined by a bridge, every link
rate-limited with tbf (harness/netem.py; addresses from 198.18.0.0/15 only), and runs the real
roles there with `bpslaunch` (its non-local mode, DMLC_* environment) under `ip netns exec`.
Everything it creates is removed at the end, also on Ctrl-C / SIGTERM.

    sudo .venv/bin/python benchmarks/bench_network.py --json results.json --plot benchmarks/results
    sudo .venv/bin/python benchmarks/bench_network.py --workloads resnet50 --bandwidths 1 \\
        --compressors none,thc

Workloads
  resnet50, vgg16, bert-base  communication-bound replay: the models' real parameter shapes
      (byteps_thc.advisor.models.MODELS), synthetic gradients, and a per-step compute time slept
      on each worker (default: the published per-GPU step time, see --compute-ms). Each step:
      sleep, then push_pull every gradient through byteps.torch's DistributedOptimizer and wait
      (the advisor's replay worker, byteps_thc.advisor.replay).
  ncf     an NCF-like replay: two embedding tables of 10^6 rows x 32 whose gradient each step
      holds only the rows a batch of 16384 Zipf(1.0) ids touches (about 0.8% per worker, 1.5%
      of the two workers' sum), and a small MLP (byteps_thc.advisor.models.EMBEDDINGS).
  digits  real training: example/pytorch/train_digits.py (scikit-learn's bundled digits), accuracy
      against wall time and the time to --target-acc, at --train-bandwidth (1 Gbit/s).
  tiny    a 5 MB replay model for smoke tests.

Compressors (same run): none, fp16, thc (defaults), thc-n (ThcConfig.for_workers(n)), lhc-cN
(LHC, capacity N), lhc-topk-F (LHC after its own top-k F with error feedback), onebit+ef,
topk-K+ef, randomk-K+ef, dithering-S (BytePS's registry; +ef adds its vanilla error feedback).
Any of them +key: the same with a cluster key (docs/SECURITY.md), every connection encrypted.

Measured per run: step time (median, p90) over the measured steps, samples/s, bytes on the wire
per step (the workers' eth0 counters, /sys/class/net/eth0/statistics, read inside the namespaces
at the start and end of the measured steps: up = what the workers sent, down = what they
received, headers included), and the server's CPU seconds per step (/proc/<pid>/stat of the
server's processes, sampled). Each replay run also gets the advisor's prediction
(byteps_thc.advisor, with this host's measured costs and the link's measured TCP rate).

This host's limits show in the numbers: every process shares its CPU cores, so CPU-bound
encoding and the kernel's veth/bridge forwarding cap what high bandwidths can show (the records
carry `link_gbit_measured`, one TCP stream's rate through the emulated link).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import statistics
import struct
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from benchmarks.runs import (
    Matrix,
    add_matrix_arguments,
    failure,
    load_records,
    parser,
    save_records,
)
from byteps_thc.advisor import host, models, predict, replay, wire
from byteps_thc.advisor.costs import load_costs
from byteps_thc.advisor.wire import launcher_flags
from byteps_thc.env import CLUSTER_KEY
from byteps_thc.launch import fork_missing, new_key, server_argv
from byteps_thc.launch.supervisor import ProcSpec, Supervisor, cpu_seconds, describe_exit
from harness.netem import EmulatedNetwork, available, measure_tcp, parse_rates

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DIGITS = os.path.join(ROOT, "example", "pytorch", "train_digits.py")
SCHED_PORT = 9300
RESULT_TAG = replay.RESULT_TAG
REPLAY_MODELS = ("resnet50", "vgg16", "bert-base", "ncf")
TINY_SHAPES = [(1024, 1024), (1024,), (256, 1024), (256,), (10, 256), (10,)]
DEFAULT_COMPRESSORS = ("none,fp16,thc,thc-n,onebit+ef,topk-0.01+ef,randomk-0.01+ef,dithering-8")
# the environment a run decides itself (whatever the caller's says is dropped)
_OWNED_PREFIXES = ("DMLC_", "BYTEPS_")
KEYED = "+key"  # a compressor label's suffix: the run has a cluster key


def parse_spec(text: str, workers: int) -> wire.CompressorSpec:
    """wire.parse_spec, and `X+key`: X with a cluster key (its label keeps the suffix)."""
    t = text.strip()
    if not t.lower().endswith(KEYED):
        return wire.parse_spec(t, workers)
    spec = wire.parse_spec(t[:-len(KEYED)], workers)
    return dataclasses.replace(spec, label=spec.label + KEYED)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# Workloads
# ------------------------------------------------------------------------------------------------
def replay_shapes(model: str) -> List[tuple]:
    if model == "tiny":
        return list(TINY_SHAPES)
    return models.model_shapes(model)


def replay_defaults(model: str):
    """(compute ms, samples per step per worker)."""
    if model == "tiny":
        return 20.0, 32
    _, ms, batch, _ = models.MODELS[model]
    return ms, batch


# ------------------------------------------------------------------------------------------------
# Processes of one run
# ------------------------------------------------------------------------------------------------
def _interp(samples: List[tuple], t: float) -> Optional[float]:
    if not samples:
        return None
    if t <= samples[0][0]:
        return samples[0][1]
    for (ta, va), (tb, vb) in zip(samples, samples[1:]):
        if ta <= t <= tb:
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
    return samples[-1][1]


def base_env(net: EmulatedNetwork, workers: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWNED_PREFIXES)}
    env.update({
        "PYTHONPATH": ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "PYTHONUNBUFFERED": "1",
        "DMLC_NUM_WORKER": str(workers),
        "DMLC_NUM_SERVER": "1",
        "DMLC_PS_ROOT_URI": net.addr["srv"],
        "DMLC_PS_ROOT_PORT": str(SCHED_PORT),
        "DMLC_INTERFACE": "eth0",
        "BYTEPS_FORCE_DISTRIBUTED": "1",
        "BYTEPS_NUMA_ON": "0",
        "BYTEPS_LOG_LEVEL": "WARNING",
        "OMP_NUM_THREADS": "1",
    })
    return env


def run_cluster(net: EmulatedNetwork, workers: int, spec: wire.CompressorSpec,
                worker_cmd: List[str], logdir: str, timeout_s: float, nice: int,
                tag: str, done_marker: str = RESULT_TAG) -> dict:
    """Scheduler + server in `srv`, one worker per `w<i>`; returns the processes' output
    (supervisor.ProcLog: .name, .lines), CPU samples and the outcome once every worker has
    exited (or the timeout struck)."""
    launch = [sys.executable, "-m", "byteps_thc.launch"] + launcher_flags(spec)
    # The scheduler and the server run the very command `bpslaunch` runs for those roles
    # (server_argv()). Through bpslaunch itself, its supervisor stops them 20 s after
    # start: in role mode it has no workers to watch and takes that for "all workers finished".
    role_cmd = server_argv()
    env = base_env(net, workers)
    rundir = tempfile.mkdtemp(prefix=f"{net.prefix}-{tag}-", dir=logdir)
    if spec.label.endswith(KEYED):  # one key for every process of the run
        env[CLUSTER_KEY.name] = new_key(os.path.join(rundir, "cluster.key"))
    # BytePS's vanilla error feedback (ef_type=vanilla) maps the learning rate from ./lr.s, a
    # file only its MXNet plugin writes; every process of a run starts in `rundir`, which holds
    # one. Both workloads keep the learning rate constant, so 1.0 (the ratio it uses is 1) is exact.
    with open(os.path.join(rundir, "lr.s"), "wb") as f:
        f.write(struct.pack("d", 1.0))
    # BytePS's Unix sockets live in a short path of their own: sun_path holds 108 bytes, and the
    # fork appends "_<uri>_<port>_<worker>_<rank>" to it (a log dir under pytest's tmp is too long).
    sockroot = tempfile.mkdtemp(prefix="thcs", dir="/tmp")
    niced = ["nice", "-n", str(nice)] if nice else []

    def proc(node: str, name: str, role: str, argv: List[str], penv: Dict[str, str]) -> ProcSpec:
        return ProcSpec(name, role, net.argv(node, niced + argv), penv, cwd=rundir,
                        log=os.path.join(rundir, name.replace(" ", "_") + ".log"))

    specs = [proc("srv", "scheduler", "scheduler", role_cmd,
                  dict(env, DMLC_ROLE="scheduler", DMLC_NODE_HOST=net.addr["srv"])),
             proc("srv", "server", "server", role_cmd,
                  dict(env, DMLC_ROLE="server", DMLC_NODE_HOST=net.addr["srv"]))]
    for i in range(workers):
        sock = os.path.join(sockroot, f"w{i}")
        os.makedirs(sock, exist_ok=True)
        wenv = dict(env, DMLC_ROLE="worker", DMLC_WORKER_ID=str(i),
                    DMLC_NODE_HOST=net.addr[f"w{i}"], BYTEPS_LOCAL_RANK="0",
                    BYTEPS_LOCAL_SIZE="1", BYTEPS_SOCKET_PATH=sock)
        specs.append(proc(f"w{i}", f"worker {i}", "worker", launch + ["--"] + worker_cmd, wenv))
    worker_names = [s.name for s in specs if s.role == "worker"]
    cpu: List[tuple] = []
    status, error = "ok", ""
    # Every worker failing or hanging ends the run; at shutdown the server and scheduler may
    # leave a moment before the workers do (grace 20 s); once the workers are done they get 10 s
    # to leave by themselves. Stopping sends SIGTERM first: bpslaunch then stops what it started.
    # The fork names its shared memory BytePS_ShM_<root uri>_<root port>_<worker>...
    sup = Supervisor(specs, echo=False, keep_lines=True, err=sys.stderr, tag="bench_network",
                     grace=20.0, timeout=timeout_s, shutdown_timeout=10.0, poll_interval=0.2,
                     dirs=[sockroot],
                     shm_prefixes=[f"BytePS_ShM_{env['DMLC_PS_ROOT_URI']}_"
                                   f"{env['DMLC_PS_ROOT_PORT']}_"])
    try:
        with sup:
            server = sup.pids["server"]
            while True:
                cpu.append((time.time(), cpu_seconds(server)))
                outcome = sup.poll()
                if outcome is not None:
                    break
                time.sleep(0.2)
            cpu.append((time.time(), cpu_seconds(server)))
    finally:
        net.kill_all()       # anything a launcher left behind (its children have own sessions)
    finished = all(any(done_marker in line for _, line in sup.logs[w].lines)
                   for w in worker_names)
    if outcome.kind == "failed":
        code = sup.procs[outcome.failed].returncode
        status, error = "failed", f"{outcome.failed} {describe_exit(code)}"
    elif outcome.kind in ("hung", "timeout"):
        if finished:   # every worker reported; only its teardown is slow (busy host)
            error = "workers were slow to exit after reporting (stopped)"
        elif outcome.kind == "hung":
            status, error = "failed", outcome.message
        else:
            status, error = "timeout", f"not finished after {timeout_s:.0f}s"
    return {"procs": list(sup.logs.values()), "cpu": cpu, "status": status, "error": error,
            "rundir": rundir}


def _failure_reason(res: dict) -> str:
    """The most telling lines of a failed run's logs."""
    keys = re.compile(r"error|Error|ERROR|Check failed|what\(\)|Traceback|abort|Abort|"
                      r"Segmentation|not supported|unknown|Unknown|killed")
    hits = []
    for p in res["procs"]:
        for _, line in p.lines:
            if keys.search(line):
                hits.append(f"{p.name}: {line.strip()[:200]}")
    return res["error"] + ("; " + " | ".join(hits[-4:]) if hits else "")


# ------------------------------------------------------------------------------------------------
# One configuration
# ------------------------------------------------------------------------------------------------
def _spec_info(spec: wire.CompressorSpec) -> dict:
    info = {"compressor": spec.label, "compressor_name": spec.name, "k": spec.k,
            "error_feedback": spec.ef if spec.name != "thc" else spec.thc_config().error_feedback}
    if spec.name == "thc":
        c = spec.thc_config()
        info["thc"] = {"bits": c.bits, "granularity": c.granularity,
                       "overflow_prob": c.overflow_prob}
    if spec.name == "lhc":
        c = spec.lhc_config()
        info["error_feedback"] = c.error_feedback and c.topk is not None
        info["lhc"] = {"capacity": c.capacity, "topk": c.topk, "topk_method": c.topk_method,
                       "seed": c.seed}
    return info


def _scenario(model: str, bw: float, link_gbit: float, compute_ms: float,
              workers: int) -> predict.Scenario:
    """What the advisor is asked about a replay run: every process on this host's cores."""
    tensors = [math.prod(s) for s in replay_shapes(model)]
    dens = models.densities(model, workers) if model in models.MODELS else None
    return predict.Scenario(tensors, bw, compute_ms / 1e3, workers,
                            efficiency=min(1.0, link_gbit / bw), cores=os.cpu_count(),
                            density=dens[0] if dens else None,
                            union_density=dens[1] if dens else None)


def _predicted(pred: predict.Prediction) -> dict:
    """A record's fields from the advisor's prediction (what a run measures beside them)."""
    return dict(predicted_step_time_s=pred.step_s, predicted_bound=pred.bound,
                predicted_wire_bytes_per_step=pred.wire_bytes_per_step,
                predicted_worker_cpu_s=pred.worker_cpu_s, predicted_server_cpu_s=pred.server_cpu_s)


def run_replay(net, a, model: str, spec, bw: float, link_gbit: float, costs, logdir) -> dict:
    compute_ms = a.compute_ms if a.compute_ms is not None else replay_defaults(model)[0]
    batch = replay_defaults(model)[1]
    sc = _scenario(model, bw, link_gbit, compute_ms, a.workers)
    pred = predict.predict_one(sc, spec, costs)
    steps = max(a.min_steps, min(a.steps, int(a.run_seconds / max(pred.step_s, 1e-3))))
    known = model in models.MODELS
    cmd = replay.worker_argv(steps, a.warmup, shapes=None if known else replay_shapes(model),
                             model=model if known else None, compute_ms=compute_ms,
                             interface="eth0")
    timeout = a.run_timeout or max(240.0, 90 + 8 * (steps + a.warmup) * pred.step_s)
    t0, load0 = time.time(), os.getloadavg()[0]
    res = run_cluster(net, a.workers, spec, cmd, logdir, timeout, a.nice,
                      tag=f"{model}{int(bw)}{spec.name[:4]}")
    rec = dict(_spec_info(spec), workload=model, kind="replay", bandwidth_gbit=bw,
               link_gbit_measured=link_gbit, latency_ms=a.latency_ms, workers=a.workers,
               compute_ms=compute_ms, batch_per_worker=batch, model_bytes=4 * sum(sc.tensors),
               status=res["status"], wall_s=time.time() - t0, loadavg=os.getloadavg()[0],
               loadavg_start=load0, **_predicted(pred))
    results = replay.results(line for p in res["procs"] for _, line in p.lines)
    if res["status"] != "ok" or len(results) != a.workers:
        rec["status"] = "failed" if res["status"] == "ok" else res["status"]
        rec["error"] = _failure_reason(res) or "no result from the workers"
        return rec
    times = results[0]["times"]     # every worker makes the same synchronous steps; rank 0's
    for r in results:
        if r["rank"] == 0:
            times = r["times"]
    n = len(times)
    up = sum(r["c1"]["tx_bytes"] - r["c0"]["tx_bytes"] for r in results) / n
    down = sum(r["c1"]["rx_bytes"] - r["c0"]["rx_bytes"] for r in results) / n
    w0 = min(r["w0"] for r in results)
    w1 = max(r["w1"] for r in results)
    c0, c1 = _interp(res["cpu"], w0), _interp(res["cpu"], w1)
    med = statistics.median(times)
    rec.update(steps=n, step_times_s=times, step_time_s=med,
               step_time_p90_s=sorted(times)[min(n - 1, int(math.ceil(0.9 * n)) - 1)],
               samples_per_s=a.workers * batch / med,
               wire_bytes_per_step=up + down, up_bytes_per_step=up, down_bytes_per_step=down,
               server_cpu_s_per_step=(c1 - c0) / n if c0 is not None and c1 is not None else None,
               worker_cpu_s_per_step=statistics.mean(r["cpu"] for r in results) / n,
               prediction_error=(pred.step_s - med) / med)
    return rec


_EPOCH = re.compile(r"epoch\s+(\d+)/(\d+).*test acc ([0-9.]+)")
_FINAL = re.compile(r"final test accuracy: ([0-9.]+)\s+\((\d+) steps, ([0-9.]+)s\)")
_HEADER = re.compile(r"^digits: .*?(\d+) steps/epoch")


def run_training(net, a, spec, bw: float, link_gbit: float, logdir) -> dict:
    cmd = [sys.executable, DIGITS, "--epochs", str(a.train_epochs)]
    t0 = time.time()
    res = run_cluster(net, a.workers, spec, cmd, logdir, a.run_timeout or 600.0, a.nice,
                      tag=f"digits{spec.name[:4]}", done_marker="final test accuracy:")
    rec = dict(_spec_info(spec), workload="digits", kind="training", bandwidth_gbit=bw,
               link_gbit_measured=link_gbit, latency_ms=a.latency_ms, workers=a.workers,
               status=res["status"], wall_s=time.time() - t0, loadavg=os.getloadavg()[0],
               target_accuracy=a.target_acc)
    w0 = next((p for p in res["procs"] if p.name == "worker 0"), None)
    start = None
    curve = []
    final = None
    steps_per_epoch = None
    for t, line in (w0.lines if w0 else []):
        body = re.sub(r"^\[[^\]]*\]\s*", "", line)
        m = _HEADER.search(body)
        if m and start is None:
            start, steps_per_epoch = t, int(m.group(1))
        m = _EPOCH.search(body)
        if m and start is not None:
            curve.append((round(t - start, 3), float(m.group(3))))
        m = _FINAL.search(body)
        if m:
            final = (float(m.group(1)), int(m.group(2)), float(m.group(3)))
    if res["status"] != "ok" or final is None:
        rec["status"] = "failed" if res["status"] == "ok" else res["status"]
        rec["error"] = _failure_reason(res) or "no final accuracy printed"
        rec["accuracy_curve"] = curve
        return rec
    acc, steps, secs = final
    ttt = next((t for t, v in curve if v >= a.target_acc), None)
    rec.update(accuracy=acc, accuracy_curve=curve, steps=steps, train_seconds=secs,
               step_time_s=secs / steps, time_to_target_s=ttt, steps_per_epoch=steps_per_epoch)
    return rec


# ------------------------------------------------------------------------------------------------
# Report and plots
# ------------------------------------------------------------------------------------------------
def _fmt_bytes(b) -> str:
    return "-" if b is None else f"{b / 1e6:.1f} MB"


def table(records: Sequence[dict]) -> str:
    lines = ["| workload | Gbit/s (TCP) | compressor | step ms (median / p90) | samples/s | "
             "wire/step | server CPU/step | advisor ms (err) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r.get("kind") != "replay":
            continue
        bw = f"{r['bandwidth_gbit']:g} ({r['link_gbit_measured']:.2f})"
        if r["status"] != "ok":
            lines.append(f"| {r['workload']} | {bw} | {r['compressor']} | {failure(r)} "
                         "| | | | |")
            continue
        cpu = r.get("server_cpu_s_per_step")
        lines.append(
            f"| {r['workload']} | {bw} | {r['compressor']} | {r['step_time_s'] * 1e3:.0f} / "
            f"{r['step_time_p90_s'] * 1e3:.0f} | {r['samples_per_s']:.0f} | "
            f"{_fmt_bytes(r['wire_bytes_per_step'])} | "
            f"{'-' if cpu is None else f'{cpu * 1e3:.0f} ms'} | "
            f"{r['predicted_step_time_s'] * 1e3:.0f} ({r['prediction_error']:+.0%}) |")
    train = [r for r in records if r.get("kind") == "training"]
    if train:
        lines += ["", "| training (digits) | Gbit/s | compressor | final accuracy | "
                      "time to target | step ms | wall s |", "|---|---|---|---|---|---|---|"]
        for r in train:
            if r["status"] != "ok":
                lines.append(f"| digits | {r['bandwidth_gbit']:g} | {r['compressor']} | "
                             f"{failure(r)} | | | |")
                continue
            ttt = r.get("time_to_target_s")
            lines.append(f"| digits | {r['bandwidth_gbit']:g} | {r['compressor']} | "
                         f"{r['accuracy']:.4f} | "
                         f"{'not reached' if ttt is None else f'{ttt:.1f} s'} "
                         f"(≥{r['target_accuracy']:.2f}) | {r['step_time_s'] * 1e3:.0f} | "
                         f"{r['train_seconds']:.1f} |")
    return "\n".join(lines)


def plot(records: Sequence[dict], outdir: str) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(outdir, exist_ok=True)
    written = []

    def save(fig, name: str) -> None:
        path = os.path.join(outdir, name)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    ok = [r for r in records if r["status"] == "ok"]
    replay = [r for r in ok if r.get("kind") == "replay"]
    models = [m for m in dict.fromkeys(r["workload"] for r in replay)]
    if models:
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False,
                                 dpi=80)
        for ax, m in zip(axes[0], models):
            rs = [r for r in replay if r["workload"] == m]
            for comp in dict.fromkeys(r["compressor"] for r in rs):
                pts = sorted((r["bandwidth_gbit"], r["step_time_s"], r["step_time_p90_s"])
                             for r in rs if r["compressor"] == comp)
                xs = [p[0] for p in pts]
                ys = [p[1] * 1e3 for p in pts]
                err = [[0] * len(pts), [(p[2] - p[1]) * 1e3 for p in pts]]
                style = "-o" if comp.startswith("thc") else \
                    "-s" if comp.startswith("lhc") else "--."
                ax.errorbar(xs, ys, yerr=err, fmt=style, capsize=2, label=comp, lw=1.2, ms=4)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(sorted({r["bandwidth_gbit"] for r in rs}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_yaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_yaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("link bandwidth (Gbit/s, tbf)")
            ax.set_ylabel("step time (ms, median; bar: p90)")
            ax.set_title(f"{m}, {rs[0]['workers']} workers, compute {rs[0]['compute_ms']:g} ms",
                         fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        for ax in axes[0]:   # each panel names its own lines (panels may run different sets)
            ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        save(fig, "bench_step_time.png")

        fig, ax = plt.subplots(figsize=(4.6, 4.2), dpi=80)
        for comp in dict.fromkeys(r["compressor"] for r in replay):
            rs = [r for r in replay if r["compressor"] == comp]
            ax.scatter([r["step_time_s"] * 1e3 for r in rs],
                       [r["predicted_step_time_s"] * 1e3 for r in rs], label=comp, s=14)
        lo = min(min(r["step_time_s"], r["predicted_step_time_s"]) for r in replay) * 1e3 * 0.8
        hi = max(max(r["step_time_s"], r["predicted_step_time_s"]) for r in replay) * 1e3 * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="gray",
                        alpha=0.15, label="±25%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step time (ms)")
        ax.set_ylabel("advisor's prediction (ms)")
        ax.set_title("byteps_thc.advisor against the replay runs", fontsize=9)
        ax.legend(fontsize=6)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        save(fig, "bench_advisor.png")

    if replay:  # bytes on the wire and step time per compressor, one group per workload+bandwidth
        groups = list(dict.fromkeys((r["workload"], r["bandwidth_gbit"]) for r in replay))
        fig, axes = plt.subplots(len(groups), 2, figsize=(9, 2.6 * len(groups) + 0.4),
                                 squeeze=False, dpi=80)
        for row, (m, bw) in zip(axes, groups):
            rs = [r for r in replay if r["workload"] == m and r["bandwidth_gbit"] == bw]
            names = [r["compressor"] for r in rs]
            colors = ["tab:orange" if n.startswith("thc") else
                      "tab:green" if n.startswith("lhc") else "tab:blue" for n in names]
            row[0].barh(names, [r["wire_bytes_per_step"] / 1e6 for r in rs], color=colors)
            row[0].set_xlabel("MB on the wire per step (all links, measured)")
            row[0].set_title(f"{m} at {bw:g} Gbit/s: bytes", fontsize=9)
            row[1].barh(names, [r["step_time_s"] for r in rs], color=colors,
                        xerr=[[0] * len(rs), [r["step_time_p90_s"] - r["step_time_s"] for r in rs]])
            row[1].set_xlabel("step time (s, median; bar: p90)")
            row[1].set_title(f"{m} at {bw:g} Gbit/s: step time", fontsize=9)
            for ax in row:
                ax.invert_yaxis()
                ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        save(fig, "bench_bytes_and_steps.png")

    train = [r for r in ok if r.get("kind") == "training" and r.get("accuracy_curve")]
    if train:
        fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=80)
        for r in train:
            t = [0.0] + [p[0] for p in r["accuracy_curve"]]
            v = [0.1] + [p[1] for p in r["accuracy_curve"]]
            ax.plot(t, v, "-o" if r["compressor"].startswith("thc") else "--.", ms=3,
                    label=f"{r['compressor']} ({r['accuracy']:.3f})")
        ax.axhline(train[0]["target_accuracy"], color="gray", lw=0.8, ls=":")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.5, 1.0)
        ax.set_title(f"digits MLP, {train[0]['workers']} workers, "
                     f"{train[0]['bandwidth_gbit']:g} Gbit/s", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        save(fig, "bench_accuracy.png")
    return written


def repredict(records: List[dict], costs) -> None:
    """The advisor's predictions for earlier replay records, made anew with the current model and
    this host's costs (the measured fields stay as they were)."""
    for r in records:
        if r.get("kind") != "replay":
            continue
        spec = parse_spec(r["compressor"], r["workers"])
        sc = _scenario(r["workload"], r["bandwidth_gbit"],
                       r.get("link_gbit_measured") or r["bandwidth_gbit"], r["compute_ms"],
                       r["workers"])
        pred = predict.predict_one(sc, spec, costs)
        r.update(_predicted(pred))
        if r.get("step_time_s"):
            r["prediction_error"] = (pred.step_s - r["step_time_s"]) / r["step_time_s"]


def report(records: List[dict], a: argparse.Namespace) -> None:
    """The table, the advisor's accuracy, and the plots and JSON asked for."""
    print()
    print(table(records))
    replay_ok = [r for r in records if r.get("kind") == "replay" and r["status"] == "ok"]
    if replay_ok:
        errs = [abs(r["prediction_error"]) for r in replay_ok]
        within = sum(e <= 0.25 for e in errs)
        print(f"\nadvisor: {within}/{len(errs)} replay runs within 25% "
              f"(median |error| {statistics.median(errs):.0%}, max {max(errs):.0%})")
    if a.plot and records:
        for p in plot(records, a.plot):
            log(f"wrote {p}")
    if a.from_json:
        save_records(a.json, records)
    if a.json:
        log(f"wrote {a.json} ({len(records)} records)")


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def preflight() -> Optional[str]:
    """None when a benchmark can run here, else why not."""
    return available() or fork_missing()


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bandwidths", type=parse_rates, default="1,10,25",
                    help="Gbit/s per link (1,10,25)")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="added one-way latency per link (needs the netem qdisc)")
    ap.add_argument("--workloads", default="resnet50,vgg16,bert-base,digits",
                    help="resnet50, vgg16, bert-base, ncf, digits, tiny")
    ap.add_argument("--compressors", default=DEFAULT_COMPRESSORS,
                    help=f"comma-separated ({DEFAULT_COMPRESSORS})")
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="per-step compute of the replay (default: each model's published "
                         "per-GPU step time: " + "; ".join(
                             f"{k} {v[1]:g} ms" for k, v in models.MODELS.items()) + ")")
    ap.add_argument("--steps", type=int, default=12, help="measured steps per replay run (max)")
    ap.add_argument("--min-steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--run-seconds", type=float, default=25.0,
                    help="aim for this many seconds of measured steps per replay run")
    ap.add_argument("--run-timeout", type=float, default=None,
                    help="seconds before a run counts as hung (default: from the prediction)")
    ap.add_argument("--train-bandwidth", type=float, default=1.0)
    ap.add_argument("--train-epochs", type=int, default=12)
    ap.add_argument("--train-compressors", default="none,fp16,thc,thc-n",
                    help="compressors of the digits training (none,fp16,thc,thc-n)")
    ap.add_argument("--target-acc", type=float, default=0.95)
    ap.add_argument("--nice", type=int, default=5, help="niceness of the cluster's processes")
    add_matrix_arguments(ap, subnet="198.18.0.0/24")
    ap.add_argument("--repredict", action="store_true",
                    help="with --from-json: the advisor's predictions made anew (current model, "
                         "this host's costs)")
    ap.add_argument("--costs", metavar="PATH", default=None,
                    help="the advisor's host costs from this JSON file (the format of "
                         "~/.cache/byteps_thc/advise-costs.json) instead of this host's")
    ap.add_argument("--from-json", metavar="PATHS",
                    help="run nothing: print the table and write --plot/--json from these "
                         "earlier --json outputs (comma-separated; merged in order)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.from_json:
        records = load_records(a.from_json)
        if a.repredict:
            repredict(records, load_costs(a.costs) if a.costs else host.host_costs())
        report(records, a)
        return 0
    why = preflight()
    if why:
        print(f"bench_network: cannot run: {why}", file=sys.stderr)
        return 2
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in REPLAY_MODELS + ("digits", "tiny"):
            print(f"bench_network: unknown workload {w!r}", file=sys.stderr)
            return 2
    specs = [parse_spec(s, a.workers) for s in a.compressors.split(",") if s.strip()]
    train_specs = [parse_spec(s, a.workers) for s in a.train_compressors.split(",")
                   if s.strip()]
    costs = load_costs(a.costs) if a.costs else host.host_costs()
    log(f"host costs for the advisor: {costs.source}")
    logdir = a.logdir or tempfile.mkdtemp(prefix="thcbench-")
    os.makedirs(logdir, exist_ok=True)
    matrix = Matrix(a.json, a.time_budget, log)
    plan = []
    for bw in a.bandwidths:
        for w in workloads:
            if w == "digits":
                if bw == a.train_bandwidth:
                    plan += [(bw, w, s) for s in train_specs]
            else:
                plan += [(bw, w, s) for s in specs]
    if "digits" in workloads and a.train_bandwidth not in a.bandwidths:
        plan += [(a.train_bandwidth, "digits", s) for s in train_specs]
    nodes = ["srv"] + [f"w{i}" for i in range(a.workers)]

    def runs(net: EmulatedNetwork) -> None:
        log(f"namespaces {net.prefix}-{{hub,{','.join(nodes)}}} on {a.subnet}; logs in {logdir}")
        link: Dict[float, float] = {}
        for i, (bw, w, spec) in enumerate(plan):
            if not matrix.due(f"{w}@{bw:g}/{spec.label}"):
                continue
            if net.rate_gbit != bw:
                net.set_rate(bw, a.latency_ms)
            if bw not in link:
                link[bw] = measure_tcp(net, "w0", "srv", seconds=1.5)
                log(f"links at {bw:g} Gbit/s (tbf): one TCP stream carries {link[bw]:.2f} Gbit/s")
            log(f"run {i + 1}/{len(plan)}: {w} {spec.label} at {bw:g} Gbit/s")
            if w == "digits":
                rec = run_training(net, a, spec, bw, link[bw], logdir)
                if rec["status"] == "ok":
                    log(f"  accuracy {rec['accuracy']:.4f}, {rec['step_time_s'] * 1e3:.0f} "
                        f"ms/step, time to {a.target_acc:g}: {rec['time_to_target_s']}")
            else:
                rec = run_replay(net, a, w, spec, bw, link[bw], costs, logdir)
                if rec["status"] == "ok":
                    log(f"  step {rec['step_time_s'] * 1e3:.0f} ms (p90 "
                        f"{rec['step_time_p90_s'] * 1e3:.0f}), wire "
                        f"{rec['wire_bytes_per_step'] / 1e6:.1f} MB/step, server CPU "
                        f"{(rec['server_cpu_s_per_step'] or 0) * 1e3:.0f} ms/step, CPU a "
                        f"worker {rec['worker_cpu_s_per_step'] * 1e3:.0f} ms/step; advisor "
                        f"{rec['predicted_step_time_s'] * 1e3:.0f} ms "
                        f"({rec['prediction_error']:+.0%})")
            if rec["status"] != "ok":
                log(f"  {rec['status']}: {rec.get('error', '')[:300]}")
            matrix.add(rec)

    interrupted = matrix.run(nodes, a.subnet, runs)
    report(matrix.records, a)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
