"""Train an MLP on scikit-learn's bundled digits under FSDP2 (fully_shard), reduced by THC.

    torchrun --nproc-per-node 2 example/pytorch/train_digits_fsdp.py                   # THC
    torchrun --nproc-per-node 2 example/pytorch/train_digits_fsdp.py --compressor none # plain FSDP
    torchrun --nproc-per-node 2 example/pytorch/train_digits_fsdp.py --reduce-dtype bfloat16

The same model, data split, shards and per-rank batch order as train_digits_ddp.py, over gloo on
CPU. Each Linear layer is its own fully_shard module (its own param group); with
`--compressor thc` each gets a byteps_thc.fsdp.ThcReduceScatter of its own key
(`--thc-bits`, `--error-feedback fp32|bf16|off`); `--reduce-dtype` sets FSDP's
MixedPrecisionPolicy(reduce_dtype=...), the dtype the gradients are reduced in. Every rank
prints the final test accuracy and a digest of the gathered parameters (the same on every rank).
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from digits_torch import Digits, Group, make_model, timed_train
from example import common


def parse_args(argv=None):
    p = common.digits_parser(__doc__, compressors=("thc", "none"))
    p.set_defaults(compressor="thc")
    p.add_argument("--reduce-dtype", choices=("float32", "bfloat16", "float16"),
                   default="float32")
    p.add_argument("--error-feedback", choices=("fp32", "bf16", "off"), default="fp32")
    return p.parse_args(argv)


def shard(net, args):
    """fully_shard each Linear, then the root; THC's comm on each Linear's param group."""
    policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, args.reduce_dtype))
    comms = []
    for i, layer in enumerate(m for m in net if isinstance(m, torch.nn.Linear)):
        fully_shard(layer, mp_policy=policy)
        if args.compressor == "thc":
            from byteps_thc import ThcConfig
            from byteps_thc.fsdp import ThcReduceScatter
            cfg = ThcConfig.for_workers(dist.get_world_size(), bits=args.thc_bits)
            comm = ThcReduceScatter(cfg, error_feedback=args.error_feedback, key=i)
            layer.set_custom_reduce_scatter(comm)
            comms.append(comm)
    fully_shard(net, mp_policy=policy)
    return comms


def gathered(net, dtype, hidden):
    """A plain copy of the model with the full parameters (all_gather of every shard, in the
    order of the names, the same on every rank), and their digest."""
    full = {name: p.full_tensor().detach() for name, p in sorted(net.named_parameters())}
    h = hashlib.sha256()
    for name, t in full.items():
        h.update(name.encode())
        h.update(t.float().contiguous().numpy().tobytes())
    plain = make_model(hidden, dtype)
    plain.load_state_dict(full)
    return plain, h.hexdigest()[:16]


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("gloo")
    group = Group()
    rank, size = group.rank(), group.size()
    dtype = torch.float32
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))

    data = Digits(common, args, rank, size, dtype)
    net = make_model(args.hidden, dtype)  # the same seed on every rank: the same shards
    comms = shard(net, args)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    if rank == 0:
        print(data.banner(args, size, net, f"fully_shard, reduce {args.reduce_dtype} by "
                                           f"{args.compressor}"), flush=True)

    # no per-epoch evaluation: a forward on one rank alone would wait for the others' shards
    result = timed_train(common, net, net, opt, data, args, rank, report=False)
    plain, digest = gathered(net, dtype, args.hidden)
    result.update(accuracy=data.accuracy(plain), digest=digest)
    if comms:
        stats = {k: sum(c.stats[k] for c in comms) for k in comms[0].stats}
        result["thc"] = dict(stats, residual_bytes=sum(c.residual_bytes() for c in comms))
        if rank == 0:
            print(f"THC reduce-scatter: {result['thc']}", flush=True)
    return common.finish(group, args, result)


if __name__ == "__main__":
    sys.exit(main())
