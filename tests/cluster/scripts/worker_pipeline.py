"""Run in every worker of a real local cluster (bpslaunch --local N): push_pull known tensors
through BytePS's CPU worker pipeline (THC_NORM -> COMPRESS -> PUSH -> PULL -> DECOMPRESS) with THC
kwargs, and save inputs and outputs; tests/cluster/test_thc_server.py checks them against the codec
bit for bit.

    worker_pipeline.py OUT_DIR STEPS D
Declares, in this order (so their BytePS declared keys are 0, 1, ..., 6): "thc_f32" (float32,
THC), "thc_f16" (float16, THC, also ef_type=vanilla), "plain" (float32, uncompressed), "thc_zero"
(all zeros: the max norm is 0 and the result must be zeros), "thc_inplace" (float32, THC,
push_pull_inplace), "thc_sum" (float32, THC, average=False) and "thc_small" (THC kwargs on a
tensor below BYTEPS_MIN_COMPRESS_BYTES, which BytePS leaves uncompressed). On a CPU-only worker
THC reads the input tensor and decodes into the output (no host copies): push_pull must leave its
input alone, push_pull_inplace overwrite it. The THC tensors are averaged (the pull yields the
mean) except "thc_sum"; the uncompressed ones are averaged and summed and checked here, exactly.
"""
import os
import sys

import numpy as np
import torch

import byteps.torch as bps
from byteps.torch import ops
from byteps_thc import ThcConfig

bps.init()
rank, size = bps.rank(), bps.size()
out_dir, steps, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# THC_TEST_MISMATCH=1: every worker declares another seed (the server must refuse, the workers fail)
mismatch = os.environ.get("THC_TEST_MISMATCH") == "1"
kwargs = ThcConfig(seed=42 + (rank if mismatch else 0)).to_kwargs()
nan_rank = int(os.environ.get("THC_TEST_NAN_RANK", "-1"))  # this rank sends a NaN gradient
nan_step = int(os.environ.get("THC_TEST_NAN_STEP", "0"))  # ... at this step
if os.environ.get("THC_TEST_NONFINITE"):  # thc_nonfinite=error: the NaN fails the push_pull
    kwargs["thc_nonfinite"] = os.environ["THC_TEST_NONFINITE"]
ops.declare("thc_f32", **kwargs)
ops.declare("thc_f16", ef_type="vanilla", **kwargs)  # BytePS's EF switch: THC keeps its own
ops.declare("plain")
ops.declare("thc_zero", **kwargs)
ops.declare("thc_inplace", **kwargs)
ops.declare("thc_sum", **kwargs)
ops.declare("thc_small", **kwargs)  # 1000 floats: below BYTEPS_MIN_COMPRESS_BYTES (64 KiB)
for step in range(steps):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(d, generator=g) * (rank + 1)
    if rank == nan_rank and step == nan_step:
        x[d // 2] = float("nan")
    h = (torch.randn(d, generator=g) * 0.01).half()
    xc, hc = x.clone(), h.clone()
    y = ops.push_pull(xc, average=True, name="thc_f32")
    z = ops.push_pull(hc, average=True, name="thc_f16")
    same = torch.equal(xc.view(torch.int32), x.view(torch.int32))  # bits: NaN != NaN
    assert same and torch.equal(hc, h), "push_pull changed its input"
    w = x.clone()
    ops.push_pull_inplace(w, average=True, name="thc_inplace")
    s = ops.push_pull(x, average=False, name="thc_sum")
    for name, t in (("x", x), ("y", y), ("h", h), ("z", z), ("w", w), ("s", s)):
        np.save(f"{out_dir}/{name}_{rank}_{step}.npy", t.numpy())
    total = float(sum(range(1, size + 1)))  # the workers push 1, 2, ..., size: exact sums
    for name in ("plain", "thc_small"):
        p = torch.full((1000,), float(rank + 1))
        q = ops.push_pull(p, average=True, name=name)
        assert torch.all(q == total / size), (name, q[:4])
        q = ops.push_pull(p, average=False, name=name)
        assert torch.all(q == total), (name, q[:4])
    zero = ops.push_pull(torch.zeros(d), average=True, name="thc_zero")  # M = 0: zeros
    assert torch.count_nonzero(zero) == 0, zero[:4]
print(f"rank {rank}: {steps} steps done", flush=True)
