"""An MXNet worker for tests/cluster/test_mxnet_train.py: THC and uncompressed push_pulls with
is_average True and False, whose results the test checks against the reference.

    mxnet_scale.py OUT_DIR
Two steps of a THC tensor of 300,000 floats declared "thc_avg" and one declared "thc_sum" (keys 0
and 1, two partitions each: the launcher's BYTEPS_PARTITION_BYTES is not ours to rely on, so it is
set here), each step's input and output saved as OUT_DIR/{x,y,s}_<rank>_<step>.npy; then prints
one REPORT line with the distinct values of uncompressed float32 averages and sums. "f32" is
never declared: byteps_push_pull declares it (patch 0095), as torch's and TensorFlow's do.
"""
import json
import os
import sys

os.environ["BYTEPS_PARTITION_BYTES"] = "1024000"  # 256,000 floats a partition

import mxnet as mx
import numpy as np

import byteps.mxnet as bps
from byteps.mxnet.ops import byteps_declare_tensor, byteps_push_pull

bps.init()
rank, out = bps.rank(), sys.argv[1]
kwargs = {"byteps_" + k: v for k, v in bps.Compression.thc().kwargs().items()}
for name in ("thc_avg", "thc_sum"):  # declared first: keys 0 and 1
    byteps_declare_tensor(name, **kwargs)
for step in range(2):
    g = np.random.default_rng(1000 * step + rank)
    x = (g.standard_normal(300_000) * (rank + 1)).astype(np.float32)
    for tag, name, average in (("y", "thc_avg", True), ("s", "thc_sum", False)):
        t = mx.nd.array(x, dtype="float32")
        byteps_push_pull(t, name=name, is_average=average)
        np.save(os.path.join(out, f"{tag}_{rank}_{step}.npy"), t.asnumpy())
    np.save(os.path.join(out, f"x_{rank}_{step}.npy"), x)
got = {}
for average in (True, False):
    t = mx.nd.full((1000,), float(rank + 1), dtype="float32")
    byteps_push_pull(t, name="f32", is_average=average)
    got["f32_" + ("avg" if average else "sum")] = sorted(set(t.asnumpy().tolist()))
print("REPORT " + json.dumps(got), flush=True)
bps.shutdown()
