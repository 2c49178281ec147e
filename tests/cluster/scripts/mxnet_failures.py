"""An MXNet worker for tests/cluster/test_mxnet_train.py: workers that declare THC with different
`bits` (rank 0: 4, rank 1: 3) must get a catchable mxnet.base.MXNetError, from a push_pull and
from DistributedTrainer.step, and the process goes on.

    mxnet_failures.py OUT_DIR
Writes OUT_DIR/<style>_<rank>.txt with the exception's class and message for style in push_pull,
trainer; prints the result of an uncompressed push_pull made after both.
"""
import sys

import failures  # tests/cluster/scripts/failures.py
import mxnet as mx
from mxnet import autograd, gluon

import byteps.mxnet as bps
from byteps.mxnet.ops import byteps_declare_tensor, byteps_push_pull

bps.init()
rank = bps.rank()
thc = bps.Compression.thc(bits=4 if rank == 0 else 3)
caught = failures.catcher(sys.argv[1], rank, mx.base.MXNetError)


def one_push_pull():
    # 64 Ki floats: above BYTEPS_MIN_COMPRESS_BYTES, so THC
    x = mx.nd.ones(1 << 16)
    # declared as DistributedTrainer declares its gradients: THC's kwargs, prefixed byteps_
    byteps_declare_tensor("mx.big", **{"byteps_" + k: v for k, v in thc.kwargs().items()})
    byteps_push_pull(x, name="mx.big", is_average=True)
    x.wait_to_read()


ok = caught("push_pull", one_push_pull)


def trainer_step():
    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(256, activation="relu", in_units=128), gluon.nn.Dense(10, in_units=256))
    net.initialize(mx.init.Xavier())
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                                     compression=thc)
    x, y = mx.nd.random.normal(shape=(32, 128)), mx.nd.arange(32) % 10
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    trainer.step(32)
    for p in net.collect_params().values():
        p.data().wait_to_read()


ok = caught("trainer", trainer_step) and ok

# the process goes on: an uncompressed push_pull still works
after = mx.nd.ones(4)
byteps_declare_tensor("mx.after")
byteps_push_pull(after, name="mx.after", is_average=False)
print(f"rank {rank}: after {after.asnumpy().tolist()}", flush=True)
if not ok:
    raise SystemExit("a THC push_pull with mismatched bits did not raise MXNetError")
bps.shutdown()
