"""What moving gradients through the real BytePS stack costs the CPU: a small calibration cluster.

    python -m byteps_thc.advisor.calibrate              # none, 8 tensors of one partition each
    python -m byteps_thc.advisor.calibrate --compressor topk-0.01+ef --json

The advisor's per-element costs (byteps_thc.advisor.costs.measure_elem_costs) time single
operations: a copy, a sum, THC's encode. What they leave out is everything between them: BytePS's
pipeline stages and their queues, ps-lite and ZeroMQ framing and copies, the kernel's TCP on both
ends, the wake-ups of every thread. This module measures that whole bill with the real stack:
`bpslaunch --local 2` (the scheduler, one server and two CPU workers on 127.0.0.1), each worker
push_pulling a few synthetic gradients through byteps.torch's DistributedOptimizer step after step
without pause (byteps_thc.advisor.replay, no compute: every step is communication), while this
process samples the CPU time (user + system, every thread) of every process of the cluster from
/proc/<pid>/stat. The workers report the wall-clock window of their measured steps and their own
CPU time (os.times) in it.

Result (`StackCost`): per step, the workers' and the server's CPU seconds and the payload bytes
of a step (known from the tensors and the compressor, byteps_thc.advisor.wire.wire_bytes), and
the host's busy time from /proc/stat over the same window (for a check: on an otherwise idle host it
should match the processes' sum; kernel work charged to no process shows as a difference).

Needs the BytePS fork (make byteps) and torch; takes 15-30 s per compressor on a 2-core host.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

from ..env import THREADPOOL_SIZE, threadpool_size
from ..launch.role import fork_missing
from ..launch.supervisor import ProcSpec, Supervisor, process_table
from . import replay
from .costs import HostCosts, host_key, load_costs, measure_elem_costs, partition_cpu
from .wire import codec_elems, launcher_flags, parse_spec, partitions, wire_bytes

RESULT_TAG = replay.RESULT_TAG                # the line a replay worker prints its result on
# one BytePS partition each (BYTEPS_PARTITION_BYTES 4096000 / 4): every push is one full message
DEFAULT_TENSORS = (1024000,) * 8


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class StackCost:
    compressor: str
    tensors: List[int]
    steps: int
    step_s: float              # wall time of one step (workers' window / steps)
    worker_cpu_s: float        # both workers together, per step (their own os.times)
    server_cpu_s: float        # the server process, per step (/proc samples)
    other_cpu_s: float         # the scheduler and the launcher, per step
    host_busy_s: float         # /proc/stat: all cores' non-idle time per step (whole host)
    up_bytes: float            # one worker's payload per step (wire.wire_bytes)
    down_bytes: float
    workers: int = 2
    foreign_cpu_s: float = 0.0  # host busy time neither the cluster's nor this process's, per step
    # both workers, per step, as this process's /proc samples saw them: the same CPU as
    # worker_cpu_s through the path the server's figure takes (a cross-check of that path)
    worker_cpu_sampled_s: float = 0.0

    @property
    def payload_bytes(self) -> float:
        """All links' payload of a step: n * (up + down)."""
        return self.workers * (self.up_bytes + self.down_bytes)

    @property
    def cluster_cpu_s(self) -> float:
        return self.worker_cpu_s + self.server_cpu_s + self.other_cpu_s

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(payload_bytes=self.payload_bytes, cluster_cpu_s=self.cluster_cpu_s)
        return d


def _role(pid: int, cache: Dict[int, str]) -> str:
    if pid not in cache:
        role = "other"
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(b"DMLC_ROLE="):
                        role = kv[10:].decode()
        except OSError:
            pass
        cache[pid] = role
    return cache[pid]


def _host_busy() -> float:
    """Seconds of non-idle time of all cores (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _interp(samples: List[tuple], t: float, key) -> float:
    """Linear interpolation of key(sample) at wall time t."""
    if t <= samples[0][0]:
        return key(samples[0])
    for a, b in zip(samples, samples[1:]):
        if a[0] <= t <= b[0]:
            va, vb = key(a), key(b)
            return va if b[0] == a[0] else va + (vb - va) * (t - a[0]) / (b[0] - a[0])
    return key(samples[-1])


def measure(spec_text: str = "none", tensors: Sequence[int] = DEFAULT_TENSORS, steps: int = 30,
            warmup: int = 3, workers: int = 2, timeout_s: float = 240.0,
            log=None) -> StackCost:
    """One calibration cluster for the compressor `spec_text` (wire.parse_spec syntax)."""
    spec = parse_spec(spec_text, workers)
    parts = partitions(tensors)
    up = down = 0.0
    for elems, comp in parts:
        u, d = wire_bytes(spec, elems, comp, workers)
        up, down = up + u, down + d
    run_dir = tempfile.mkdtemp(prefix="thcstack")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    # as benchmarks/bench_network.py's roles run: one OpenMP thread; the compression thread pool
    # bpslaunch gives the one worker of a machine (role mode)
    env.update(OMP_NUM_THREADS="1", BYTEPS_LOG_LEVEL="WARNING")
    env[THREADPOOL_SIZE.name] = str(threadpool_size(1))
    cmd = ([sys.executable, "-m", "byteps_thc.launch", "--local", str(workers), "--no-prefix"]
           + launcher_flags(spec) + ["--"]
           + replay.worker_argv(steps, warmup, shapes=[(int(n),) for n in tensors]))
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
    # the launcher is one process group to the Supervisor: SIGTERM lets it stop its cluster
    sup = Supervisor([ProcSpec("calibration", "worker", cmd, env, cwd=run_dir)], echo=False,
                     keep_lines=True, timeout=timeout_s, kill_timeout=10.0, poll_interval=0.2,
                     dirs=[run_dir], tag="stackcost")
    samples: List[tuple] = []          # (time, {role: cpu seconds}, host busy)
    roles: Dict[int, str] = {}
    seen: Dict[int, float] = {}        # pid -> CPU seconds (the latest sample that found it)
    stop = threading.Event()

    def sample(root: int):
        while not stop.is_set():
            stats = process_table()
            tree = {root}
            grew = True
            while grew:
                grew = False
                for pid, (ppid, _) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree:      # a process that exits keeps the CPU time it was last seen with
                if pid in stats:
                    seen[pid] = max(seen.get(pid, 0.0), stats[pid][1])
                    _role(pid, roles)
            by_role: Dict[str, float] = {}
            for pid, cpu in seen.items():
                by_role[roles[pid]] = by_role.get(roles[pid], 0.0) + cpu
            t = os.times()
            samples.append((time.time(), by_role, _host_busy(), t.user + t.system))
            stop.wait(0.2)

    sampler = None
    try:
        with sup:
            sampler = threading.Thread(target=sample, args=(sup.pids["calibration"],),
                                       daemon=True)
            sampler.start()
            outcome = sup.wait()
    finally:
        stop.set()
        if sampler is not None:
            sampler.join(timeout=5)
    lines = [line for _, line in sup.logs["calibration"].lines]
    if outcome.kind == "timeout":
        raise RuntimeError(f"stack calibration ({spec_text}) did not finish in {timeout_s:.0f} s:"
                           "\n" + "\n".join(lines[-12:]))
    returncode = sup.procs["calibration"].returncode
    results = [json.loads(ln[len(RESULT_TAG):]) for ln in lines if ln.startswith(RESULT_TAG)]
    if returncode != 0 or len(results) != workers:
        raise RuntimeError(f"stack calibration ({spec_text}) failed (exit {returncode}):\n"
                           + "\n".join(lines[-12:]))
    w0 = max(r["w0"] for r in results)
    w1 = min(r["w1"] for r in results)
    if not samples or samples[0][0] > w0 or samples[-1][0] < w1:
        raise RuntimeError("stack calibration: the CPU samples do not cover the measured steps")

    def role_cpu(role):
        return (_interp(samples, w1, lambda s: s[1].get(role, 0.0))
                - _interp(samples, w0, lambda s: s[1].get(role, 0.0)))
    span = w1 - w0
    per = span / steps                    # the window of the overlapping steps, per step
    wcpu = sum(r["cpu"] / (r["w1"] - r["w0"]) for r in results) * per
    server = role_cpu("server") / steps
    other = (role_cpu("scheduler") + role_cpu("other")) / steps
    busy = (_interp(samples, w1, lambda s: s[2]) - _interp(samples, w0, lambda s: s[2])) / steps
    me = (_interp(samples, w1, lambda s: s[3]) - _interp(samples, w0, lambda s: s[3])) / steps
    foreign = max(0.0, busy - wcpu - server - other - me)
    sampled = role_cpu("worker") / steps
    if log:
        log(f"stack {spec.label}: {per * 1e3:.1f} ms/step, CPU per step workers "
            f"{wcpu * 1e3:.1f} ms, server {server * 1e3:.1f} ms, other {other * 1e3:.1f} ms, "
            f"host busy {busy * 1e3:.1f} ms (others {foreign * 1e3:.1f} ms); payload "
            f"{workers * (up + down) / 1e6:.1f} MB/step")
    return StackCost(spec.label, [int(n) for n in tensors], steps, per, wcpu, server, other,
                     busy, up, down, workers, foreign, sampled)


# The calibration the advisor uses (host.measure_costs; `--calibrate`): two uncompressed runs
# (large and small partitions) price the stack per byte and per partition; one run per compressor
# prices what its real code costs beyond the advisor's own per-element figures (NumPy stand-ins
# for BytePS's compressors, the THC codec timed alone, F16C sums...).
SMALL_TENSORS = (16000,) * 200         # 64000 bytes each: below BYTEPS_MIN_COMPRESS_BYTES
CALIBRATED = ("fp16", "thc", "onebit+ef", "topk-0.01+ef", "randomk-0.01+ef", "dithering-8")
# LHC is calibrated where its codec's costs were measured (costs.LHC_KEYS): after its own top-k,
# since the calibration's gradients are dense
CALIBRATED_LHC = ("lhc-topk-0.01",)
# one tensor of 16 partitions, 64 MiB: above costs.LARGE_TENSOR_BYTES (and its fp16 cast too)
LARGE_TENSORS = (16 * 1024000,)


def calibrate(micro, steps: int = 20, log=None, codec=None) -> Dict[str, float]:
    """The advisor's stack costs (costs.STACK_KEYS) measured with real calibration clusters:
    two uncompressed runs (DEFAULT_TENSORS, SMALL_TENSORS), then one run per CALIBRATED
    compressor (and CALIBRATED_LHC where `micro` has LHC's costs) on DEFAULT_TENSORS.
    `micro`: the advisor's per-element costs (costs.HostCosts); `codec`: THC's codec costs
    (thc_encode, thc_decode, thc_add) of the codec this BytePS build runs (default: micro's), so
    that thc_xw/thc_xs hold BytePS's THC stages beyond the codec whatever codec the costs they
    are added to were measured with. See derive()."""
    texts = CALIBRATED + (CALIBRATED_LHC if micro.has_lhc else ())
    big = quiet_measure("none", DEFAULT_TENSORS, steps, log=log)
    small = quiet_measure("none", SMALL_TENSORS, steps, log=log)
    runs = [quiet_measure(text, DEFAULT_TENSORS, steps, log=log) for text in texts]
    large = [quiet_measure(text, LARGE_TENSORS, max(4, steps // 2), log=log)
             for text in ("none",) + texts]
    return derive(big, small, runs, micro, codec, [big] + list(runs), large)


def quiet_measure(spec_text: str, tensors: Sequence[int], steps: int, tries: int = 2,
                  max_foreign: float = 0.05, log=None) -> StackCost:
    """measure(), again (up to `tries` times in all) while other processes took more than
    `max_foreign` of the host's busy time: CPU time per operation grows when a busy neighbour
    shares the cores and caches (a compiler on a 2-core host raised it by up to a third). The
    quietest run."""
    best = None
    for i in range(tries):
        run = measure(spec_text, tensors, steps, log=log)
        if best is None or run.foreign_cpu_s / run.host_busy_s < \
                best.foreign_cpu_s / best.host_busy_s:
            best = run
        if run.foreign_cpu_s <= max_foreign * run.host_busy_s:
            break
        if log and i + 1 < tries:
            log(f"  others used {run.foreign_cpu_s / run.host_busy_s:.0%} of the busy time: again")
    return best


def derive(big: StackCost, small: StackCost, runs: Sequence[StackCost], micro,
           codec=None, partitioned: Sequence[StackCost] = (),
           large: Sequence[StackCost] = ()) -> Dict[str, float]:
    """What the advisor does not price yet, from calibration runs (n workers each):

      stack_byte_w  one worker's CPU seconds per payload byte it sends or receives
      stack_byte_s  the server's CPU seconds per payload byte through it
      stack_part_w  one worker's CPU seconds per partition it push_pulls (queues, messages)
      stack_part_s  the server's CPU seconds per partition push it serves
      <c>_xw, <c>_xs  per compressed element: one worker's, and the server's per push, CPU
                    beyond the per-element costs in `micro` and the stack (c: the compressor of
                    each run in `runs`)
      <c>_lw, <c>_ls  per element of a large tensor (each run in `large`, against the run of
                    the same compressor in `partitioned`): one worker's, the server's per push

    Per role, the two uncompressed runs (large and small partitions) give two equations
    cpu - micro = bytes * per_byte + partitions * per_partition; each compressor's run then
    leaves cpu - micro - stack, per compressed element. A compressor's extra may be negative
    (its real code is cheaper than the advisor's stand-in for it)."""
    out: Dict[str, float] = {}
    for role in ("w", "s"):
        rows = []
        for run in (big, small):
            n = run.workers
            parts = partitions(run.tensors)
            elems = sum(e for e, _ in parts)
            if role == "w":   # one worker: its two copies; its own bytes and partitions
                cpu = run.worker_cpu_s / n - 2 * micro["copy"] * elems
                rows.append((run.up_bytes + run.down_bytes, len(parts), cpu))
            else:             # the server: n pushes summed; everyone's bytes and partitions
                cpu = run.server_cpu_s - n * micro["add_f32"] * elems
                rows.append((run.payload_bytes, n * len(parts), cpu))
        (b1, p1, c1), (b2, p2, c2) = rows
        det = b1 * p2 - b2 * p1
        if det == 0:
            raise ValueError("the two uncompressed runs need different bytes per partition")
        out[f"stack_byte_{role}"] = max(0.0, (c1 * p2 - c2 * p1) / det)
        out[f"stack_part_{role}"] = max(0.0, (b1 * c2 - b2 * c1) / det)
    for run in runs:
        n = run.workers
        spec = parse_spec(run.compressor, n)
        parts = partitions(run.tensors)
        elems = sum(codec_elems(spec, e, c) for e, c in parts if c)
        mw = ms = 0.0
        base = micro
        if codec is not None and spec.name == "thc":
            base = HostCosts(dict(micro.per_elem, **{
                k: codec[k] for k in ("thc_encode", "thc_decode", "thc_add")}), "codec")
        for e, c in parts:
            w, s = partition_cpu(spec, e, c, n, base)
            mw, ms = mw + w, ms + s
        wstack = (run.up_bytes + run.down_bytes) * out["stack_byte_w"] + \
            len(parts) * out["stack_part_w"]
        sstack = run.payload_bytes * out["stack_byte_s"] + n * len(parts) * out["stack_part_s"]
        out[f"{spec.name}_xw"] = (run.worker_cpu_s / n - mw - wstack) / elems
        out[f"{spec.name}_xs"] = (run.server_cpu_s - ms - sstack) / (n * elems)
    # large tensors: CPU per element of one large tensor against partition-sized tensors of the
    # same compressor (both runs are whole partitions of the same size: nothing else differs)
    for lr in large:
        pr = next(r for r in partitioned if r.compressor == lr.compressor)
        n = lr.workers
        name = parse_spec(lr.compressor, n).name
        le, pe = sum(lr.tensors), sum(pr.tensors)
        out[f"{name}_lw"] = (lr.worker_cpu_s / le - pr.worker_cpu_s / pe) / n
        out[f"{name}_ls"] = (lr.server_cpu_s / le - pr.server_cpu_s / pe) / n
    return out


def available() -> Optional[str]:
    """None when a calibration cluster can run here, else why not."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return fork_missing()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m byteps_thc.advisor.calibrate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--compressor", default="none",
                    help="the advisor's syntax: none, thc, topk-0.01+ef")
    ap.add_argument("--tensors", default=",".join(map(str, DEFAULT_TENSORS)),
                    help="element counts of the synthetic gradients (comma-separated)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calibrate", metavar="OUT",
                    help="run the advisor's whole calibration and write a costs file (the "
                         "format of ~/.cache/byteps_thc/advise-costs.json) to OUT")
    ap.add_argument("--micro-costs", metavar="PATH",
                    help="with --calibrate: the per-element costs the stack's are added to (a "
                         "costs file; default: measured now). THC's extras are taken against "
                         "the codec as byteps_thc._C runs it now, which must be the codec of the "
                         "installed BytePS build")
    ap.add_argument("--median", metavar="PATHS",
                    help="with --calibrate OUT: run nothing, write to OUT the per-key median of "
                         "these calibrated costs files (comma-separated; repeated calibrations)")
    a = ap.parse_args(argv)
    if a.median:
        if not a.calibrate:
            ap.error("--median needs --calibrate OUT")
        files = [json.load(open(p)) for p in a.median.split(",") if p.strip()]
        per = dict(files[0]["per_elem"])
        for k in per:
            per[k] = statistics.median(f["per_elem"][k] for f in files)
        with open(a.calibrate, "w") as f:
            json.dump({"host": files[0].get("host", ""), "per_elem": per,
                       "source": files[0].get("source", "") + f"; median of {len(files)} "
                       "calibrations"}, f, indent=1)
        print(f"wrote {a.calibrate}")
        return 0
    tensors = [int(x) for x in a.tensors.split(",") if x.strip()]
    why = available()
    if why:
        print(f"calibrate: cannot run: {why}", file=sys.stderr)
        return 2
    if a.calibrate:
        now = measure_elem_costs()
        micro = load_costs(a.micro_costs) if a.micro_costs else now
        print("THC codec now (byteps_thc._C; BytePS's build should run the same): "
              + ", ".join(f"{k} {now[k] * 1e9:.3f} ns" for k in
                          ("thc_encode", "thc_decode", "thc_add")), flush=True)
        extra = calibrate(micro, a.steps, log=lambda m: print(m, flush=True), codec=now)
        for k, v in extra.items():
            print(f"  {k:14s} {v * 1e9:9.4f} ns")
        per = {k: v for k, v in micro.per_elem.items() if k not in extra}
        per.update(extra)
        with open(a.calibrate, "w") as f:
            json.dump({"host": host_key(), "per_elem": per,
                       "source": micro.source.replace(" (cached)", "")
                       + "; stack: calibration clusters (bpslaunch --local 2, loopback)"},
                      f, indent=1)
        print(f"wrote {a.calibrate}")
        return 0
    res = measure(a.compressor, tensors, a.steps, a.warmup,
                  log=None if a.json else (lambda m: print(m, flush=True)))
    if a.json:
        print(json.dumps(res.as_dict(), indent=1))
    else:
        print(f"CPU per payload byte: workers {res.worker_cpu_s / res.payload_bytes * 1e9:.3f} ns, "
              f"server {res.server_cpu_s / res.payload_bytes * 1e9:.3f} ns, all processes "
              f"{res.cluster_cpu_s / res.payload_bytes * 1e9:.3f} ns, host (/proc/stat) "
              f"{res.host_busy_s / res.payload_bytes * 1e9:.3f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
