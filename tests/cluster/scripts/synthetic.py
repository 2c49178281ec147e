"""What the synthetic scripts take and do alike: upstream's benchmark flags (and the MLP's shape
that tests/cluster/test_compressor_flag.py counts on, with its own constants), the step and the
timed loop of upstream's benchmarks, and printing on rank 0 only. Plain argparse and print: like
the scripts, it knows nothing of byteps-thc.
"""
import argparse


def parser(description):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-pushpull", action="store_true", default=False,
                   help="use fp16 compression during push_pull")
    model_args(p)
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--delay-rank", type=int, default=-1,
                   help="this rank sleeps --delay-s seconds before its second step's backward")
    p.add_argument("--delay-s", type=float, default=0.0)
    return p


def model_args(p):
    """The flags of the synthetic batch and the MLP: --batch-size, --input-size, --hidden."""
    p.add_argument("--batch-size", type=int, default=16, help="input batch size")
    p.add_argument("--input-size", type=int, default=1024, help="features per sample")
    p.add_argument("--hidden", type=int, default=512, help="width of the hidden layers")
    return p


def maybe_delay(bps, args, step):
    """Sleep on --delay-rank before its second step's backward (the others then wait for it)."""
    if step == 1 and bps.rank() == args.delay_rank:
        import time
        time.sleep(args.delay_s)


def torch_step(bps, args, model, optimizer, data, target):
    """Upstream's benchmark step for a torch `model`: zero_grad, cross entropy, backward, step
    (with the --delay-rank sleep before the second step's backward). Returns the loss."""
    import torch.nn.functional as F
    done = [0]

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        maybe_delay(bps, args, done[0])
        done[0] += 1
        loss.backward()
        optimizer.step()
        return loss
    return step


def timed_iters(step, args, log):
    """Upstream's timed loop: --num-warmup-batches steps, then --num-iters iterations of
    --num-batches-per-iter steps, each iteration's samples/s logged. Returns those rates."""
    import timeit
    log("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for x in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / t)
        log(f"Iter #{x}: {rates[-1]:.1f} samples/sec per worker")
    return rates


def rank0_log(bps):
    """print(s) on rank 0 of `bps` (byteps.torch or byteps.tensorflow), nothing elsewhere."""
    def log(s):
        if bps.rank() == 0:
            print(s, flush=True)
    return log


def mlp(torch, args):
    """The benchmarks' MLP: input, two hidden layers of args.hidden, 10 classes."""
    return torch.nn.Sequential(
        torch.nn.Linear(args.input_size, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10))


def digest(params):
    """A short hex digest of the bytes of `params` (torch tensors, in order)."""
    import hashlib
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()[:16]
