"""The framework-free part of byteps-thc's compression API, shared by the torch, TensorFlow and
MXNet adapters (byteps_thc.torch, .tensorflow, .mxnet).

Each adapter keeps only what touches its tensors (casts, dtype tests, element counts); the rest
lives here once, and the homomorphic codecs (THC, LHC) come from one table, byteps_thc.codecs:

- `kwargs`: the kwargs each compressor is declared with in BytePS's C++ registry
  (`onebit_kwargs`, `k_kwargs`, and a codec's `Codec.kwargs`: the same strings on every
  framework), and what bpslaunch chose, read back from the environment it sets
  (`compressor_from_env`: BYTEPS_COMPRESSOR, BYTEPS_COMPRESSOR_K, BYTEPS_COMPRESSOR_EF and the
  codecs' settings; names, defaults and parsers are byteps_thc.env's);
- `compressors`: `Compressor` (the interface), `RegistryCompressor` (kwargs only for floating
  tensors of at least BYTEPS_MIN_COMPRESS_BYTES as pushed), `ThcMixin` / `LhcMixin` (a codec's
  configuration, its repr and equality), and `CompressionBase`, the `Compression` namespace
  (`none`, `fp16`, `thc(...)`, `lhc(...)`, `onebit()`, `topk(k)`, `randomk(k)`, `dithering(k)`,
  `from_env()`) that an adapter subclasses, naming its own compressor classes;
- `report`: which compressor is in force (`choose`) and saying so once on rank 0 (`announce`,
  `warn_conflict`, and at exit a THC choice under which nothing was compressed);
- `learning_rate`: `./lr.s`, which BytePS's vanilla error feedback reads.

The adapters call these through this package (`compression.announce`, ...). Nothing here imports
a framework.
"""
from .compressors import (
    CodecMixin,
    CompressionBase,
    Compressor,
    LhcMixin,
    RegistryCompressor,
    ThcMixin,
    codec_mixin,
)
from .kwargs import (
    K_COMPRESSORS,
    compressor_from_env,
    k_kwargs,
    lhc_config,
    lhc_kwargs,
    onebit_kwargs,
    thc_config,
    thc_kwargs,
)
from .learning_rate import LearningRateFile, uses_vanilla_ef
from .report import (
    DEFAULT,
    REPORT,
    SCRIPT,
    Choice,
    RunReport,
    Tally,
    announce,
    choose,
    conflict_message,
    describe,
    in_force_line,
    is_no_choice,
    is_thc,
    launcher_source,
    tally,
    warn_conflict,
)

__all__ = [
    "CodecMixin", "CompressionBase", "Compressor", "LhcMixin", "RegistryCompressor", "ThcMixin",
    "codec_mixin", "K_COMPRESSORS", "compressor_from_env", "k_kwargs", "lhc_config",
    "lhc_kwargs", "onebit_kwargs", "thc_config", "thc_kwargs", "LearningRateFile",
    "uses_vanilla_ef", "DEFAULT", "REPORT", "SCRIPT", "Choice", "RunReport", "Tally", "announce",
    "choose", "conflict_message", "describe", "in_force_line", "is_no_choice", "is_thc",
    "launcher_source", "tally", "warn_conflict",
]
