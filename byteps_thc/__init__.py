"""byteps-thc: THC (Tensor Homomorphic Compression) and LHC (lossless homomorphic compression)
for BytePS.

    from byteps_thc import ThcConfig, ThcCodec, ThcAggregator, solve_table
    from byteps_thc import LhcConfig, LhcCodec, LhcAggregator, LhcDecodeError

Each codec is a package: byteps_thc.thc (its C++ core is csrc/thc, bound as byteps_thc._C;
byteps_thc.thc.reference is the plain NumPy definition it is tested against, docs/ALGORITHM.md)
and byteps_thc.lhc (csrc/lhc when _C is built, else its NumPy reference byteps_thc.lhc.reference,
which the core equals bit for bit; docs/LHC.md). What both share (the hashes, the checks of
their inputs, their configurations' environment) is written once, in byteps_thc.common.
"""
from . import lhc, thc
from .lhc import LhcConfig, LhcDecodeError
from .thc import ThcConfig, expected_error, solve_table

__all__ = ["ThcConfig", "ThcCodec", "ThcAggregator", "solve_table", "expected_error",
           "LhcConfig", "LhcCodec", "LhcAggregator", "LhcDecodeError"]
__version__ = "0.1.0"

_CODEC_OF = {"ThcCodec": thc, "ThcAggregator": thc, "LhcCodec": lhc, "LhcAggregator": lhc}


def __getattr__(name):
    # The codecs are imported on first use (THC's needs the compiled extension), so that the
    # configurations, the solver and the references work before `make ext`.
    if name in _CODEC_OF:
        return getattr(_CODEC_OF[name], name)
    raise AttributeError(f"module 'byteps_thc' has no attribute {name!r}")
