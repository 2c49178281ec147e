"""NMSE of one THC round on a tiled partition against the padded and the equal-block layouts.

    .venv/bin/python benchmarks/bench_tiling.py [--size 589824]

The NumPy reference (byteps_thc.thc.reference), no error feedback, the seeds of
tests/unit/test_reference.py; docs/RESULTS.md ("Tiled partitions") has the figures. Inputs:
standard normal, lognormal(0, 1), and `last-tile`: normal in the default layout's last, smaller
block and zeros before it (all of a partition's energy in one tile). Also prints
the coordinates THC sends per compressed coordinate of ResNet-50, VGG-16 and BERT-base.
"""
from __future__ import annotations

import argparse

import numpy as np

from byteps_thc.advisor import models, wire
from byteps_thc.thc import reference as R
from byteps_thc.thc.config import ThcConfig, next_pow2


def last_tile(d):
    """Where the default layout's last, smaller block starts (d when it has none)."""
    geo = R.geometry(ThcConfig(), d)
    return geo.padded - geo.tail_block if geo.tail_block else d


def one_round_nmse(cfg, d, n, dist, seed):
    rng = np.random.default_rng(seed)

    def in_last_tile():  # all the energy in the default layout's last block, zeros before it
        g, lo = np.zeros(d), last_tile(d)
        g[lo:] = rng.standard_normal(d - lo)
        return g

    draw = {"normal": lambda: rng.standard_normal(d), "lognormal": lambda: rng.lognormal(0, 1, d),
            "last-tile": in_last_tile}
    gs = [draw[dist]().astype(np.float32) for _ in range(n)]
    mean = np.mean(np.stack(gs).astype(np.float64), axis=0)
    est, _ = R.simulate_round(cfg, gs)
    return np.sum((est - mean) ** 2) / np.mean([np.sum(g.astype(np.float64) ** 2) for g in gs])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=589824)
    a = ap.parse_args(argv)
    d = a.size
    for model in ("resnet50", "vgg16", "bert-base"):
        parts = [e for e, c in wire.partitions(models.model_tensors(model)) if c]
        before = sum(next_pow2(e) for e in parts) / sum(parts)
        now = sum(R.geometry(ThcConfig(), e).padded for e in parts) / sum(parts)
        print(f"{model}: coordinates per compressed one, before {before:.3f}, now {now:.3f}")
    layouts = [("one block", ThcConfig(error_feedback=False, rotation_block=1 << 32)),
               ("tiled", ThcConfig(error_feedback=False)),
               ("1024-blocks", ThcConfig(error_feedback=False, rotation_block=1024))]
    for dist in ("normal", "lognormal") + (("last-tile",) if last_tile(d) < d else ()):
        for name, cfg in layouts:
            geo = R.geometry(cfg, d)
            nmse = [one_round_nmse(cfg, d, n, dist, 200 + n) for n in (1, 2, 4, 8)]
            print(f"{dist:9s} {name:11s} {geo.padded / d:.3f}x  "
                  + "  ".join(f"n={n}: {v:.4f}" for n, v in zip((1, 2, 4, 8), nmse)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
