"""An MXNet worker for tests/cluster/test_mxnet_train.py: a stalled peer, then a failed cluster.

    mxnet_stall.py DELAY OUT_DIR

Stalls: worker 1 holds back its push of a tensor for DELAY seconds (run with
BYTEPS_THC_STALL_WARN well under DELAY) while worker 0 waits for it, two ways: a new tensor's
first push (BytePS's InitTensor blocks the script's thread) and a later push of a known tensor
(the wait is in MXNet's engine, where the result is read). Worker 0's log must name both.

Failure (byteps.mxnet.fail_cluster / cluster_failure): worker 0 pushes a tensor that worker 1
never pushes and fails its cluster 2 s later; worker 1 fails its own after DELAY. The push_pull
in flight and a later one raise mxnet.base.MXNetError with the reason. Writes
OUT_DIR/<what>_<rank>.txt: the exception (pending, later) and the reason cluster_failure() gave.
"""
import sys
import time

import failures  # tests/cluster/scripts/failures.py
import mxnet as mx

import byteps.mxnet as bps
from byteps.mxnet.ops import byteps_declare_tensor, byteps_push_pull

bps.init()
rank = bps.rank()
delay, out_dir = float(sys.argv[1]), sys.argv[2]


def stall():
    """Worker 1 arrives DELAY seconds after worker 0 (both in step at the previous push_pull)."""
    if rank == 1:
        time.sleep(delay)


def push(name, n=1000):
    x = mx.nd.ones(n)
    byteps_declare_tensor(name)
    byteps_push_pull(x, name=name, is_average=False)
    return x.asnumpy()


push("warm")
stall()
push("stall.first")          # a new tensor: worker 0 waits in the blocking first push
push("stall.again")
stall()
push("stall.again")          # a known tensor: worker 0 waits in the engine
push("sync")
print(f"rank {rank}: stalls done", flush=True)


caught = failures.catcher(out_dir, rank, mx.base.MXNetError)
failures.fail_cluster_twice(rank, delay, push, bps.fail_cluster, bps.cluster_failure, caught,
                            out_dir)
