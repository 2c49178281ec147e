"""The replay worker: synthetic gradients push_pulled through the real BytePS stack, step by step.

A worker started by bpslaunch (`python -m byteps_thc.advisor.replay ...`) makes one parameter per
shape, sets a fixed random gradient on each before every step, optionally sleeps a compute time
(a GPU's forward + backward), and waits for byteps.torch's DistributedOptimizer to push_pull
every gradient. After the warm-up steps it measures a window of `steps` steps and prints one line,
RESULT_TAG + JSON:

    rank    this worker's rank
    times   seconds of each measured step (compute + communication)
    w0, w1  wall clock (time.time) at the start and the end of the window
    cpu     this process's CPU seconds (user + system, every thread: BytePS's loops, the codec,
            ps-lite, TCP sends made in its system calls) over the window (os.times)
    c0, c1  with --interface: that interface's rx_bytes/tx_bytes at the start and the end

A model with embedding tables (models.EMBEDDINGS, e.g. ncf) gets, on those tables, a fresh sparse
gradient every step: the rows a batch of Zipf-distributed ids touches (drawn with a seed of the
rank and the step, the ranks scattered over the rows by a fixed permutation) hold random values,
every other row is zero.

The advisor's calibration clusters (byteps_thc.advisor.calibrate) run it without compute; the
emulated-network benchmark (benchmarks/bench_network.py) with the models' shapes and compute.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence

from .models import EMBEDDINGS, MODELS, Embedding, model_shapes, zipf_probabilities

RESULT_TAG = "REPLAY_RESULT "


def worker_argv(steps: int, warmup: int, shapes: Optional[Sequence[Sequence[int]]] = None,
                model: Optional[str] = None, compute_ms: float = 0.0,
                interface: Optional[str] = None) -> List[str]:
    """The command line of one replay worker: a known `model`'s shapes, or `shapes`."""
    argv = [sys.executable, "-m", "byteps_thc.advisor.replay", "--steps", str(steps),
            "--warmup", str(warmup), "--compute-ms", repr(float(compute_ms))]
    if model is not None:
        argv += ["--model", model]
    else:
        argv += ["--shapes", ",".join("x".join(str(int(d)) for d in s) for s in shapes)]
    if interface:
        argv += ["--interface", interface]
    return argv


def results(lines: Iterable[str]) -> List[dict]:
    """The result of every worker whose output is among `lines`."""
    return [json.loads(ln[len(RESULT_TAG):]) for ln in lines if ln.startswith(RESULT_TAG)]


def parse_shapes(text: str) -> List[tuple]:
    """'1024x1024,1024' -> [(1024, 1024), (1024,)]."""
    return [tuple(int(d) for d in s.split("x")) for s in text.split(",") if s.strip()]


def _counters(interface: str) -> Dict[str, int]:
    out = {}
    for k in ("rx_bytes", "tx_bytes"):
        try:
            with open(f"/sys/class/net/{interface}/statistics/{k}") as f:
                out[k] = int(f.read())
        except OSError:
            out[k] = -1
    return out


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class _SparseRows:
    """One embedding table's per-step gradient: zero but in the rows this step's batch touched."""

    def __init__(self, emb: Embedding, shape: Sequence[int], rank: int):
        import numpy as np
        self.emb, self.rows, self.dim = emb, int(shape[0]), int(shape[1])
        self.cdf = np.cumsum(zipf_probabilities(self.rows, emb.zipf_s))
        self.perm = np.random.default_rng(7 + emb.tensor).permutation(self.rows)
        self.rank = rank

    def fill(self, grad, step: int) -> None:
        import numpy as np
        import torch
        # push_pull left the last step's result in `grad`: every worker's rows and, from a lossy
        # compressor, values elsewhere too
        grad.zero_()
        rng = np.random.default_rng([self.emb.tensor, self.rank, step])
        ranks = np.minimum(np.searchsorted(self.cdf, rng.random(self.emb.lookups)),
                           self.rows - 1)
        rows = np.unique(self.perm[ranks])
        vals = rng.standard_normal((rows.size, self.dim), dtype=np.float32) * np.float32(0.01)
        grad.index_copy_(0, torch.from_numpy(rows), torch.from_numpy(vals))


def run(shapes: Sequence[Sequence[int]], steps: int, warmup: int, compute_s: float = 0.0,
        interface: Optional[str] = None, label: str = "replay",
        embeddings: Sequence[Embedding] = ()) -> dict:
    """The replay loop inside a worker: prints its result line (the fields above) before BytePS
    shuts down (which may take a while on a busy host), and returns the result. `embeddings`:
    the tables among `shapes` that get a sparse gradient each step (class _SparseRows)."""
    # torch and the fork load only inside a worker: the driver side imports this module for its
    # command line and result tag, where neither may be installed
    import torch

    import byteps.torch as bps
    torch.set_num_threads(1)
    bps.init()
    rank = bps.rank()
    params = [torch.nn.Parameter(torch.zeros(tuple(s))) for s in shapes]
    named = [(f"layer{i:03d}", p) for i, p in enumerate(params)]
    opt = bps.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=named)
    gen = torch.Generator().manual_seed(1000 + rank)
    sparse = {e.tensor: _SparseRows(e, shapes[e.tensor], rank) for e in embeddings}
    grads = [None if i in sparse else torch.randn(tuple(s), generator=gen).mul_(0.01)
             for i, s in enumerate(shapes)]
    times: List[float] = []
    w0 = cpu0 = 0.0
    c0: Dict[str, int] = {}
    total = warmup + steps
    for step in range(total):
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):   # outside the timed step
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if g is None:
                    sparse[i].fill(p.grad, step)
                else:
                    p.grad.copy_(g)
        if step == warmup:
            c0 = _counters(interface) if interface else {}
            w0, cpu0 = time.time(), _cpu_seconds()
        t = time.perf_counter()
        if compute_s > 0:
            time.sleep(compute_s)          # forward + backward of a GPU
        opt.synchronize()                  # push_pull of every gradient, compressed as chosen
        if step >= warmup:
            times.append(time.perf_counter() - t)
        if rank == 0 and (step + 1) % max(1, total // 4) == 0:
            print(f"{label}: step {step + 1}/{total} {(time.perf_counter() - t) * 1e3:.0f} ms",
                  flush=True)
    c1 = _counters(interface) if interface else {}
    w1, cpu1 = time.time(), _cpu_seconds()
    out = {"rank": rank, "steps": steps, "times": times, "w0": w0, "w1": w1, "cpu": cpu1 - cpu0}
    if interface:
        out.update(c0=c0, c1=c1)
    print(RESULT_TAG + json.dumps(out), flush=True)
    bps.shutdown()
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m byteps_thc.advisor.replay",
                                 description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", choices=sorted(MODELS), help="a known model's parameter shapes")
    g.add_argument("--shapes", type=parse_shapes, help="e.g. 1024x1024,1024 (comma-separated)")
    ap.add_argument("--steps", type=int, default=30, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=0.0, help="slept before each push_pull")
    ap.add_argument("--interface", default=None,
                    help="record this interface's byte counters over the window (e.g. eth0)")
    a = ap.parse_args(argv)
    shapes = model_shapes(a.model) if a.model else a.shapes
    run(shapes, a.steps, a.warmup, a.compute_ms / 1e3, a.interface,
        label=f"replay {a.model or 'shapes'}", embeddings=EMBEDDINGS.get(a.model, ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
