"""A synthetic-data benchmark on upstream's `byteps.torch.parallel.DistributedDataParallel`,
written the way BytePS's DDP example is: the module wrapper, a plain torch optimizer,
`compression=bps.Compression.none` passed as boilerplate, everything else left to the launcher.

Every rank prints its final loss and a digest of its parameters (`rank R parameter digest H`),
so that a test can check that the workers agree. tests/cluster/test_torch_apis.py runs it.
"""
import synthetic  # tests/cluster/scripts/synthetic.py
import torch

import byteps.torch as bps
from byteps.torch.parallel import DistributedDataParallel as DDP

parser = synthetic.parser("PyTorch DDP synthetic benchmark")
args = parser.parse_args()

bps.init()
torch.manual_seed(1234 + bps.rank())  # different initial weights: the wrapper broadcasts rank 0's
model = synthetic.mlp(torch, args)
compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none
model = DDP(model, device_ids=[0], compression=compression)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

torch.manual_seed(99 + bps.rank())  # each worker its own data
data = torch.randn(args.batch_size, args.input_size)
target = torch.randint(0, 10, (args.batch_size,))

benchmark_step = synthetic.torch_step(bps, args, model, optimizer, data, target)
log = synthetic.rank0_log(bps)
log(f"Model: MLP, DDP wrapper, batch size {args.batch_size}, {bps.size()} workers")
synthetic.timed_iters(benchmark_step, args, log)
print(f"rank {bps.rank()} final loss {benchmark_step().item():.4f}", flush=True)
print(f"rank {bps.rank()} parameter digest {synthetic.digest(model.module.parameters())}",
      flush=True)
