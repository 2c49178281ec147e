"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) with `byteps.torch.DistributedOptimizer`, the way
upstream's scripts use it: the same code as synchronous training, the variable set by the caller.

Each worker steps on its own data and pushes its parameters' changes; the server adds them.
At the end the workers meet (a broadcast is a barrier under async training) and take one step
with zero gradients: each then holds the initial parameters plus the sum of every change of
both workers, the same bits, and prints their digest (`rank R parameter digest H`).
tests/cluster/test_torch_apis.py runs it.
"""
import synthetic  # tests/cluster/scripts/synthetic.py
import torch
import torch.nn.functional as F

import byteps.torch as bps

parser = synthetic.parser("PyTorch asynchronous synthetic training")
args = parser.parse_args()

bps.init()
torch.manual_seed(1234 + bps.rank())  # different initial weights: the broadcast makes them equal
model = synthetic.mlp(torch, args)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # no momentum: a zero gradient, no change
optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=bps.Compression.none)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
print(f"rank {bps.rank()} initial digest {synthetic.digest(model.parameters())}", flush=True)

torch.manual_seed(99 + bps.rank())
data = torch.randn(args.batch_size, args.input_size)
target = torch.randint(0, 10, (args.batch_size,))
steps = args.num_warmup_batches + args.num_iters * args.num_batches_per_iter
first = None
for step in range(steps):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    first = loss.item() if first is None else first
print(f"rank {bps.rank()} loss first {first:.4f} last {loss.item():.4f}", flush=True)

bps.broadcast_parameters({"done": torch.zeros(1)}, root_rank=0)  # every worker has pushed all
for p in model.parameters():
    p.grad = torch.zeros_like(p)
optimizer.step()
print(f"rank {bps.rank()} parameter digest {synthetic.digest(model.parameters())}", flush=True)
