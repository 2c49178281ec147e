"""Soak: real THC training on a `--local` cluster for a long while, with the resident memory (RSS)
of every process sampled from /proc; exits non-zero when memory grows after warm-up.

    python benchmarks/soak.py                      # 10 minutes, 2 workers (make soak)
    python benchmarks/soak.py --minutes 2          # shorter

The cluster is `bpslaunch --local N --compressor thc` as the launcher builds it
(byteps_thc.launch: local_cluster_specs, compression_env, Supervisor), training
tests/cluster/scripts/torch_synthetic.py (an MLP whose two weight matrices go through THC) until
the time is up; then the soak stops it. Any process that fails earlier fails the soak.

Growth rule: the samples of the first `--warmup` fraction of the run are dropped (allocator
pools, BytePS's buffers and torch's caches fill up there). Over the rest, a least-squares line of
RSS against time is fitted per process; its slope, in MiB per minute, must not exceed
`--max-slope` for any process. A leak of a few hundred bytes per step shows as a steady slope;
allocator noise moves the samples up and down but not the fitted line, over hundreds of samples.
The record also gives, per process, the max of the last quarter against the max of the second.

Writes benchmarks/results/soak.json (every sample, the figures and the verdict) and soak_rss.png
(when matplotlib is installed).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from typing import Dict, List, Optional

from byteps_thc import env
from byteps_thc.launch import (
    Supervisor,
    compression_env,
    fork_missing,
    local_cluster_specs,
    parse_args,
    shm_prefixes,
)
from byteps_thc.launch.supervisor import child_pids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "torch_synthetic.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
MIB = 1024.0 * 1024.0
BATCHES_PER_ITER = 20  # torch_synthetic prints one "Iter #" line per this many steps


def rss_bytes(pid: int) -> Optional[int]:
    """Resident set size of `pid` (/proc/PID/statm, pages); None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def tree_rss(pid: int) -> Optional[int]:
    """RSS of `pid` plus that of its live direct children (none for BytePS's roles today)."""
    own = rss_bytes(pid)
    if own is None:
        return None
    return own + sum(r for r in map(rss_bytes, child_pids(pid)) if r is not None)


def fit_slope(ts: List[float], ys: List[float]) -> float:
    """Least-squares slope of ys against ts."""
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0


def analyse(samples: Dict[str, List[List[float]]], duration: float, warmup: float,
            max_slope: float) -> Dict[str, dict]:
    """Per process: RSS at warm-up and at the end (MiB), the fitted slope (MiB/min) and the
    quarter maxima; `grows` when the slope exceeds max_slope."""
    out = {}
    for name, pts in samples.items():
        kept = [(t, r) for t, r in pts if t >= warmup * duration]
        if len(kept) < 3:
            out[name] = {"error": f"only {len(kept)} samples after warm-up"}
            continue
        ts = [t / 60.0 for t, _ in kept]
        ys = [r / MIB for _, r in kept]
        q = [[r / MIB for t, r in pts if k * duration / 4 <= t < (k + 1) * duration / 4]
             for k in range(4)]
        slope = fit_slope(ts, ys)
        out[name] = {
            "rss_warm_mib": round(ys[0], 2), "rss_end_mib": round(ys[-1], 2),
            "rss_min_mib": round(min(ys), 2), "rss_max_mib": round(max(ys), 2),
            "slope_mib_per_min": round(slope, 4),
            "q2_max_mib": round(max(q[1]), 2) if q[1] else None,
            "q4_max_mib": round(max(q[3]), 2) if q[3] else None,
            "samples_fitted": len(kept), "grows": slope > max_slope,
        }
    return out


def plot(samples, duration, warmup, compressor, path) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, pts in samples.items():
        ax.plot([t / 60 for t, _ in pts], [r / MIB for _, r in pts], label=name)
    ax.axvline(warmup * duration / 60, color="grey", ls="--", lw=1, label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_yscale("log")
    ax.set_title(f"soak: RSS of every process (compressor {compressor}, bpslaunch --local)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def count_steps(log_path: str) -> int:
    try:
        with open(log_path, errors="replace") as f:
            return sum(1 for line in f if line.startswith("Iter #")) * BATCHES_PER_ITER
    except OSError:
        return 0


def tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to train")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between RSS samples")
    ap.add_argument("--warmup", type=float, default=0.2,
                    help="fraction of the run whose samples the growth rule drops")
    ap.add_argument("--max-slope", type=float, default=1.0,
                    help="largest allowed RSS slope after warm-up, MiB/min, per process")
    ap.add_argument("--compressor", choices=("thc", "none"), default="thc",
                    help="none: the same training uncompressed (a baseline for the figures)")
    ap.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width")
    ap.add_argument("--out", default=RESULTS, help="where soak.json and soak_rss.png go")
    a = ap.parse_args(argv)
    missing = fork_missing()
    if missing:
        print(f"soak: {missing}", file=sys.stderr)
        return 2
    duration = a.minutes * 60.0
    cmd = [sys.executable, SCRIPT, "--hidden", str(a.hidden), "--num-warmup-batches", "2",
           "--num-batches-per-iter", str(BATCHES_PER_ITER), "--num-iters", "100000000"]
    flags = ["--compressor", "thc"] if a.compressor == "thc" else []
    ns = parse_args(["--local", str(a.workers)] + flags + ["--"] + cmd)
    run_dir = tempfile.mkdtemp(prefix="bps-soak")
    logs = tempfile.mkdtemp(prefix="soak-logs")
    specs = local_cluster_specs(a.workers, 1, cmd, dict(os.environ), run_dir,
                                extra_env=compression_env(ns, os.environ))
    for s in specs:
        s.log = os.path.join(logs, s.name.replace(" ", "") + ".log")
        if s.role == "worker":
            os.makedirs(s.env[env.SOCKET_PATH.name], exist_ok=True)
    samples: Dict[str, List[List[float]]] = {s.name: [] for s in specs}
    failure = None
    print(f"soak: {a.workers} workers, compressor {a.compressor}, {a.minutes:g} min, RSS every "
          f"{a.interval:g}s; logs in {logs}", flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    with Supervisor(specs, echo=False, tag="soak", dirs=[run_dir],
                    shm_prefixes=shm_prefixes(specs)) as sup:
        t0 = time.monotonic()
        next_sample = t0
        while (now := time.monotonic()) - t0 < duration:
            outcome = sup.poll()
            if outcome is not None:
                failure = outcome.message or f"the cluster ended early (exit {outcome.code})"
                break
            if now >= next_sample:
                for name, pid in sup.pids.items():
                    r = tree_rss(pid)
                    if r is not None:
                        samples[name].append([round(now - t0, 2), r])
                next_sample += a.interval
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
    load_end = os.getloadavg()
    steps = count_steps(specs[-a.workers].log)
    figures = analyse(samples, duration, a.warmup, a.max_slope)
    grows = [n for n, f in figures.items() if f.get("grows") or "error" in f]
    if failure is None and steps == 0:
        failure = "worker 0 reported no training step (see its log)"
    record = {
        "date": started.isoformat(timespec="seconds"), "host": platform.node(),
        "cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": load_end,
        "byteps": list(importlib.util.find_spec("byteps").submodule_search_locations)[0],
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "workers": a.workers, "compressor": a.compressor, "minutes": a.minutes,
        "elapsed_s": round(elapsed, 1),
        "interval_s": a.interval, "warmup_fraction": a.warmup, "max_slope_mib_per_min": a.max_slope,
        "rule": "least-squares slope of RSS vs time over the samples after warm-up, per process",
        "steps_worker0": steps, "failure": failure, "growing": grows,
        "processes": figures, "samples": samples,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "soak.json"), "w") as f:
        json.dump(record, f, indent=1)
    png = plot(samples, duration, a.warmup, a.compressor, os.path.join(a.out, "soak_rss.png"))
    print(f"soak: {elapsed:.0f}s, {steps} steps on worker 0; load {load_start[0]:.1f} -> "
          f"{load_end[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'process':<10} {'warm MiB':>9} {'end MiB':>9} {'slope MiB/min':>14} "
          f"{'q2 max':>8} {'q4 max':>8}")
    for name, f in figures.items():
        if "error" in f:
            print(f"{name:<10} {f['error']}")
            continue
        print(f"{name:<10} {f['rss_warm_mib']:>9.1f} {f['rss_end_mib']:>9.1f} "
              f"{f['slope_mib_per_min']:>14.3f} {f['q2_max_mib']:>8.1f} {f['q4_max_mib']:>8.1f}")
    print(f"soak: wrote {os.path.join(a.out, 'soak.json')}"
          + (f" and {png}" if png else " (no plot: matplotlib is not installed)"))
    if failure:
        print(f"soak: FAILED: {failure}", file=sys.stderr)
        for s in specs:
            print(f"--- {s.name}:\n{tail(s.log)}", file=sys.stderr)
        return 1
    if grows:
        print(f"soak: FAILED: RSS grows after warm-up (> {a.max_slope:g} MiB/min): "
              f"{', '.join(grows)}", file=sys.stderr)
        return 1
    print(f"soak: ok, no process grows by more than {a.max_slope:g} MiB/min after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
