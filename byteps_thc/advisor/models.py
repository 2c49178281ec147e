"""The gradient shapes of known models, in the order their layers are defined.

`MODELS` also carries each model's per-GPU step time and batch, which the advisor's command line
and the network benchmark use as the default compute time of a step. `EMBEDDINGS` describes the
tables whose gradients are sparse (a batch touches a few rows): `densities` turns that
description into the nonzero fraction of a worker's gradient and of the workers' summed one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def _resnet50_shapes() -> List[Tuple[int, ...]]:
    s: List[Tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]       # conv1, bn1 weight/bias
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            s += [(planes, inplanes, 1, 1), (planes,), (planes,),
                  (planes, planes, 3, 3), (planes,), (planes,),
                  (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:  # projection shortcut
                s += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    s += [(1000, 2048), (1000,)]
    return s


def _vgg16_shapes() -> List[Tuple[int, ...]]:
    s: List[Tuple[int, ...]] = []
    cin = 3
    for cout in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        s += [(cout, cin, 3, 3), (cout,)]
        cin = cout
    s += [(4096, 512 * 7 * 7), (4096,), (4096, 4096), (4096,), (1000, 4096), (1000,)]
    return s


def _bert_base_shapes() -> List[Tuple[int, ...]]:
    h, ff, vocab, pos, types, layers = 768, 3072, 30522, 512, 2, 12
    s: List[Tuple[int, ...]] = [(vocab, h), (pos, h), (types, h), (h,), (h,)]   # embeddings + LN
    for _ in range(layers):
        s += [(h, h), (h,)] * 4                       # query, key, value, attention output
        s += [(h,), (h,)]                             # attention LayerNorm
        s += [(ff, h), (ff,), (h, ff), (h,)]          # intermediate, output
        s += [(h,), (h,)]                             # output LayerNorm
    s += [(h, h), (h,)]                               # pooler
    return s


NCF_ROWS, NCF_DIM = 1_000_000, 32      # rows and width of each of NCF's two tables


def _ncf_shapes() -> List[Tuple[int, ...]]:
    # NeuMF-like: a user and an item table, their rows concatenated into a small MLP tower
    # (64 -> 128 -> 64 -> 32 -> 1); every MLP tensor is under BYTEPS_MIN_COMPRESS_BYTES (64 KiB)
    s: List[Tuple[int, ...]] = [(NCF_ROWS, NCF_DIM), (NCF_ROWS, NCF_DIM)]
    for cin, cout in ((2 * NCF_DIM, 128), (128, 64), (64, 32), (32, 1)):
        s += [(cout, cin), (cout,)]
    return s


# name -> (shapes function, per-GPU step time in ms, samples per step, note)
MODELS = {
    "resnet50": (_resnet50_shapes, 174.0, 64,
                 "ResNet-50 v1.5, batch 64: 367 img/s on one V100 16GB, FP32 (NVIDIA "
                 "DeepLearningExamples, PyTorch ResNet50 v1.5 README)"),
    "vgg16": (_vgg16_shapes, 140.0, 32,
              "VGG-16, batch 32: about 230 img/s on one V100, FP32 (approximate, of the order "
              "of the TensorFlow tf_cnn_benchmarks figures)"),
    "bert-base": (_bert_base_shapes, 160.0, 32,
                  "BERT-base, sequence 128, batch 32: about 200 sequences/s on one V100, FP32 "
                  "(approximate)"),
    "ncf": (_ncf_shapes, 10.0, 16384,
            "NCF-like: two embedding tables of 10^6 x 32 (a batch of 16384 Zipf(1.0) user and "
            "item ids touches about 0.8% of each table's rows) and a small MLP; compute 10 ms is "
            "a round figure, not a published one (NCF's step is small next to its tables)"),
}


@dataclasses.dataclass(frozen=True)
class Embedding:
    """An embedding table whose gradient has nonzero rows only where the batch looked up.

    tensor:  index of the table among the model's shapes
    lookups: ids one worker looks up per step (its batch)
    zipf_s:  exponent of the ids' Zipf law over the rows (P(rank r) ~ r^-s)
    The ranks are scattered over the rows by a fixed permutation (hashed ids), so every BytePS
    partition of the table has the same expected density."""
    tensor: int
    lookups: int
    zipf_s: float


EMBEDDINGS: Dict[str, Tuple[Embedding, ...]] = {
    "ncf": (Embedding(0, 16384, 1.0), Embedding(1, 16384, 1.0)),
}


def zipf_probabilities(rows: int, s: float) -> np.ndarray:
    """P(rank r), r = 1..rows, of a Zipf law of exponent s truncated to `rows`."""
    p = np.arange(1, rows + 1, dtype=np.float64) ** -float(s)
    return p / p.sum()


def expected_rows_touched(rows: int, lookups: int, s: float) -> float:
    """E[distinct rows] of `lookups` independent Zipf(s) draws: sum_r 1 - (1 - p_r)^lookups."""
    p = zipf_probabilities(rows, s)
    return float(-np.expm1(lookups * np.log1p(-p)).sum())


def densities(name: str, workers: int) -> Optional[Tuple[List[float], List[float]]]:
    """(per worker, of the sum of `workers` workers): the expected nonzero fraction of every
    gradient of model `name` (1.0 for dense ones), or None when the model has no sparse tables.
    The workers draw their batches independently, so the sum's support is that of
    workers * lookups draws."""
    if name not in EMBEDDINGS:
        return None
    shapes = model_shapes(name)
    one, union = [1.0] * len(shapes), [1.0] * len(shapes)
    for e in EMBEDDINGS[name]:
        rows = shapes[e.tensor][0]
        one[e.tensor] = expected_rows_touched(rows, e.lookups, e.zipf_s) / rows
        union[e.tensor] = expected_rows_touched(rows, workers * e.lookups, e.zipf_s) / rows
    return one, union


def check_densities(density: Sequence[float], tensors: Sequence[int]) -> None:
    if len(density) != len(tensors):
        raise ValueError(f"{len(density)} densities for {len(tensors)} tensors: give one per "
                         "tensor")
    for i, rho in enumerate(density):
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"density {rho!r} of tensor {i} must lie in [0, 1] (the fraction of "
                             "its gradient's values that are nonzero)")


def model_shapes(name: str) -> List[Tuple[int, ...]]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name][0]()


def model_tensors(name: str) -> List[int]:
    """Element counts of the model's gradients (one per parameter tensor)."""
    return [math.prod(s) for s in model_shapes(name)]

