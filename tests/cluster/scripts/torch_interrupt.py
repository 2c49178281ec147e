"""Ctrl-C in a blocked synchronize() (tests/cluster/test_torch_apis.py), written as a user would.

Rank 1 starts its push_pull THC_TEST_LATE_S seconds late, so rank 0's synchronize() waits for
it; one second in, rank 0 sends itself SIGINT. Prints how long rank 0 waited before the
KeyboardInterrupt, then each rank's result of synchronizing the same handle again.
"""
import os
import signal
import threading
import time

import torch

import byteps.torch as bps
from byteps.torch.ops import push_pull_async, synchronize

bps.init()
rank = bps.rank()
x = torch.full((1000,), float(rank + 1))
if rank == 1:
    time.sleep(float(os.environ["THC_TEST_LATE_S"]))
handle = push_pull_async(x, average=False, name="late")
if rank == 0:
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        synchronize(handle)
        print("rank 0: no KeyboardInterrupt", flush=True)
    except KeyboardInterrupt:
        print(f"rank 0: KeyboardInterrupt after {time.monotonic() - t0:.1f} s", flush=True)
y = synchronize(handle)
print(f"rank {rank}: sum {y[0].item()} of {y.numel()}", flush=True)
bps.shutdown()
