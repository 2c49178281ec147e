"""byteps-thc: THC (Tensor Homomorphic Compression) and LHC (lossless homomorphic compression)
for BytePS.

    from byteps_thc import ThcConfig, ThcCodec, ThcAggregator, solve_table
    from byteps_thc import LhcConfig, LhcCodec, LhcAggregator, LhcDecodeError

The codec core is C++ (byteps_thc._C, built from csrc/thc); byteps_thc.reference is the plain
NumPy definition it is tested against (docs/ALGORITHM.md). LHC's codec runs on the C++ core
(csrc/lhc) when _C is built and on its NumPy reference, byteps_thc.lhc_reference, otherwise.
"""
from .config import ThcConfig
from .lhc_config import LhcConfig, LhcDecodeError
from .tables import expected_error, solve_table

__all__ = ["ThcConfig", "ThcCodec", "ThcAggregator", "solve_table", "expected_error",
           "LhcConfig", "LhcCodec", "LhcAggregator", "LhcDecodeError"]
__version__ = "0.1.0"


def __getattr__(name):
    # The codec needs the compiled extension; import it on first use so that the configuration,
    # the solver and the reference work before `make ext`.
    if name in ("ThcCodec", "ThcAggregator"):
        from . import codec
        return getattr(codec, name)
    if name in ("LhcCodec", "LhcAggregator"):  # the same, for the LHC core when it is built
        from . import lhc_codec
        return getattr(lhc_codec, name)
    raise AttributeError(f"module 'byteps_thc' has no attribute {name!r}")
