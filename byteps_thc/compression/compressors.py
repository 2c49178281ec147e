"""The compressor classes' shared behaviour; each adapter adds the tensor operations.

`Compressor` is the interface, `RegistryCompressor` a compressor of BytePS's C++ registry (kwargs
only for floating tensors of at least BYTEPS_MIN_COMPRESS_BYTES as pushed), `codec_mixin(codec)`
the part of a homomorphic codec's compressor (one configuration, its kwargs, repr and equality;
`ThcMixin`, `LhcMixin`), and `CompressionBase` the `Compression` namespace an adapter subclasses.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

from .. import codecs, env
from .kwargs import compressor_from_env, k_kwargs, onebit_kwargs


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


class CodecMixin:
    """A homomorphic codec's compressor (`codec`: its entry of byteps_thc.codecs). Put in front
    of an adapter's RegistryCompressor: carries one configuration, declared with
    `codec.kwargs(config)`, which the server checks on every push."""
    codec: codecs.Codec

    def __init__(self, config):
        self.config = self.codec.config(config=config)
        super().__init__(self.codec.name, self.config.to_kwargs())

    def kwargs(self, tensor, environ: Optional[Mapping[str, str]] = None):
        kw = super().kwargs(tensor, environ)
        return None if kw is None else self.codec.kwargs(self.config, environ)

    def __repr__(self):
        return self.codec.repr(self.config)

    def __eq__(self, other):
        return isinstance(other, CodecMixin) and other.codec is self.codec \
            and other.config == self.config

    def __hash__(self):
        return hash(self.config)


_MIXINS: Dict[str, type] = {}


def codec_mixin(codec: codecs.Codec) -> type:
    """The CodecMixin of `codec` (one class per codec: isinstance tells the codecs apart)."""
    if codec.name not in _MIXINS:
        _MIXINS[codec.name] = type(f"{codec.name.capitalize()}Mixin", (CodecMixin,),
                                   {"codec": codec, "__doc__": codec.summary})
    return _MIXINS[codec.name]


ThcMixin = codec_mixin(codecs.THC)
LhcMixin = codec_mixin(codecs.LHC)
_MADE: Dict[tuple, type] = {}  # (adapter's Compression, codec name) -> its compressor class


class CompressionBase:
    """Optional gradient compression: `none`, `fp16`, each codec of byteps_thc.codecs
    (`thc(...)`, `lhc(...)`), BytePS's `onebit()`, `topk(k)`, `randomk(k)`, `dithering(k)`, or
    `from_env()` (what bpslaunch --compressor chose).

    An adapter subclasses it as `Compression`, sets `none` and `fp16` to its instances and
    `_registry_class` to its RegistryCompressor; a codec's compressor class is
    `_<name>_class` where the adapter names one (`_thc_class`), else that codec's mixin in front
    of `_registry_class`."""

    none: Compressor = None
    fp16: Compressor = None
    _registry_class = RegistryCompressor

    @classmethod
    def codec_class(cls, name: str) -> type:
        """The adapter's compressor class of the codec `name` (ValueError for an unknown one):
        its own `_<name>_class`, else one made of the codec's mixin and `_registry_class`."""
        codec = codecs.get(name)
        own = getattr(cls, f"_{name}_class", None)
        if own is not None:
            return own
        if (cls, name) not in _MADE:
            _MADE[cls, name] = type(f"{name.capitalize()}Compressor",
                                    (codec_mixin(codec), cls._registry_class), {})
        return _MADE[cls, name]

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
        if name in codecs.CODECS:
            return cls.codec_class(name)(what)
        return cls._registry_class(name, what)


def _codec_constructor(codec: codecs.Codec):
    def make(cls, config=None, **params):
        return cls.codec_class(codec.name)(codec.config(config, **params))
    make.__name__ = make.__qualname__ = codec.name
    make.__doc__ = (f"{codec.summary}; with a ready `config`, or with `params` "
                    f"({codec.config_class.__name__}'s fields: {', '.join(codec.params)}; its "
                    "defaults for the others), validated here, before any push.")
    return classmethod(make)


for _codec in codecs.CODECS.values():  # Compression.thc(...), Compression.lhc(...), ...
    setattr(CompressionBase, _codec.name, _codec_constructor(_codec))
