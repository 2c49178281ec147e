"""The framework-free part of byteps-thc's compression API, shared by the torch, TensorFlow and
MXNet adapters (byteps_thc.torch, .tensorflow, .mxnet).

Each adapter keeps only what touches its tensors (casts, dtype tests, element counts); the rest
lives here once:

- what bpslaunch chose, from the environment it sets (BYTEPS_COMPRESSOR, BYTEPS_COMPRESSOR_K,
  BYTEPS_COMPRESSOR_EF, BYTEPS_THC_*): `compressor_from_env`. The variables' names, defaults and
  parsers are byteps_thc.env's (BYTEPS_MIN_COMPRESS_BYTES too); THC's defaults are ThcConfig's;
- the kwargs each compressor is declared with in BytePS's C++ registry (`onebit_kwargs`,
  `k_kwargs`, and `ThcConfig.to_kwargs()` for THC): the same strings on every framework;
- the compressor classes' shared behaviour: `Compressor` (the interface), `RegistryCompressor`
  (kwargs only for floating tensors of at least BYTEPS_MIN_COMPRESS_BYTES as pushed),
  `ThcMixin` (one ThcConfig, its repr and equality);
- `CompressionBase`, the `Compression` namespace (`none`, `fp16`, `thc(...)`, `onebit()`,
  `topk(k)`, `randomk(k)`, `dithering(k)`, `from_env()`): an adapter subclasses it and names its
  own compressor classes;
- which compressor is in force (`choose`: the script's explicit choice, else the launcher's;
  `Compression.none` counts as no choice) and saying so once on rank 0 (`announce`: the choice,
  its settings, where it came from, how many tensors stay under the size threshold; at exit, a
  THC choice under which nothing was compressed).

Nothing here imports a framework.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import warnings
from typing import Callable, Dict, Mapping, Optional, Tuple

from . import env
from .lhc import LhcConfig
from .lhc_compression import LhcMixin, lhc_config  # noqa: F401  (re-exported: adapters)
from .thc import ThcConfig

K_COMPRESSORS = ("topk", "randomk", "dithering")
THC_PARAMS = tuple(f.name for f in dataclasses.fields(ThcConfig))


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
def thc_config(config: Optional[ThcConfig] = None, **params) -> ThcConfig:
    """`config`, or a ThcConfig of `params` (its fields: bits, granularity, overflow_prob, seed,
    rotation_block, error_feedback; ThcConfig's defaults for the others), validated here, before
    any push."""
    unknown = sorted(set(params) - set(THC_PARAMS))
    if unknown:
        raise TypeError(f"unknown THC parameters {unknown}; known: {list(THC_PARAMS)}")
    if config is not None:
        if not isinstance(config, ThcConfig):
            raise TypeError(f"config must be a ThcConfig, not {type(config).__name__}")
        if params:
            raise TypeError(f"give either config or THC parameters, not both ({sorted(params)})")
        return config
    return ThcConfig(**params)


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
    ("thc", ThcConfig), ("lhc", LhcConfig) or (registry name, kwargs)."""
    name = env.COMPRESSOR.get(environ)  # one of env.COMPRESSORS, else it raises
    ef = env.COMPRESSOR_EF.get(environ) == "vanilla"
    if name in ("none", "fp16"):
        return name, None
    if name == "thc":
        return name, ThcConfig.from_env(environ)
    if name == "lhc":
        return name, LhcConfig.from_env(environ)
    if name == "onebit":
        return name, onebit_kwargs(error_feedback=ef)
    k = env.COMPRESSOR_K.get(environ)  # name is one of K_COMPRESSORS
    if k is None:
        raise ValueError(f"{env.COMPRESSOR.name}={name} needs {env.COMPRESSOR_K.name}")
    return name, k_kwargs(name, k, error_feedback=ef)


def thc_repr(config: ThcConfig) -> str:
    fields = ", ".join(f"{f}={getattr(config, f)!r}" for f in THC_PARAMS)
    return f"Compression.thc({fields})"


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
        if nbytes is None or nbytes < env.MIN_COMPRESS_BYTES.get(environ):
            return None
        return dict(self._kwargs)

    def __repr__(self):
        return f"Compression.{self.name}({', '.join(f'{k}={v}' for k, v in self._kwargs.items())})"


def thc_kwargs(config: ThcConfig, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The kwargs a THC tensor is declared with: the configuration's, and thc_nonfinite=error when
    BYTEPS_THC_NONFINITE says so (absent means propagate). The server refuses a key whose
    workers disagree on it, as on the configuration. thc_codec_threads (BYTEPS_THC_CODEC_THREADS,
    absent means 1) is this worker's own: the server ignores it."""
    kw = config.to_kwargs()
    if env.THC_NONFINITE.get(environ) != env.THC_NONFINITE.default:
        kw["thc_nonfinite"] = env.THC_NONFINITE.get(environ)
    threads = env.THC_CODEC_THREADS.get(environ)
    if threads != env.THC_CODEC_THREADS.default:  # the fork checks its range (thc_wire.cc)
        kw["thc_codec_threads"] = str(threads)
    return kw


class ThcMixin:
    """THC: table indices up, integer sums down (docs/ALGORITHM.md). Put in front of an adapter's
    RegistryCompressor: carries one ThcConfig, declared as `config.to_kwargs()`, which the server
    checks on every push."""

    def __init__(self, config: ThcConfig):
        self.config = thc_config(config=config)
        super().__init__("thc", self.config.to_kwargs())

    def kwargs(self, tensor, environ: Optional[Mapping[str, str]] = None):
        kw = super().kwargs(tensor, environ)
        return None if kw is None else thc_kwargs(self.config, environ)

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
    _lhc_class = None

    @classmethod
    def thc(cls, config: Optional[ThcConfig] = None, **params):
        """THC with a ready `config`, or with `params` (ThcConfig's fields: bits, granularity,
        overflow_prob, seed, rotation_block, error_feedback; its defaults for the others);
        validated here, before any push."""
        return cls._thc_class(thc_config(config, **params))

    @classmethod
    def lhc(cls, config: Optional[LhcConfig] = None, **params):
        """LHC (lossless for sparse gradients, docs/LHC.md) with a ready `config`, or with
        `params` (LhcConfig's fields: capacity, topk, seed, error_feedback, topk_method)."""
        return cls._lhc_class(lhc_config(config, **params))

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
        if name == "lhc":
            return cls._lhc_class(what)
        return cls._registry_class(name, what)


# ------------------------------------------------------------------------------------------------
# Which compressor is in force, and saying so once (rank 0)
# ------------------------------------------------------------------------------------------------
SCRIPT = "script"
DEFAULT = "default (neither the script nor bpslaunch --compressor / BYTEPS_COMPRESSOR chose one)"


def is_no_choice(compression) -> bool:
    """`compression=None` or `Compression.none`: upstream's scripts pass the latter as boilerplate
    (it is upstream's default), so it cannot mean "refuse the launcher's compressor"."""
    return compression is None or getattr(compression, "name", None) == "none"


def launcher_source(environ: Optional[Mapping[str, str]] = None) -> str:
    """Where BYTEPS_COMPRESSOR's value came from, in words."""
    value = env.COMPRESSOR.get(environ)
    if env.COMPRESSOR_SET_BY.get(environ) == "bpslaunch":
        return f"bpslaunch --compressor {value}"
    return f"the environment ({env.COMPRESSOR.name}={value})"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The compressor in force, where it came from (SCRIPT, DEFAULT or launcher_source()), and
    the launcher's compressor when the script's explicit choice overrides a different one."""
    compressor: object
    source: str
    overridden: object = None


def choose(script, from_env: Callable[[], object],
           environ: Optional[Mapping[str, str]] = None) -> Choice:
    """The compressor in force for a script that passed `script` (None, Compression.none, or
    anything else); `from_env()` builds the adapter's compressor from BYTEPS_COMPRESSOR and co.

    No choice (is_no_choice): the launcher's compressor when one is set, else `script` itself
    (none). An explicit other choice stays in force; `overridden` is the launcher's compressor
    when that differs (the same settings, repr equal, are no conflict)."""
    launched = env.COMPRESSOR.get(environ) != "none"
    if is_no_choice(script):
        if launched:
            return Choice(from_env(), launcher_source(environ))
        return Choice(from_env() if script is None else script, DEFAULT)
    other = from_env() if launched else None
    if other is not None and repr(other) == repr(script):
        other = None
    return Choice(script, SCRIPT, other)


def conflict_message(choice: Choice, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    if choice.overridden is None:
        return None
    return (f"byteps-thc: the script chose {choice.compressor!r}, {launcher_source(environ)} chose "
            f"{choice.overridden!r}; the script's {choice.compressor!r} is in force (pass "
            "compression=Compression.none, or nothing, to use the launcher's)")


def describe(compressor) -> str:
    """The compressor and its settings (THC: ThcConfig.describe())."""
    config = getattr(compressor, "config", None)
    if isinstance(config, (ThcConfig, LhcConfig)):
        return config.describe()
    return repr(compressor)


def is_thc(compressor) -> bool:
    return isinstance(getattr(compressor, "config", None), ThcConfig)


@dataclasses.dataclass
class Tally:
    """Gradient tensors of one declare: how many, how many compressed, how many under
    BYTEPS_MIN_COMPRESS_BYTES (floating, known size, too small) and so uncompressed."""
    tensors: int = 0
    compressed: int = 0
    small: int = 0


def tally(compressor, tensors, environ: Optional[Mapping[str, str]] = None) -> Tally:
    """Count `tensors` as the adapter's `compressor` declares them (RegistryCompressor.kwargs)."""
    out = Tally()
    threshold = env.MIN_COMPRESS_BYTES.get(environ)
    registry = isinstance(compressor, RegistryCompressor)
    for t in tensors:
        out.tensors += 1
        if not registry:
            continue
        if compressor.kwargs(t, environ) is not None:
            out.compressed += 1
        elif compressor.is_floating(t):
            nbytes = compressor.wire_bytes(t)
            if nbytes is not None and nbytes < threshold:
                out.small += 1
    return out


def _say(text: str, stream=None) -> None:
    stream = sys.stderr if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


def in_force_line(choice: Choice, counts: Tally,
                  environ: Optional[Mapping[str, str]] = None) -> str:
    """The one line saying what is in force: compressor and settings, source, tensor counts."""
    threshold = env.MIN_COMPRESS_BYTES.get(environ)
    line = (f"byteps-thc: compressor {describe(choice.compressor)}; chosen by {choice.source}; "
            f"{counts.tensors} gradient tensors")
    if getattr(choice.compressor, "name", None) not in ("none", "fp16"):  # size-gated
        line += (f": {counts.compressed} compressed, {counts.small} under "
                 f"{env.MIN_COMPRESS_BYTES.name}={threshold} go uncompressed")
        other = counts.tensors - counts.compressed - counts.small
        if other:
            line += f", {other} not floating point or of unknown size go uncompressed"
    return line


class RunReport:
    """What one process says about compression, each thing once, on rank 0: the warning when
    the script overrides the launcher, the in-force line at the first declare, and at exit,
    under THC, that no tensor of the whole run was compressed (every declare counts).

    The adapters use the process's REPORT; `at_exit=False` (tests) registers no exit hook."""

    def __init__(self, at_exit: bool = True, stream=None):
        self._lock = threading.Lock()
        self._said: set = set()
        self._thc_chosen = False
        self._compressed = 0
        self._threshold = None
        self._at_exit = at_exit
        self._hooked = False
        self.stream = stream  # None: sys.stderr at the time of writing

    def warn_conflict(self, choice: Choice, rank: int,
                      environ: Optional[Mapping[str, str]] = None, stacklevel: int = 2) -> None:
        """warnings.warn(conflict_message) on rank 0, once per message; `stacklevel` as
        warnings.warn's, counted from the caller."""
        message = conflict_message(choice, environ)
        if message is None or rank != 0:
            return
        with self._lock:
            if message in self._said:
                return
            self._said.add(message)
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)

    def announce(self, choice: Choice, counts: Tally, rank: int,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        """At a declare of gradient tensors: the in-force line (rank 0, the first declare only);
        adds to the end-of-run count."""
        with self._lock:
            first = rank == 0 and "in-force" not in self._said
            if first:
                self._said.add("in-force")
            self._compressed += counts.compressed
            if is_thc(choice.compressor):
                self._thc_chosen = True
                self._threshold = env.MIN_COMPRESS_BYTES.get(environ)
            hook = self._at_exit and rank == 0 and self._thc_chosen and not self._hooked
            self._hooked = self._hooked or hook
        if hook:
            atexit.register(self.end_of_run)
        if first:
            _say(in_force_line(choice, counts, environ), self.stream)

    def nothing_compressed(self) -> Optional[str]:
        """The end-of-run message when THC was chosen and no tensor was compressed, else None."""
        with self._lock:
            if not self._thc_chosen or self._compressed:
                return None
            name = env.MIN_COMPRESS_BYTES.name
            return (f"byteps-thc: THC was chosen but no tensor reached {name}={self._threshold}: "
                    f"nothing was compressed (a smaller {name}, e.g. 0, compresses smaller "
                    "tensors)")

    def end_of_run(self) -> None:
        message = self.nothing_compressed()
        if message is not None:
            _say(message, self.stream)


REPORT = RunReport()
warn_conflict = REPORT.warn_conflict
announce = REPORT.announce
