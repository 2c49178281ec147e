"""ThcCodec and ThcAggregator: the public codec API on top of the C++ core (byteps_thc._C).

    from byteps_thc import ThcConfig, ThcCodec, ThcAggregator
    codec = ThcCodec(cfg, size=d, rank=r)          # one partition of d >= 1 elements
    m = codec.norm(x)                              # local norm (residual included when EF is on;
                                                   # block_scale: one per rotation block, an array)
    payload = codec.encode(x, max_norm)            # packed uint8 array; advances the step
                                                   # (with EF it reuses norm's rotation of x)
    agg = ThcAggregator(cfg, size=d, num_workers=n)
    agg.add(payload); ...; sums = agg.result()     # integer array, lane width by n*g
    mean = codec.decode(sums, max_norm, num_workers=n)   # float32, d elements

The algorithm, bit for bit, is docs/ALGORITHM.md; byteps_thc.thc.reference is its NumPy twin and the
C++ kernels produce the same payloads. Inputs are 1-D NumPy arrays or torch CPU tensors in
float32 (float16, bfloat16 and float64 are converted); torch is never imported here unless a
tensor is passed. Every error is a ValueError that says what was wrong; nothing crashes.
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from .. import _C
from ..common import inputs
from .config import ThcConfig

__all__ = ["ThcCodec", "ThcAggregator", "active_isa", "force_isa"]

def active_isa() -> str:
    """The CPU instruction set the kernels use: 'avx512', 'avx2' or 'portable'."""
    return _C.active_isa()


def force_isa(name: str) -> bool:
    """Caps the kernels' instruction set (tests, benchmarks); False if this CPU lacks it."""
    return _C.force_isa(name)


# The core's Config of a ThcConfig (validated): the binding's one converter, cached per config.
_core_config = functools.lru_cache(maxsize=64)(_C.core_config)


def _cuda_unavailable(what: str):
    """The one place a CUDA tensor reaches this CPU codec (the hook for a device dispatch)."""
    if getattr(_C, "with_cuda", False):
        raise ValueError(f"{what} is a CUDA tensor; ThcCodec/ThcAggregator run on the CPU: use "
                         "byteps_thc.thc.cuda.CudaCodec / CudaAggregator for device tensors, or "
                         "pass a CPU tensor")
    raise ValueError(
        f"{what} is a CUDA tensor, but byteps_thc._C was built without CUDA (nvcc was not found "
        "at build time); pass a CPU tensor, or rebuild with THC_CUDA=1 on a machine with nvcc")


class ThcCodec:
    """One worker's THC codec for one partition of `size` elements.

    Holds the error-feedback residual (when cfg.error_feedback) and the step counter, which
    selects the stochastic-rounding stream together with `rank`. Not thread-safe per instance;
    distinct instances (partitions) may run in parallel threads (the GIL is released).
    `threads`: norm, encode and decode of this partition on up to that many threads (whole
    rotation blocks each, at least 2^16 coordinates a thread); the results are bit for bit
    those of one thread. CPU only; a CUDA tensor's codec ignores it.
    """

    def __init__(self, cfg: ThcConfig, size: int, rank: int = 0, threads: int = 1):
        self.config = inputs.check_type("cfg", cfg, ThcConfig, "a ThcConfig")
        self.size = inputs.check_int("size", size, 1, _C.MAX_SIZE)
        self.rank = inputs.check_int("rank", rank, 0, _C.MAX_RANK)
        self._core = _core_config(cfg)
        self._enc = _C.Encoder(self._core, self.size, self.rank, cfg.error_feedback)
        self.threads = threads
        geo = self._enc.geometry
        self.block = geo["block"]            # rotation block actually used
        self.padded = geo["padded"]          # d_pad
        self.payload_bytes = geo["payload_bytes"]
        self.blocks = self._enc.blocks       # rotation blocks: block_scale's norms per partition
        self._device = None                  # CudaCodec, once a CUDA tensor came (see _on_device)

    def __repr__(self) -> str:
        return (f"ThcCodec(size={self.size}, rank={self.rank}, block={self.block}, "
                f"step={self.step}, {self.config.describe()})")

    # -- state -------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return self._enc.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._enc.threads = inputs.check_int("threads", value, 1, _C.MAX_THREADS)

    @property
    def step(self) -> int:
        return self._device.step if self._device is not None else self._enc.step

    @step.setter
    def step(self, value: int) -> None:
        value = inputs.check_int("step", value, 0, _C.MAX_STEP)
        if self._device is not None:
            self._device.step = value
        self._enc.step = value

    @property
    def residual(self) -> Optional[np.ndarray]:
        """A copy of the error-feedback state, or None without error feedback: the residual in
        the rotated domain, `padded` floats (docs/ALGORITHM.md, "Error-feedback state";
        byteps_thc.thc.reference.unrotate_residual gives the textbook residual of `size` floats)."""
        if self._device is not None and self._device.residual is not None:
            return self._device.residual.cpu().numpy()
        return self._enc.residual

    def reset_residual(self) -> None:
        if self._device is not None:
            self._device.reset_residual()
        self._enc.reset_residual()

    # -- the codec ---------------------------------------------------------------------------
    def _on_device(self, x, what: str):
        """The CUDA twin of this codec when x is a CUDA tensor (created on first use, with this
        codec's step and residual moved over), else None. Everything then stays on the device."""
        if not (inputs.is_torch_tensor(x) and x.is_cuda):
            return None
        if not getattr(_C, "with_cuda", False):
            _cuda_unavailable(what)
        dev = self._device
        if dev is None:
            from . import cuda
            dev = cuda.CudaCodec(self.config, self.size, self.rank, device=x.device)
            dev.step = self.step
            res = self.residual
            if res is not None and res.any():
                dev.residual.copy_(__import__("torch").from_numpy(res))
            self._device = dev
        elif dev.device != x.device:
            raise ValueError(f"{what} is on {x.device}, "
                             f"but this codec's state lives on {dev.device}")
        return dev

    def norm(self, x):
        """||x + residual||_2 (a float); with block_scale the norm of each rotation block (a
        float64 array of `blocks`). The norm round takes the max over workers. With error feedback
        this rotates x (the residual is kept rotated), and the encode() of the same step and the
        same, unchanged x quantises that rotation instead of rotating again. Do not change x
        between the two: a change of the whole array (a new array, an in-place rescale) is seen
        and x is rotated again, but an edit of a few elements may not be."""
        dev = self._on_device(x, "x")
        if dev is not None:
            return dev.norm(x)
        xv = inputs.float_vector(x, "x", self.size, _cuda_unavailable)
        return self._enc.block_norms(xv) if self.config.block_scale else self._enc.norm(xv)

    def _max_norm(self, max_norm):
        """max_norm as the core takes it: a checked float, or with block_scale a float64 array
        (the core checks its length and values)."""
        if self.config.block_scale:
            if inputs.is_torch_tensor(max_norm):
                max_norm = max_norm.detach().cpu().numpy()
            if np.ndim(max_norm) != 1:
                raise ValueError(f"block_scale: max_norm must hold one max norm per rotation "
                                 f"block ({self.blocks}), got {np.shape(max_norm) or 'a number'}")
            return np.ascontiguousarray(max_norm, dtype=np.float64)
        if isinstance(max_norm, np.ndarray) and max_norm.ndim:
            raise ValueError(f"max_norm must be one number (block_scale is off), got an array "
                             f"of shape {max_norm.shape}")
        return inputs.check_scale("max_norm", max_norm)

    def encode(self, x, max_norm, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The packed b-bit indices (payload_bytes uint8), with the agreed max norm (block_scale:
        one per rotation block). Advances the step; on error nothing changes (step and residual
        are kept). `out`: an optional uint8 array of payload_bytes
        to write into (no allocation); it is returned."""
        dev = self._on_device(x, "x")
        if dev is not None:
            return dev.encode(x, max_norm, out)
        xv = inputs.float_vector(x, "x", self.size, _cuda_unavailable)
        return self._enc.encode(xv, self._max_norm(max_norm), out)

    def decode(self, sums, max_norm, num_workers: int,
               out: Optional[np.ndarray] = None) -> np.ndarray:
        """The estimate of the mean input of `num_workers` workers from the aggregated sums
        (`padded` lanes, as ThcAggregator.result() gives). `out`: an optional float32 array of
        size elements to write into; it is returned."""
        n = inputs.check_int("num_workers", num_workers, 1, _C.MAX_WORKERS)
        self.config.lane_bits(n)  # raises when n*g overflows a 32-bit lane
        dev = self._on_device(sums, "sums")
        if dev is not None:
            return dev.decode(sums, max_norm, n, out)
        s = inputs.int_vector(sums, "sums", ("uint8", "uint16", "uint32"), _cuda_unavailable)
        return _C.decode(self._core, self.size, s, n, self._max_norm(max_norm), out, self.threads)


class ThcAggregator:
    """The server side for one partition: sums of table values of `num_workers` payloads."""

    def __init__(self, cfg: ThcConfig, size: int, num_workers: int):
        self.config = inputs.check_type("cfg", cfg, ThcConfig, "a ThcConfig")
        self.size = inputs.check_int("size", size, 1, _C.MAX_SIZE)
        self.num_workers = inputs.check_int("num_workers", num_workers, 1, _C.MAX_WORKERS)
        self.lane_bits = cfg.lane_bits(self.num_workers)  # raises on overflow-prone settings
        self._agg = _C.Aggregator(_core_config(cfg), self.size, self.num_workers)
        self.payload_bytes = self._agg.geometry["payload_bytes"]
        self.padded = self._agg.geometry["padded"]
        self._device = None  # CudaAggregator, once CUDA payloads come

    def __repr__(self) -> str:
        return (f"ThcAggregator(size={self.size}, num_workers={self.num_workers}, "
                f"lane_bits={self.lane_bits}, count={self.count})")

    @property
    def count(self) -> int:
        """Payloads added since the last reset."""
        return self._device.count if self._device is not None else self._agg.count

    def add(self, payload) -> None:
        if inputs.is_torch_tensor(payload) and payload.is_cuda:
            if not getattr(_C, "with_cuda", False):
                _cuda_unavailable("payload")
            if self._device is None:
                if self.count:
                    raise ValueError("payload is a CUDA tensor, but this aggregator already "
                                     f"holds {self.count} CPU payloads: "
                                     "keep one aggregator on one device")
                from . import cuda
                self._device = cuda.CudaAggregator(self.config, self.size, self.num_workers,
                                                   device=payload.device)
            self._device.add(payload)
            return
        if self._device is not None:
            raise ValueError("this aggregator sums on the GPU: pass CUDA payloads")
        self._agg.add(inputs.int_vector(payload, "payload", ("uint8",), _cuda_unavailable))

    def result(self):
        """The sums: `padded` lanes of uint8 / uint16 / uint32 (lane width by n*g); a NumPy copy,
        or the device tensor when the payloads were CUDA tensors."""
        if self._device is not None:
            return self._device.result()
        return self._agg.result()

    def reset(self) -> None:
        if self._device is not None:
            self._device.reset()
        self._agg.reset()
