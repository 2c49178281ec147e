"""A recommendation-style PyTorch model with a large embedding table, trained with BytePS.

Each worker's batch touches a few of the table's rows, so the table's gradient is sparse (a
dense tensor whose other rows are 0): what LHC is for. The script knows nothing of LHC; the
launcher's `--compressor` chooses it (DistributedOptimizer with no `compression=`).

It writes, per rank, `OUT/rank<r>.npz`: the table's local gradient before the push_pull (a
tensor hook, which runs before DistributedOptimizer's accumulate hook), the averaged gradient
after it, each step's loss, and the final parameters. With --catch it catches a failed step
(the push_pull's exception), prints `STEP_FAILED <step> <type> <message>` and goes on.
tests/cluster/test_lhc_train.py checks the files.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F

import byteps.torch as bps

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=20000)
p.add_argument("--dim", type=int, default=16)
p.add_argument("--batch", type=int, default=48)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--lr", type=float, default=0.5)
p.add_argument("--out", required=True)
p.add_argument("--catch", action="store_true")
args = p.parse_args()

bps.init()
torch.manual_seed(1234)
rank = bps.rank()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(args.rows, args.dim)  # sparse=False: a dense gradient
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * args.dim, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def forward(self, users, items):
        return self.mlp(torch.cat([self.table(users), self.table(items)], 1)).squeeze(1)


model = Model()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
bps.broadcast_parameters(model.state_dict(), root_rank=0)

local = []
model.table.weight.register_hook(lambda g: local.append(g.detach().clone().numpy()))
gen = torch.Generator().manual_seed(100 + rank)  # each worker its own batches
zipf = torch.tensor(1.0 / np.arange(1, args.rows + 1) ** 1.1, dtype=torch.float64)
averaged, losses, failed = [], [], []
for step in range(args.steps):
    users = torch.multinomial(zipf, args.batch, replacement=True, generator=gen)
    items = torch.multinomial(zipf, args.batch, replacement=True, generator=gen)
    target = torch.randint(0, 2, (args.batch,), generator=gen).float()
    optimizer.zero_grad()
    loss = F.binary_cross_entropy_with_logits(model(users, items), target)
    loss.backward()
    try:
        optimizer.step()
    except RuntimeError as e:
        if not args.catch:
            raise
        failed.append(step)
        print(f"STEP_FAILED {step} {type(e).__name__} {e}", flush=True)
        averaged.append(np.full_like(local[-1], np.nan))
        losses.append(float(loss))
        continue
    averaged.append(model.table.weight.grad.detach().clone().numpy())
    losses.append(float(loss))

os.makedirs(args.out, exist_ok=True)
params = {f"param_{n}": t.detach().numpy() for n, t in model.state_dict().items()}
np.savez(os.path.join(args.out, f"rank{rank}.npz"), local=np.stack(local),
         averaged=np.stack(averaged), losses=np.array(losses), failed=np.array(failed), **params)
print(f"rank {rank} final loss {losses[-1]:.6f}", flush=True)
bps.shutdown()
