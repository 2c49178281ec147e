"""A synthetic-data benchmark on upstream's `byteps.torch.cross_barrier.CrossBarrier`, written the
way BytePS's cross-barrier example is: `compression=bps.Compression.none` as boilerplate,
`num_steps` the number of steps, everything else left to the launcher.

Every rank prints its final loss and a digest of its parameters (`rank R parameter digest H`).
tests/cluster/test_torch_apis.py runs it.
"""
import synthetic  # tests/cluster/scripts/synthetic.py
import torch

import byteps.torch as bps
from byteps.torch.cross_barrier import CrossBarrier

parser = synthetic.parser("PyTorch CrossBarrier synthetic benchmark")
parser.add_argument("--optimizer", choices=["sgd", "adam", "rmsprop"], default="sgd")
args = parser.parse_args()

bps.init()
torch.manual_seed(1234)
model = synthetic.mlp(torch, args)
make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
        "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3)}[args.optimizer]
steps = args.num_warmup_batches + args.num_iters * args.num_batches_per_iter + 1
compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none
optimizer = CrossBarrier(model, make(model.parameters()),
                         named_parameters=model.named_parameters(), compression=compression,
                         num_steps=steps)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
bps.broadcast_optimizer_state(optimizer, root_rank=0)

torch.manual_seed(99 + bps.rank())  # each worker its own data
data = torch.randn(args.batch_size, args.input_size)
target = torch.randint(0, 10, (args.batch_size,))

benchmark_step = synthetic.torch_step(bps, args, model, optimizer, data, target)
log = synthetic.rank0_log(bps)
log(f"Model: MLP, CrossBarrier ({args.optimizer}), batch size {args.batch_size}, "
    f"{bps.size()} workers")
synthetic.timed_iters(benchmark_step, args, log)
loss = benchmark_step()  # the num_steps-th step: it waits for every update
print(f"rank {bps.rank()} final loss {loss.item():.4f}", flush=True)
print(f"rank {bps.rank()} parameter digest {synthetic.digest(model.parameters())}", flush=True)
