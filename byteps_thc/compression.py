"""The framework-free part of byteps-thc's compression API, shared by the torch, TensorFlow and
MXNet adapters (byteps_thc.torch, .tensorflow, .mxnet).

Each adapter keeps only what touches its tensors (casts, dtype tests, element counts); the rest
lives here once:

- the environment bpslaunch sets (BYTEPS_COMPRESSOR, BYTEPS_COMPRESSOR_K, BYTEPS_COMPRESSOR_EF,
  BYTEPS_MIN_COMPRESS_BYTES, BYTEPS_THC_*), read by `compressor_from_env` and
  `min_compress_bytes`;
- the kwargs each compressor is declared with in BytePS's C++ registry (`onebit_kwargs`,
  `k_kwargs`, and `ThcConfig.to_kwargs()` for THC): the same strings on every framework;
- the compressor classes' shared behaviour: `Compressor` (the interface), `RegistryCompressor`
  (kwargs only for floating tensors of at least BYTEPS_MIN_COMPRESS_BYTES as pushed),
  `ThcMixin` (one ThcConfig, its repr and equality);
- `CompressionBase`, the `Compression` namespace (`none`, `fp16`, `thc(...)`, `onebit()`,
  `topk(k)`, `randomk(k)`, `dithering(k)`, `from_env()`): an adapter subclasses it and names its
  own compressor classes.

Nothing here imports a framework.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Tuple

from .config import ENV as _ENV
from .config import ThcConfig

ENV_COMPRESSOR = _ENV["compressor"]
ENV_COMPRESSOR_K = "BYTEPS_COMPRESSOR_K"
ENV_COMPRESSOR_EF = "BYTEPS_COMPRESSOR_EF"
ENV_MIN_COMPRESS_BYTES = "BYTEPS_MIN_COMPRESS_BYTES"
DEFAULT_MIN_COMPRESS_BYTES = 65536  # BytePS's default, bytes of the tensor as pushed

COMPRESSORS = ("none", "fp16", "thc", "onebit", "topk", "randomk", "dithering")
K_COMPRESSORS = ("topk", "randomk", "dithering")
THC_PARAMS = ("bits", "granularity", "overflow_prob", "seed", "rotation_block", "error_feedback")


def min_compress_bytes(environ: Optional[Mapping[str, str]] = None) -> int:
    """Tensors smaller than this (bytes as pushed) are declared without compressor kwargs."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MIN_COMPRESS_BYTES, "")
    return int(raw) if raw.strip() else DEFAULT_MIN_COMPRESS_BYTES


class LearningRateFile:
    """`./lr.s`, the learning rate BytePS's vanilla error feedback (ef_type=vanilla) reads.

    Its C++ opens `lr.s` in the process's working directory when the compressor is created and
    mmaps the 8-byte native double; every compression step rescales the kept error by
    previous_lr / current_lr. Upstream only its MXNet trainer writes the file; without it a torch
    worker aborted ("open lr.s failed"). `set(lr)` writes it when the value changes (a cheap
    comparison otherwise), so a learning-rate schedule reaches the error feedback; a zero or
    non-finite rate keeps the last positive one (1.0 before any). The file stays
    after the run: workers sharing a directory share it, and one that leaves must not take it
    from the others (they all write the same schedule).
    """

    PATH = "lr.s"

    def __init__(self, lr: float):
        import struct
        self._pack = struct.Struct("d").pack
        self._f = open(self.PATH, "r+b" if os.path.exists(self.PATH) else "w+b")
        self._lr = None
        self.set(lr)

    def set(self, lr: float) -> None:
        lr = float(lr)
        if lr == self._lr:
            return
        if not (lr > 0 and lr < float("inf")):
            # a zero learning rate (warm-up from 0, a frozen replay) would make the ratio
            # previous_lr / current_lr infinite: keep the last positive rate (1.0 before any),
            # so the kept error is carried over unscaled while the rate is zero
            if self._lr is not None:
                return
            lr = 1.0
        self._f.seek(0)
        self._f.write(self._pack(lr))
        self._f.flush()
        self._lr = lr


def uses_vanilla_ef(kwargs: Optional[Mapping[str, str]]) -> bool:
    return bool(kwargs) and kwargs.get("ef_type") == "vanilla"


# ------------------------------------------------------------------------------------------------
# Registry kwargs
# ------------------------------------------------------------------------------------------------
def thc_config(bits: int = 4, granularity: int = 30, overflow_prob: float = 1.0 / 32,
               seed: int = 42, rotation_block: Optional[int] = None, error_feedback: bool = True,
               config: Optional[ThcConfig] = None) -> ThcConfig:
    """`config`, or a ThcConfig of these parameters (validated here, before any push)."""
    if config is not None:
        if not isinstance(config, ThcConfig):
            raise TypeError(f"config must be a ThcConfig, not {type(config).__name__}")
        return config
    return ThcConfig(bits=bits, granularity=granularity, overflow_prob=overflow_prob, seed=seed,
                     rotation_block=rotation_block, error_feedback=error_feedback)


def onebit_kwargs(scaling: bool = False, error_feedback: bool = False) -> Dict[str, str]:
    kw = {"compressor_type": "onebit", "compressor_onebit_scaling": str(bool(scaling)).lower()}
    if error_feedback:
        kw["ef_type"] = "vanilla"
    return kw


def k_kwargs(name: str, k, seed: Optional[int] = None,
             error_feedback: bool = False) -> Dict[str, str]:
    """kwargs of BytePS's topk, randomk and dithering (k: count, fraction or levels)."""
    if name not in K_COMPRESSORS:
        raise ValueError(f"{name!r} is not one of {', '.join(K_COMPRESSORS)}")
    kw = {"compressor_type": name, "compressor_k": str(k)}
    if seed is not None:
        kw["seed"] = str(seed)
    if error_feedback:
        kw["ef_type"] = "vanilla"
    return kw


def compressor_from_env(environ: Optional[Mapping[str, str]] = None) -> Tuple[str, object]:
    """What `bpslaunch --compressor` chose, as (name, what): ("none", None), ("fp16", None),
    ("thc", ThcConfig) or (registry name, kwargs)."""
    env = os.environ if environ is None else environ
    name = (env.get(ENV_COMPRESSOR) or "none").strip().lower()
    ef = (env.get(ENV_COMPRESSOR_EF) or "none").strip().lower() == "vanilla"
    if name in ("none", "fp16"):
        return name, None
    if name == "thc":
        return name, ThcConfig.from_env(env)
    if name == "onebit":
        return name, onebit_kwargs(error_feedback=ef)
    if name in K_COMPRESSORS:
        k = env.get(ENV_COMPRESSOR_K)
        if not k:
            raise ValueError(f"{ENV_COMPRESSOR}={name} needs {ENV_COMPRESSOR_K}")
        return name, k_kwargs(name, k, error_feedback=ef)
    raise ValueError(f"{ENV_COMPRESSOR}={name!r} is not one of {', '.join(COMPRESSORS)}")


def thc_repr(config: ThcConfig) -> str:
    c = config
    return (f"Compression.thc(bits={c.bits}, granularity={c.granularity}, "
            f"overflow_prob={c.overflow_prob!r}, seed={c.seed}, "
            f"rotation_block={c.rotation_block}, error_feedback={c.error_feedback})")


# ------------------------------------------------------------------------------------------------
# Compressor classes: the shared behaviour; adapters add the tensor operations
# ------------------------------------------------------------------------------------------------
class Compressor:
    """Interface of a gradient compressor, as BytePS/Horovod define it, plus the registry hook.

    compress(tensor) -> (tensor_for_bytes, ctx) and decompress(tensor, ctx) -> tensor run in
    Python around the push_pull; `kwargs(tensor)` returns the BytePS compressor kwargs under which
    the tensor is declared (None: no C++ compressor).
    """
    name = "none"

    def compress(self, tensor):
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor

    def kwargs(self, tensor) -> Optional[Dict[str, str]]:
        return None

    def __repr__(self):
        return f"Compression.{self.name}"


class RegistryCompressor(Compressor):
    """A compressor of BytePS's C++ registry, chosen by kwargs; tensors travel as float32.

    An adapter's subclass says which tensors are floating (`is_floating`) and how many bytes a
    tensor has as pushed (`wire_bytes`, None when unknown), and does the casts."""

    def __init__(self, name: str, kwargs: Mapping[str, str]):
        self.name = name
        self._kwargs = {k: str(v) for k, v in kwargs.items()}

    def is_floating(self, tensor) -> bool:
        raise NotImplementedError

    def wire_bytes(self, tensor) -> Optional[int]:
        raise NotImplementedError

    def kwargs(self, tensor, environ: Optional[Mapping[str, str]] = None):
        if not self.is_floating(tensor):
            return None
        nbytes = self.wire_bytes(tensor)
        if nbytes is None or nbytes < min_compress_bytes(environ):
            return None
        return dict(self._kwargs)

    def __repr__(self):
        return f"Compression.{self.name}({', '.join(f'{k}={v}' for k, v in self._kwargs.items())})"


class ThcMixin:
    """THC: table indices up, integer sums down (docs/ALGORITHM.md). Put in front of an adapter's
    RegistryCompressor: carries one ThcConfig, declared as `config.to_kwargs()`, which the server
    checks on every push."""

    def __init__(self, config: ThcConfig):
        self.config = thc_config(config=config)
        super().__init__("thc", self.config.to_kwargs())

    def __repr__(self):
        return thc_repr(self.config)

    def __eq__(self, other):
        return isinstance(other, ThcMixin) and other.config == self.config

    def __hash__(self):
        return hash(self.config)


class CompressionBase:
    """Optional gradient compression: `none`, `fp16`, `thc(...)`, BytePS's `onebit()`, `topk(k)`,
    `randomk(k)`, `dithering(k)`, or `from_env()` (what bpslaunch --compressor chose).

    An adapter subclasses it as `Compression`, sets `none` and `fp16` to its instances and
    `_registry_class` / `_thc_class` to its compressor classes."""

    none: Compressor = None
    fp16: Compressor = None
    _registry_class = RegistryCompressor
    _thc_class = None

    @classmethod
    def thc(cls, bits: int = 4, granularity: int = 30, overflow_prob: float = 1.0 / 32,
            seed: int = 42, rotation_block: Optional[int] = None, error_feedback: bool = True,
            config: Optional[ThcConfig] = None):
        """THC with these parameters (or a ready `config`); validated here, before any push."""
        return cls._thc_class(thc_config(bits, granularity, overflow_prob, seed, rotation_block,
                                         error_feedback, config))

    @classmethod
    def onebit(cls, scaling: bool = False, error_feedback: bool = False):
        return cls._registry_class("onebit", onebit_kwargs(scaling, error_feedback))

    @classmethod
    def topk(cls, k, error_feedback: bool = False):
        return cls._registry_class("topk", k_kwargs("topk", k, None, error_feedback))

    @classmethod
    def randomk(cls, k, seed: Optional[int] = None, error_feedback: bool = False):
        return cls._registry_class("randomk", k_kwargs("randomk", k, seed, error_feedback))

    @classmethod
    def dithering(cls, k, seed: Optional[int] = None, error_feedback: bool = False):
        return cls._registry_class("dithering", k_kwargs("dithering", k, seed, error_feedback))

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None):
        """The compressor `bpslaunch --compressor` chose (BYTEPS_COMPRESSOR, BYTEPS_THC_*...)."""
        name, what = compressor_from_env(environ)
        if name == "none":
            return cls.none
        if name == "fp16":
            return cls.fp16
        if name == "thc":
            return cls._thc_class(what)
        return cls._registry_class(name, what)
