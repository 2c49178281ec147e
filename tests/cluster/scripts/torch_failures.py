"""A PyTorch worker for tests/cluster/test_failures.py: faults that must reach the script as
exceptions, and non-finite gradients that must behave as they do uncompressed.

    torch_failures.py MODE OUT_DIR [options]

MODE:
  mismatch        rank 1 declares THC with bits=3, rank 0 with bits=4; optimizer.step() must raise
                  RuntimeError, whose text goes to OUT_DIR/error_<rank>.txt (exit 0).
  amp             torch.amp.GradScaler training with THC; --inject-step K puts an inf into one
                  gradient on --inject-rank at step K, --skip-step K leaves step K out and halves
                  the scale there instead. Writes OUT_DIR/amp_<rank>.json.
  nonfinite-error a NaN on rank 1 at step 1 under BYTEPS_THC_NONFINITE=error: step() must raise.
  bad-kwargs      tensors declared with compressor kwargs that name no registered compressor (a
                  misspelt compressor_type, and a key without the prefix MXNet's declare strips):
                  the declare and every push_pull of them raise RuntimeError (OUT_DIR/
                  declare-<name>_<rank>.txt, pushpull-<name>_<rank>.txt), then THC training and
                  an uncompressed sum go on (OUT_DIR/alive_<rank>.txt: the sum's values).
  fail-cluster    rank 0 has push_pulls pending (rank 1 holds back: one in the pipeline, one of a
                  new tensor in its first push) when fail_cluster() is called: synchronize()
                  and every later push_pull must raise.
  late-reply      rank 0 fails the cluster while its gradients' push_pulls wait for rank 1,
                  then fills the gradients with 7; rank 1 pushes 4 s later, so the server's
                  replies reach rank 0 after its push_pulls completed with the error. What the
                  gradients hold then goes to OUT_DIR/late_0.txt (JSON: name -> set of values).
"""
import argparse
import hashlib
import json
import os
import threading
import time

import torch

import byteps.torch as bps
from byteps_thc import torch as bt

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["mismatch", "amp", "nonfinite-error", "bad-kwargs",
                                     "fail-cluster", "late-reply"])
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--inject-step", type=int, default=-1)
parser.add_argument("--inject-rank", type=int, default=1)
parser.add_argument("--skip-step", type=int, default=-1)
args = parser.parse_args()

bps.init()
rank = bps.rank()


def out(name):
    return os.path.join(args.out, f"{name}_{rank}.txt")


def model_and_data(seed=7):
    torch.manual_seed(seed)
    # 128x256 floats = 128 KiB: above BYTEPS_MIN_COMPRESS_BYTES, so the weight goes through THC
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    return model


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)


def digest(model):
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def distributed(model, compression):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    return opt


def plain_step(model, opt, step):
    x, y = batch(step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def caught(name, body):
    """Runs body(); its RuntimeError's text goes to OUT/name_<rank>.txt; anything else fails."""
    try:
        body()
    except RuntimeError as e:
        with open(out(name), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return True
    return False


if args.mode == "mismatch":
    model = model_and_data()
    opt = distributed(model, bps.Compression.thc(bits=4 if rank == 0 else 3))
    if not caught("error", lambda: plain_step(model, opt, 0)):
        raise SystemExit("step() did not raise")

elif args.mode == "nonfinite-error":
    model = model_and_data()
    weight = model[0].weight
    opt = distributed(model, bps.Compression.thc())
    step_now = [0]

    def poison(grad):
        if rank == 1 and step_now[0] == 1:
            grad = grad.clone()
            grad[3, 5] = float("nan")
        return grad
    weight.register_hook(poison)
    plain_step(model, opt, 0)
    step_now[0] = 1
    if not caught("error", lambda: plain_step(model, opt, 1)):
        raise SystemExit("step() did not raise")

elif args.mode == "bad-kwargs":
    from byteps.torch import ops
    ok = True
    for name, kwargs in (("typo", {"compressor_type": "thx", "thc_bits": "4"}),
                         ("noprefix", {"type": "thc", "thc_bits": "4"})):
        ok = caught(f"declare-{name}", lambda: bt.declare(name, kwargs)) and ok
        t = torch.ones(1 << 16)  # 256 KiB: above BYTEPS_MIN_COMPRESS_BYTES
        ok = caught(f"pushpull-{name}", lambda: ops.synchronize(
            ops.push_pull_async(t, average=False, name=name))) and ok
    if not ok:
        raise SystemExit("a declare or push_pull with unknown compressor kwargs did not raise")
    model = model_and_data()
    opt = distributed(model, bps.Compression.thc())
    for step in range(2):
        plain_step(model, opt, step)
    total = ops.synchronize(ops.push_pull_async(torch.full((1000,), float(rank + 1)),
                                                average=False, name="alive"))
    with open(out("alive"), "w") as f:
        f.write(" ".join(str(v) for v in sorted(set(total.tolist()))))

elif args.mode == "fail-cluster":
    model = model_and_data()
    opt = distributed(model, bps.Compression.thc())
    plain_step(model, opt, 0)  # every tensor initialised and registered
    if rank == 0:
        from byteps.torch import ops
        # a new tensor: its first push waits in BytePS's InitTensor for rank 1, which never comes
        fresh = ops.push_pull_async(torch.ones(1 << 16), average=True, name="fresh")
        threading.Timer(2.0, bt.fail_cluster, args=("test: node 1 declared dead",)).start()
        ok = caught("pending", lambda: plain_step(model, opt, 1))  # rank 1 never pushes step 1
        ok = caught("fresh", lambda: ops.synchronize(fresh)) and ok
        ok = caught("later", lambda: plain_step(model, opt, 2)) and ok
    else:
        time.sleep(6.0)  # what a watchdog would see: the peer stopped; fail ourselves
        bt.fail_cluster("test: node 0 declared dead")
        ok = caught("later", lambda: plain_step(model, opt, 1))
    with open(out("reason"), "w") as f:
        f.write(bt.cluster_failure() or "")
    if not ok:
        raise SystemExit("a push_pull did not raise after fail_cluster")

elif args.mode == "late-reply":
    model = model_and_data()
    opt = distributed(model, bps.Compression.thc())
    plain_step(model, opt, 0)  # every tensor initialised and registered
    if rank == 0:
        threading.Timer(1.0, bt.fail_cluster, args=("test: late replies",)).start()
        ok = caught("pending", lambda: plain_step(model, opt, 1))
        for p in model.parameters():
            p.grad.fill_(7.0)  # the push_pulls' outputs, the script's own again
        time.sleep(8.0)  # rank 1 pushes at 4 s: the replies come meanwhile
        with open(out("late"), "w") as f:
            json.dump({n: sorted(set(p.grad.flatten().tolist()))
                       for n, p in model.named_parameters()}, f)
    else:
        time.sleep(4.0)
        plain_step(model, opt, 1)  # completes the round: the server replies to both
        bt.fail_cluster("test: rank 0 has failed")  # rank 0 skips the finalize barrier
        ok = True
    if not ok:
        raise SystemExit("the pending push_pull did not raise after fail_cluster")

elif args.mode == "amp":
    model = model_and_data()
    weight = model[0].weight
    opt = distributed(model, bps.Compression.thc())
    # growth never happens within the run: the scale only halves, as a skipped step makes it
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=10 ** 6)
    step_now = [-1]

    def inject(grad):
        if rank == args.inject_rank and step_now[0] == args.inject_step:
            grad = grad.clone()
            grad[3, 5] = float("inf")
        return grad
    weight.register_hook(inject)
    report = {"inf_at": [], "scales": [], "skipped_by_scaler": []}
    for step in range(args.steps):
        step_now[0] = step
        if step == args.skip_step:
            # the reference run: step k never happens, the scale is what an inf step leaves
            scaler.update(new_scale=scaler.get_scale() / 2)
            report["scales"].append(scaler.get_scale())
            continue
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        opt.synchronize()
        if any(not torch.isfinite(p.grad).all() for p in model.parameters()):
            report["inf_at"].append(step)
        if step == args.inject_step:
            report["weight_grad_all_inf"] = bool(torch.isposinf(weight.grad).all())
        before = digest(model)
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        if digest(model) == before:
            report["skipped_by_scaler"].append(step)
        report["scales"].append(scaler.get_scale())
    report["digest"] = digest(model)
    with open(os.path.join(args.out, f"amp_{rank}.json"), "w") as f:
        json.dump(report, f)
print(f"rank {rank}: {args.mode} done", flush=True)
