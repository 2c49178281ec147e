"""The checks of what a codec is given, shared by THC's and LHC's codecs: each bad value is a
ValueError that names it and says what was expected, before anything runs or changes.

Inputs are NumPy arrays or torch CPU tensors; torch is never imported here (a tensor can only
exist once torch was imported). A CUDA tensor is the codec's to handle: `on_cuda(what)` raises
the codec's own message where it has no device path for it.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, Optional

import numpy as np

# Float dtypes a codec converts to float32 (exactly: each holds a subset of float32's values,
# float64 rounded once); any other dtype is refused.
CONVERTIBLE = ("float16", "bfloat16", "float64")


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def check_type(name: str, value: Any, cls: type, expected: str):
    """`value` when it is a `cls`; else ValueError "<name> must be <expected>, got <type>"."""
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be {expected}, got {type(value).__name__}")
    return value


def check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    """`value` as an int in [lo, hi] (hi None: no upper bound); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r} must be an integer")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}={value} must be {bound}")
    return value


def check_scale(name: str, value: Any) -> float:
    """A finite number >= 0 (the max round's result: THC's max norm, LHC's max |v|); a
    one-element tensor is read."""
    if is_torch_tensor(value):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of {value.numel()} elements")
        value = value.item()
    try:
        m = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a number") from None
    if math.isnan(m):
        raise ValueError(f"{name} is NaN")
    if math.isinf(m):
        raise ValueError(f"{name} is {m} (must be finite)")
    if m < 0:
        raise ValueError(f"{name}={m} must be >= 0")
    return m


def to_numpy(x: Any, what: str, on_cuda: Callable[[str], None]) -> np.ndarray:
    """x as a NumPy array: a CPU tensor's data (bfloat16 as float32, which NumPy lacks), bytes
    as uint8, anything else through np.asarray."""
    if is_torch_tensor(x):
        if x.is_cuda:
            on_cuda(what)
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.detach().contiguous().cpu().numpy()
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.uint8)
    return np.asarray(x)


def _check_float_dtype(name: str, what: str) -> None:
    if name != "float32" and name not in CONVERTIBLE:
        raise ValueError(f"{what} has dtype {name}; expected float32 "
                         f"(or {', '.join(CONVERTIBLE)}, which are converted)")


def float_vector(x: Any, what: str, size: int, on_cuda: Callable[[str], None]) -> np.ndarray:
    """x as a 1-D C-contiguous float32 array of `size` elements (CONVERTIBLE dtypes converted)."""
    if is_torch_tensor(x):
        if x.is_cuda:
            on_cuda(what)
        _check_float_dtype(str(x.dtype).replace("torch.", ""), what)
    a = to_numpy(x, what, on_cuda)
    _check_float_dtype(a.dtype.name, what)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(a.shape)}")
    if a.size != size:
        raise ValueError(f"{what} has {a.size} elements, "
                         f"but this codec's partition has size={size}")
    return np.ascontiguousarray(a, dtype=np.float32)


def int_vector(x: Any, what: str, dtypes: tuple, on_cuda: Callable[[str], None]) -> np.ndarray:
    """x as a 1-D C-contiguous array of one of `dtypes` (names, e.g. ("uint8",)); no conversion."""
    a = to_numpy(x, what, on_cuda)
    if a.dtype.name not in dtypes:
        raise ValueError(f"{what} has dtype {a.dtype.name}; expected {' or '.join(dtypes)}")
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(a.shape)}")
    return np.ascontiguousarray(a)
