"""The gradient shapes of known models, in the order their layers are defined.

`MODELS` also carries each model's published per-GPU step time and batch, which the advisor's
command line and the network benchmark use as the default compute time of a step.
"""
from __future__ import annotations

import math
from typing import List, Tuple


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


# name -> (shapes function, published per-GPU step time in ms, samples per step, note)
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
}


def model_shapes(name: str) -> List[Tuple[int, ...]]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name][0]()


def model_tensors(name: str) -> List[int]:
    """Element counts of the model's gradients (one per parameter tensor)."""
    return [math.prod(s) for s in model_shapes(name)]

