"""LHC, lossless homomorphic compression of sparse gradients: a support bitmap and a count sketch
up, their OR and integer sum down, the exact sum decoded by peeling (docs/LHC.md).

    config     LhcConfig (the sizing rule, buckets_for) and LhcDecodeError
    reference  the NumPy contract, bit for bit: the C++ core (csrc/lhc) is tested against it
    codec      LhcCodec / LhcAggregator, on the C++ core when byteps_thc._C has it, else on the
               reference (codec.backend() says which)
"""
from .config import LhcConfig, LhcDecodeError

__all__ = ["LhcConfig", "LhcCodec", "LhcAggregator", "LhcDecodeError"]


def __getattr__(name):
    # The codec is imported on first use, as THC's: `import byteps_thc` stays light.
    if name in ("LhcCodec", "LhcAggregator"):
        from . import codec
        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
