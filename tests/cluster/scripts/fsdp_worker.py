"""One rank of the THC reduce-scatter tests (tests/cluster/test_fsdp.py): gloo on 127.0.0.1.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python fsdp_worker.py SCENARIO OUT ...

The input of rank r at step s is `inputs(r, s, n)`: n shards of SIZE values, drawn from a seed
the test knows. Each rank saves what it saw to OUT/rank{r}.pt; the test recomputes the expected
values from the same inputs with the NumPy reference.
"""
import os

import numpy as np
import torch
import torch.distributed as dist

from byteps_thc import ThcConfig
from byteps_thc.fsdp import ThcReduceScatter
from tests.cluster.scripts.ddp_worker import block_scale_config

SIZE = 20000       # values per shard: blocks of 2^12 pad it to 20480 (<= 5%)
KEY = 3
NONFINITE = (1, 2)  # (rank, step): a NaN in that rank's input at that step


def inputs(rank, step, n, dtype=torch.float32):
    rng = np.random.default_rng(7919 * step + rank)
    scale = np.repeat(np.float32(10.0) ** rng.integers(-3, 1, size=n * SIZE // 100), 100)
    g = (rng.standard_normal(n * SIZE).astype(np.float32) * scale).astype(np.float32)
    if (rank, step) == NONFINITE:
        g[17] = np.nan
    return torch.from_numpy(g).to(dtype)


def call(comm, x, op):
    n = dist.get_world_size()
    out = comm.allocate((x.numel() // n,), dtype=x.dtype, device=x.device)
    work = comm(out, x, dist.group.WORLD, op, async_op=True)
    work.wait()
    return out


def run_exact(rank, n, out, dtype_name, ef, block="0"):
    dtype = getattr(torch, dtype_name)
    cfg = block_scale_config(n, block)
    comm = ThcReduceScatter(cfg, error_feedback=ef, key=KEY)
    comm.trace = []
    ops = [dist.ReduceOp.AVG, dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.AVG]
    got = [call(comm, inputs(rank, s, n, dtype), ops[s]) for s in range(4)]
    path = os.path.join(out, f"state{rank}.pt")
    torch.save(comm.state_dict(), path)
    fresh = ThcReduceScatter(cfg, error_feedback=ef, key=KEY)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    cont_a, cont_b = [], []
    for s in range(4, 6):
        cont_a.append(call(comm, inputs(rank, s, n, dtype), dist.ReduceOp.AVG))
        cont_b.append(call(fresh, inputs(rank, s, n, dtype), dist.ReduceOp.AVG))
    trace = [None if t is None else [np.asarray(m).tolist() for m in t] for t in comm.trace]
    torch.save({"got": got, "cont_a": cont_a, "cont_b": cont_b, "trace": trace,
                "stats": dict(comm.stats), "residual_bytes": comm.residual_bytes(),
                "config": comm.config}, os.path.join(out, f"rank{rank}.pt"))


def outcome(fn):
    try:
        fn()
        return "accepted"
    except ValueError as e:
        return "refused: " + str(e)


def run_refuse(rank, n, out):
    x = inputs(rank, 0, n)
    res = {}
    comm = ThcReduceScatter()
    res["op"] = outcome(lambda: call(comm, x, dist.ReduceOp.MAX))
    res["premul"] = outcome(lambda: call(comm, x, dist.ReduceOp.PREMUL_SUM(0.5)))
    res["ef"] = outcome(lambda: ThcReduceScatter(error_feedback="fp8"))
    cfg = ThcConfig.for_workers(n, bits=3) if rank == n - 1 else None
    res["config"] = outcome(lambda: call(ThcReduceScatter(cfg), x, dist.ReduceOp.AVG))
    call(comm, x, dist.ReduceOp.AVG)
    res["size"] = outcome(lambda: call(comm, x[:n * 8], dist.ReduceOp.AVG))
    sd = comm.state_dict()
    res["load_config"] = outcome(
        lambda: ThcReduceScatter(ThcConfig.for_workers(n, bits=3)).load_state_dict(sd))
    res["load_ef"] = outcome(lambda: ThcReduceScatter(error_feedback="off").load_state_dict(sd))
    res["load_world"] = outcome(
        lambda: ThcReduceScatter().load_state_dict(dict(sd, world_size=n + 1)))
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


if __name__ == "__main__":  # run as a script: its folder is on sys.path
    import gloo_scenarios

    gloo_scenarios.main({"exact": run_exact, "refuse": run_refuse})
