"""One rank of the THC comm-hook tests (tests/cluster/test_ddp_hook.py): gloo on 127.0.0.1.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python ddp_worker.py SCENARIO OUT_DIR

The gradient of parameter i at step s on rank r is `inputs(r, s, shapes)[i]`: the loss is
sum_i <p_i, g_i>, so what DDP leaves in p.grad is exactly what the hook returned. Each rank saves
what it saw to OUT_DIR/rank{r}.pt; the test recomputes the expected values from the same inputs.
"""
import dataclasses
import os

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from byteps_thc import ThcConfig
from byteps_thc.collective.rounds import default_config
from byteps_thc.ddp import ThcHookState, thc_hook

# sizes chosen so that DDP's buckets (cap 1 MB = 262144 fp32) change at the rebuild: the forward
# uses the parameters in another order than they were registered in
SHAPES = [(30000,), (200, 150), (7,), (50001,), (123, 45)]
FORWARD_ORDER = [3, 0, 4, 1, 2]
SMALL = 2  # float64 (DDP buckets by dtype): a bucket of its own, under min_compress_bytes
BUCKET_MB = 0.25
NONFINITE = (1, 1, 0)  # (rank, step, parameter): an Inf there makes that round non-finite


def inputs(rank, step, shapes, dtype=torch.float32):
    rng = np.random.default_rng(1000 * step + rank)
    out = []
    for i, shape in enumerate(shapes):
        if i == SMALL:  # exact in every dtype and in any summation order
            g = rng.integers(-8, 8, size=shape).astype(np.float32) / 4
        else:
            g = rng.standard_normal(shape).astype(np.float32) * np.float32(0.1 * (i + 1))
        if (rank, step, i) == NONFINITE:
            g.flat[5] = np.inf
        out.append(torch.from_numpy(g).to(torch.float64 if i == SMALL else dtype))
    return out


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64 if i == SMALL else dtype))
             for i, s in enumerate(SHAPES)])

    def forward(self, grads):
        return sum((self.ps[i] * grads[i]).sum() for i in FORWARD_ORDER)


def step(model, grads):
    model.zero_grad(set_to_none=True)
    model(grads).backward()
    return [p.grad.detach().clone() for p in model.module.ps]


def recorder(log, index_of):
    def hook(state, bucket):
        log.append((state.iteration, [index_of[id(p)] for p in bucket.parameters()]))
        return thc_hook(state, bucket)
    return hook


def wrap(net, state, log):
    model = DDP(net, bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(state, recorder(log, {id(p): i for i, p in enumerate(net.ps)}))
    return model


def block_scale_config(n, block):
    """The configuration of a test: "0" the default (None), "one" the default's with one norm
    per partition, else a scale per rotation block of that size."""
    if block == "0":
        return None
    if block == "one":
        return dataclasses.replace(default_config(n), block_scale=False)
    return dataclasses.replace(default_config(n), block_scale=True, rotation_block=int(block))


def run_exact(rank, n, out, dtype_name, start_iter, block="0", steps=3):
    start_iter = int(start_iter)
    dtype = getattr(torch, dtype_name)
    cfg = block_scale_config(n, block)
    state = ThcHookState(config=cfg, min_compress_bytes=1024, start_iter=start_iter)
    state.trace = []
    net, log = Net(dtype), []
    model = wrap(net, state, log)
    grads = [step(model, inputs(rank, s, SHAPES, dtype)) for s in range(steps)]
    # the state_dict round trip: the original state on a new wrapper of the same model, against
    # a fresh state loaded from torch.save/torch.load on a new wrapper of a copy of the model
    path = os.path.join(out, f"state{rank}.pt")
    torch.save(state.state_dict(), path)
    fresh = ThcHookState(config=cfg, min_compress_bytes=1024, start_iter=start_iter)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    net2 = Net(dtype)
    net2.load_state_dict(net.state_dict())
    log_a, log_b = [], []
    model_a, model_b = wrap(net, state, log_a), wrap(net2, fresh, log_b)
    cont_a, cont_b = [], []
    for s in range(steps, steps + 2):
        g = inputs(rank, s, SHAPES, dtype)
        cont_a.append(step(model_a, g))
        cont_b.append(step(model_b, g))
    trace = [(k, np.asarray(m).tolist()) for k, m in state.trace]  # block_scale: M_k lists
    torch.save({"grads": grads, "layouts": log, "layouts_a": log_a, "trace": trace,
                "cont_a": cont_a, "cont_b": cont_b, "stats": dict(state.stats),
                "config": dataclasses.asdict(state.config)},
               os.path.join(out, f"rank{rank}.pt"))


def run_mismatch(rank, n, out, what):
    kwargs = {}
    if rank == n - 1:
        kwargs = ({"config": ThcConfig.for_workers(n, bits=3)} if what == "config"
                  else {"start_iter": 5})
    state = ThcHookState(**kwargs)
    net = Net(torch.float32)
    model = DDP(net, bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(state, thc_hook)
    try:
        step(model, inputs(rank, 0, SHAPES))
        result = "accepted"
    except (ValueError, RuntimeError) as e:  # DDP re-raises the hook's error as it comes
        result = "refused: " + str(e)
    torch.save({"result": result}, os.path.join(out, f"rank{rank}.pt"))


def attempt(model, grads):
    try:
        step(model, grads)
        return "accepted"
    except (ValueError, RuntimeError) as e:  # DDP re-raises the hook's error as it comes
        return "refused: " + str(e)


def run_second(rank, n, out):
    """A state that has run an iteration, registered on another model's wrapper: refused; the
    way the refusal names (its state_dict loaded into a fresh state there): accepted."""
    state = ThcHookState(min_compress_bytes=1024)
    step(wrap(Net(torch.float32), state, []), inputs(rank, 0, SHAPES))
    other = DDP(Net(torch.float32), bucket_cap_mb=BUCKET_MB)
    other.register_comm_hook(state, thc_hook)
    second = attempt(other, inputs(rank, 2, SHAPES))  # step 1 holds worker.NONFINITE
    fresh = ThcHookState(min_compress_bytes=1024)
    fresh.load_state_dict(state.state_dict())
    moved = DDP(Net(torch.float32), bucket_cap_mb=BUCKET_MB)
    moved.register_comm_hook(fresh, thc_hook)
    moved_result = attempt(moved, inputs(rank, 2, SHAPES))
    torch.save({"second": second, "moved": moved_result,
                "steps": [s for _, s in fresh.state_dict()["steps"]]},
               os.path.join(out, f"rank{rank}.pt"))


def run_single(rank, n, out):
    state = ThcHookState(min_compress_bytes=0)
    net = Net(torch.float32)
    model = DDP(net, bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(state, thc_hook)
    grads = [step(model, inputs(rank, s, SHAPES)) for s in range(2)]
    torch.save({"grads": grads, "stats": dict(state.stats)}, os.path.join(out, f"rank{rank}.pt"))


if __name__ == "__main__":  # run as a script: its folder is on sys.path
    import gloo_scenarios

    gloo_scenarios.main({"exact": run_exact, "mismatch": run_mismatch, "second": run_second,
                         "single": run_single})
