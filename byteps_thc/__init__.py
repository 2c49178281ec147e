"""byteps-thc: THC (Tensor Homomorphic Compression) for BytePS.

    from byteps_thc import ThcConfig, ThcCodec, ThcAggregator, solve_table

The codec core is C++ (byteps_thc._C, built from csrc/thc); byteps_thc.reference is the plain
NumPy definition it is tested against (docs/ALGORITHM.md).
"""
from .config import ThcConfig
from .tables import expected_error, solve_table

__all__ = ["ThcConfig", "ThcCodec", "ThcAggregator", "solve_table", "expected_error"]
__version__ = "0.1.0"


def __getattr__(name):
    # The codec needs the compiled extension; import it on first use so that the configuration,
    # the solver and the reference work before `make ext`.
    if name in ("ThcCodec", "ThcAggregator"):
        from . import codec
        return getattr(codec, name)
    raise AttributeError(f"module 'byteps_thc' has no attribute {name!r}")
