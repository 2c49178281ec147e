"""Train an MLP on scikit-learn's bundled digits with PyTorch DDP and the THC comm hook (no BytePS).

    torchrun --nproc-per-node 2 example/pytorch/train_digits_ddp.py                   # THC hook
    torchrun --nproc-per-node 2 example/pytorch/train_digits_ddp.py --compressor none # plain DDP
    torchrun --nproc-per-node 2 example/pytorch/train_digits_ddp.py --compressor fp16

The same model, data split, shards and per-rank batch order as train_digits.py (the BytePS
example), over gloo on CPU. `--compressor thc` registers byteps_thc.ddp.thc_hook with a
ThcHookState (`--thc-bits`, `--start-iter`, `--min-compress-bytes`); `fp16` registers PyTorch's
fp16_compress_hook; `none` leaves DDP's all-reduce. Prints per-epoch progress and, on every rank,
the final test accuracy and a digest of the parameters (the same on every rank). Without torchrun
(no RANK in the environment) it trains in this one process, without DDP.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from digits_torch import Digits, Group, make_model, param_digest, timed_train
from example import common


def parse_args(argv=None):
    p = common.digits_parser(__doc__, compressors=("thc", "none", "fp16"))
    p.set_defaults(compressor="thc")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--start-iter", type=int, default=0, help="uncompressed warm-up iterations")
    p.add_argument("--min-compress-bytes", type=int, default=65536)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    return p.parse_args(argv)


def register_hook(model, args):
    if args.compressor == "thc":
        from byteps_thc import ThcConfig
        from byteps_thc.ddp import ThcHookState, thc_hook
        n = dist.get_world_size()
        state = ThcHookState(config=ThcConfig.for_workers(n, bits=args.thc_bits),
                             min_compress_bytes=args.min_compress_bytes,
                             start_iter=args.start_iter)
        model.register_comm_hook(state, thc_hook)
        return state
    if args.compressor == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return None


def main(argv=None):
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    group = Group(distributed)
    rank, size = group.rank(), group.size()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))

    data = Digits(common, args, rank, size, dtype)

    net = make_model(args.hidden, dtype)  # the same seed on every rank; DDP broadcasts rank 0's
    model, state = net, None
    if distributed:
        model = DDP(net, bucket_cap_mb=args.bucket_cap_mb)
        state = register_hook(model, args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if rank == 0:
        hook = args.compressor if distributed else "none (one process)"
        print(data.banner(args, size, net, f"{args.dtype}, DDP hook {hook}"), flush=True)

    result = dict(timed_train(common, model, net, opt, data, args, rank, report=rank == 0),
                  accuracy=data.accuracy(net), digest=param_digest(net),
                  param_bytes=sum(p.numel() * p.element_size() for p in net.parameters()))
    if state is not None:
        result["thc"] = dict(state.stats)
        if rank == 0:
            print(f"THC hook: {state.stats}", flush=True)
    return common.finish(group, args, result)


if __name__ == "__main__":
    sys.exit(main())
