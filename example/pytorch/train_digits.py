"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with BytePS.

    bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py
    bpslaunch --local 2 -- python example/pytorch/train_digits.py          # uncompressed

Every worker trains on its own shard of the training set; gradients are averaged by BytePS, with
whatever compression `bpslaunch --compressor` chose (or `--compressor` here, which overrides it,
except `--compressor none`: like upstream's `Compression.none`, it leaves the choice to bpslaunch).
Prints per-epoch progress and the final test accuracy. `--stats-json` writes what rank 0 measured
(accuracy, steps, bytes that crossed the loopback interface during training), for scripts/demo.py.

`--device cuda` puts the model, the data and so the gradients on this worker's GPU (BytePS's local
rank; the fork must be built with its CUDA worker, BYTEPS_THC_CPU_ONLY=0); the default is the CPU.
The batch order and the initial weights do not depend on the device.

Without a BytePS launcher (no DMLC_ROLE) it trains in this one process, uncompressed.
"""
import sys
import time

import torch

from digits_torch import Digits, make_model, param_digest, train
from example import common


def parse_args(argv=None):
    p = common.digits_parser(__doc__)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model and its gradients live (cuda: the local rank's GPU)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device "
                 f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    bps, distributed = common.start("torch")
    rank, size = bps.rank(), bps.size()
    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda", bps.local_rank()) if args.device == "cuda" else "cpu"
    device = torch.device(device)

    data = Digits(common, args, rank, size, dtype, device)

    model = make_model(args.hidden, dtype, device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    compression_name = "none"
    if distributed:
        # env: None, and DistributedOptimizer takes what bpslaunch --compressor chose
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=common.choose_compression(bps, args))
        compression_name = repr(opt._compression) if hasattr(opt, "_compression") else "?"
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.broadcast_optimizer_state(opt, root_rank=0)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"digits: {data.n_train} training and {len(data.y_te)} test images, "
              f"{size} worker(s), {data.steps_per_epoch} steps/epoch of {args.batch_size} "
              "per worker, "
              f"MLP 64-{args.hidden}-{args.hidden}-10 ({n_params} parameters, {args.dtype}), "
              f"compression {compression_name}, on {device}", flush=True)

    def barrier(tag):
        if distributed and size > 1:
            t = torch.zeros(1, device=device)
            bps.push_pull(t, average=False, name=f"barrier.{tag}")

    barrier("start")
    tx0, t0 = common.loopback_tx_bytes(), time.perf_counter()
    steps = train(model, model, opt, data, args, rank)
    barrier("end")
    seconds = time.perf_counter() - t0
    result = dict(common.wire_stats(tx0, common.loopback_tx_bytes(), steps),
                  accuracy=data.accuracy(model), steps=steps, seconds=seconds,
                  digest=param_digest(model), device=str(device),
                  param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    return common.finish(bps, args, result)


if __name__ == "__main__":
    sys.exit(main())
