"""A synthetic-data PyTorch benchmark written the way BytePS's and Horovod's examples are.

It knows nothing of byteps-thc: it passes `compression=bps.Compression.none` explicitly (or
`.fp16` with --fp16-pushpull), as upstream's scripts do, and leaves everything else to the
launcher. tests/cluster/test_compressor_flag.py runs it under `bpslaunch --compressor ...`.
"""
import synthetic  # tests/cluster/scripts/synthetic.py
import torch
import torch.optim as optim

import byteps.torch as bps

parser = synthetic.parser("PyTorch synthetic benchmark")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

bps.init()
torch.manual_seed(1234)
if args.cuda:
    torch.cuda.set_device(bps.local_rank())

model = synthetic.mlp(torch, args)
if args.cuda:
    model.cuda()

optimizer = optim.SGD(model.parameters(), lr=0.01)
compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none
optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
bps.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, args.input_size)
target = torch.randint(0, 10, (args.batch_size,))
if args.cuda:
    data, target = data.cuda(), target.cuda()

benchmark_step = synthetic.torch_step(bps, args, model, optimizer, data, target)
log = synthetic.rank0_log(bps)
log(f"Model: MLP {args.input_size}-{args.hidden}-{args.hidden}-10, batch size {args.batch_size}, "
    f"{bps.size()} workers")
rates = synthetic.timed_iters(benchmark_step, args, log)
log(f"Samples/sec per worker: {sum(rates) / len(rates):.1f}")
log(f"final loss {benchmark_step().item():.4f}")
