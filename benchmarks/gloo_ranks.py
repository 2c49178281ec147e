"""What the torch.distributed benchmarks on the emulated network share (bench_ddp.py,
bench_fsdp.py): their common flags, the replay model, one gloo rank per namespace of
harness/netem.py's network under the launcher's Supervisor, and a rank's timed steps with the
bytes its eth0 carried.

A rank prints one line, TAG + JSON, on rank 0; `run_ranks` reads it back into the run's record.
"""
import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.runs import save_records
from byteps_thc.launch.supervisor import ProcSpec, Supervisor
from harness.netem import available, parse_rates

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def eth0(stat):
    """A counter of this namespace's eth0 (/sys/class/net/eth0/statistics/STAT)."""
    with open(f"/sys/class/net/eth0/statistics/{stat}") as f:
        return int(f.read())


def add_arguments(ap, models, bandwidths, warmup, warmup_help=None, timeout_help=None):
    """The arguments every gloo benchmark takes: the matrix (--models, --bandwidths: defaults
    `models`, `bandwidths`), --ranks, --steps, --warmup, --run-timeout, --json, and a rank's own
    (--worker, --model: hidden)."""
    ap.add_argument("--models", default=models)
    ap.add_argument("--bandwidths", type=parse_rates, default=bandwidths, help="Gbit/s per link")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    ap.add_argument("--run-timeout", type=float, default=300.0, help=timeout_help)
    ap.add_argument("--json", metavar="PATH", help="write the records here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)


def replay_module(shapes):
    """A torch module of zero parameters of `shapes` whose forward(gs) is sum_i <p_i, g_i>, so
    that the gradient of p_i is g_i: a model's communication without its compute."""
    import torch

    class Replay(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

        def forward(self, gs):
            return sum((p * g).sum() for p, g in zip(self.ps, gs))

    return Replay()


def timed_steps(step, warmup, steps):
    """`warmup` calls of step(), a barrier, then `steps` timed calls: the median step time, every
    step's time, the bytes per step that eth0 sent and received and this process's CPU seconds
    per step."""
    import torch.distributed as dist
    for _ in range(warmup):
        step()
    dist.barrier()
    times = []
    tx0, rx0, cpu0 = eth0("tx_bytes"), eth0("rx_bytes"), time.process_time()
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    tx1, rx1, cpu1 = eth0("tx_bytes"), eth0("rx_bytes"), time.process_time()
    dist.barrier()
    return {"step_s": statistics.median(times), "step_times_s": times,
            "bytes_per_step": (tx1 - tx0 + rx1 - rx0) / steps,
            "cpu_s_per_step": (cpu1 - cpu0) / steps}


def run_ranks(net, ranks, argv, port, tag, timeout, rec, name):
    """`argv` once per rank, rank r in namespace w{r} (gloo over eth0, rank 0's address the
    master's), under a Supervisor (`name` in its messages). Returns `rec` with the load average
    before and after, the outcome, and rank 0's TAG record; the outcome's message and every
    log's tail where that record is missing."""
    load0 = os.getloadavg()[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               MASTER_ADDR=net.addr["w0"], MASTER_PORT=str(port), WORLD_SIZE=str(ranks),
               GLOO_SOCKET_IFNAME="eth0")
    specs = [ProcSpec(f"rank {r}", "worker", net.argv(f"w{r}", argv), dict(env, RANK=str(r)))
             for r in range(ranks)]
    sup = Supervisor(specs, echo=False, keep_lines=True, err=sys.stderr, tag=name,
                     grace=30.0, timeout=timeout, shutdown_timeout=5.0, poll_interval=0.2)
    try:
        with sup:
            outcome = sup.wait()
    finally:
        net.kill_all()
    rec = dict(rec, status=outcome.kind, loadavg=[load0, os.getloadavg()[0]])
    for _, line in sup.logs["rank 0"].lines:
        if line.startswith(tag):
            rec.update(json.loads(line[len(tag):]))
    if "step_s" not in rec:
        rec["error"] = outcome.message
        rec["log_tail"] = {n: sup.logs[n].tail(30) for n in sup.logs}
    return rec


def pick(tool, what, given, known):
    """The comma-separated names `given` as a list, or None after saying why the benchmark cannot
    run: this host cannot build the emulated network, or some names are not `known`."""
    why = available()
    if why:
        print(f"{tool}: {why}", file=sys.stderr)
        return None
    names = given.split(",")
    bad = [n for n in names if n not in known]
    if bad:
        print(f"{tool}: unknown {what} {bad}; known: {', '.join(known)}", file=sys.stderr)
        return None
    return names


def keep(records, rec, path):
    """Print `rec` (a JSON line), add it to `records` and rewrite `path` with all of them, so that
    an interrupted matrix keeps what it measured."""
    print(json.dumps(rec), flush=True)
    records.append(rec)
    save_records(path, records)
