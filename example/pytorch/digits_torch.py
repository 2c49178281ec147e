"""What the PyTorch digits examples share: the model, its digest, the data, the training loop
and the process group.

train_digits.py (BytePS), train_digits_ddp.py (DDP with the THC comm hook) and
train_digits_fsdp.py (FSDP2 with THC's reduce-scatter) differ only in how gradients are averaged;
each imports this module from its own folder (on sys.path as the script's directory), so that the
model, the shards, the batch order and the loop are one code.
"""
import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def make_model(hidden, dtype, device="cpu"):
    torch.manual_seed(1234)  # every worker starts alike; the launchers' broadcasts make sure
    # initialised on the CPU, then moved: the same initial weights on every device
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10)).to(device=device, dtype=dtype)


def param_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        p = p.detach().cpu()  # the same bytes from any device
        h.update(p.contiguous().view(torch.uint8).numpy().tobytes()
                 if p.dtype != torch.bfloat16 else p.float().numpy().tobytes())
    return h.hexdigest()[:16]


class Digits:
    """This rank's training shard and the test set as tensors on `device` (example.common's
    split)."""

    def __init__(self, common, args, rank, size, dtype, device="cpu"):
        data = common.load_digits_split(args.seed)
        x_tr, y_tr, self.steps_per_epoch = common.shard(data[0], rank, size, args.batch_size)
        self.n_train, (x_te, y_te) = len(data[0][1]), data[1]
        self.x_tr = torch.from_numpy(x_tr).to(device=device, dtype=dtype)
        self.y_tr = torch.from_numpy(y_tr).to(device)
        self.x_te = torch.from_numpy(x_te).to(device=device, dtype=dtype)
        self.y_te = torch.from_numpy(y_te).to(device)

    def banner(self, args, size, net, how):
        """The run's first line, which bench_network.py reads (rank 0 prints it); `how` says
        how gradients are averaged."""
        n_params = sum(p.numel() for p in net.parameters())
        return (f"digits: {self.n_train} training and {len(self.y_te)} test images, {size} "
                f"rank(s), {self.steps_per_epoch} steps/epoch of {args.batch_size} per rank, MLP "
                f"64-{args.hidden}-{args.hidden}-10 ({n_params} parameters), {how}")

    def accuracy(self, net):
        net.eval()
        with torch.no_grad():
            pred = net(self.x_te).float().argmax(1)
        net.train()
        return (pred == self.y_te).float().mean().item()


def train(model, net, opt, data, args, rank, report=True):
    """args.epochs epochs of SGD on this rank's shard, in a batch order seeded by (seed, rank);
    `model` is what the step calls (a DDP wrapper or the module), `net` what is evaluated. Prints
    each epoch's loss and accuracies when `report`. Returns the number of steps."""
    steps = 0
    gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(data.y_tr), generator=gen)
        total_loss, correct, seen = 0.0, 0, 0
        for s in range(data.steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            xb, yb = data.x_tr[idx], data.y_tr[idx]
            opt.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out.float(), yb)
            loss.backward()
            opt.step()
            steps += 1
            total_loss += loss.item() * len(yb)
            correct += (out.argmax(1) == yb).sum().item()
            seen += len(yb)
        if report:
            print(f"epoch {epoch:2d}/{args.epochs}  loss {total_loss / seen:.4f}  "
                  f"train acc {correct / seen:.4f}  test acc {data.accuracy(net):.4f}", flush=True)
    return steps


def timed_train(common, model, net, opt, data, args, rank, report=True):
    """train(...), and the result fields of it that example.common.finish reports: steps, wall
    seconds and the bytes that crossed the loopback interface meanwhile."""
    tx0, t0 = common.loopback_tx_bytes(), time.perf_counter()
    steps = train(model, net, opt, data, args, rank, report)
    seconds = time.perf_counter() - t0
    return dict(common.wire_stats(tx0, common.loopback_tx_bytes(), steps), steps=steps,
                seconds=seconds)


class Group:
    """What example.common.finish needs of a launcher (rank, size, shutdown), for
    torch.distributed, or for one process alone when not `distributed`."""

    def __init__(self, distributed=True):
        self.distributed = distributed

    def rank(self):
        return dist.get_rank() if self.distributed else 0

    def size(self):
        return dist.get_world_size() if self.distributed else 1

    def shutdown(self):
        if self.distributed:
            dist.destroy_process_group()
