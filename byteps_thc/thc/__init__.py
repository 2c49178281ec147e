"""THC, Tensor Homomorphic Compression: table indices up, integer sums down (docs/ALGORITHM.md).

    config     ThcConfig, the one configuration: validated once, read from the environment,
               serialised once for the server (to_kwargs), compared by its fingerprint
    tables     the table solver (solve_table) and the expected error
    reference  the NumPy definition, bit for bit: every kernel is tested against it
    codec      ThcCodec / ThcAggregator on the C++ core (byteps_thc._C, csrc/thc)
    cuda       CudaCodec / CudaAggregator: the same on CUDA tensors (csrc/thc/cuda)
"""
from .config import ThcConfig
from .tables import expected_error, solve_table

__all__ = ["ThcConfig", "ThcCodec", "ThcAggregator", "solve_table", "expected_error"]


def __getattr__(name):
    # The codec needs the compiled extension; it is imported on first use so that the
    # configuration, the solver and the reference work before `make ext`.
    if name in ("ThcCodec", "ThcAggregator"):
        from . import codec
        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
