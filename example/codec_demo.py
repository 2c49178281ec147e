"""THC on the real gradients of a small PyTorch model, in one process (no cluster).

Two simulated workers each compute the gradient of a small CNN on their own batch; every
parameter tensor goes through the full THC round (norm round, encode, integer aggregate, decode)
and the result is compared with the exact mean gradient.

    python example/codec_demo.py [--workers 2] [--bits 4] [--granularity 30]
"""
import argparse
import time

import numpy as np
import torch
from torch import nn

from byteps_thc import ThcAggregator, ThcCodec, ThcConfig


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, 10))


def worker_gradients(net, rank, batch=64):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    net.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    return {n: p.grad.detach().flatten().clone() for n, p in net.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--granularity", type=int, default=30)
    args = ap.parse_args()
    cfg = ThcConfig(bits=args.bits, granularity=args.granularity, error_feedback=False)
    n = args.workers
    print(cfg.describe())
    net = model()
    grads = [worker_gradients(net, r) for r in range(n)]
    raw = comp_up = comp_down = 0
    t_enc = t_dec = 0.0
    err = ref = 0.0
    print(f"{'tensor':<12}{'elements':>10}{'NMSE':>10}")
    for name in grads[0]:
        xs = [g[name].numpy() for g in grads]
        d = xs[0].size
        codecs = [ThcCodec(cfg, size=d, rank=r) for r in range(n)]
        m = max(c.norm(x) for c, x in zip(codecs, xs))          # the norm round
        agg = ThcAggregator(cfg, size=d, num_workers=n)
        t0 = time.perf_counter()
        payloads = [c.encode(x, m) for c, x in zip(codecs, xs)]
        t_enc += time.perf_counter() - t0
        for p in payloads:
            agg.add(p)
        sums = agg.result()
        t0 = time.perf_counter()
        est = codecs[0].decode(sums, m, num_workers=n)
        t_dec += time.perf_counter() - t0
        mean = np.mean(np.stack(xs).astype(np.float64), axis=0)
        e = float(np.sum((est - mean) ** 2))
        r = float(np.mean([np.sum(x.astype(np.float64) ** 2) for x in xs]))
        err, ref = err + e, ref + r
        raw += d * 4
        comp_up += payloads[0].nbytes
        comp_down += sums.nbytes
        print(f"{name:<12}{d:>10}{e / r if r else 0.0:>10.4f}")
    print(f"\nbytes per worker, up+down: {2 * raw:,} uncompressed -> {comp_up + comp_down:,} "
          f"with THC ({(comp_up + comp_down) / (2 * raw):.1%}; rotation padding included)")
    print(f"NMSE of the averaged gradient over all tensors: {err / ref:.4f} "
          f"(theory for {n} workers: {cfg.expected_error()['total'] / n:.4f})")
    print(f"encode {t_enc * 1e3 / n:.2f} ms per worker, decode {t_dec * 1e3:.2f} ms, "
          f"for {raw // 4:,} parameters")


if __name__ == "__main__":
    main()
