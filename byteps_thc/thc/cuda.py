"""The THC codec on CUDA tensors: everything stays on the device.

The CUDA twins of the codec kernels (csrc/thc/cuda, bound in byteps_thc._C.cuda) take raw device
pointers and a stream handle; this module is their Python face for torch CUDA tensors, so that
neither torch nor Python enters the kernels. `codec.ThcCodec` / `ThcAggregator` hand CUDA tensors
here; it can also be used directly:

    from byteps_thc import ThcConfig
    from byteps_thc.thc import cuda as thc_cuda
    enc = thc_cuda.CudaCodec(ThcConfig(), size=grad.numel(), rank=r)
    m = enc.norm(grad, sync=False)           # 0-dim float64 on the device, no host sync
    ...                                      # the norm round: max over workers (on the device)
    payload = enc.encode(grad, m)            # uint8 CUDA tensor, payload_bytes long
    sums = thc_cuda.aggregate(cfg, torch.stack(payloads), grad.numel(), n)
    mean = enc.decode(sums, m, n)            # float32 CUDA tensor (or out_dtype=grad.dtype)

All work is enqueued on torch's current stream of the tensor's device. The results are bit for bit
those of docs/ALGORITHM.md (the payload equals the CPU core's; see tests/unit/test_cuda.py).

Errors found on the device (NaN/Inf in the input, a non-finite max norm, the rotation overflowing
float32) are recorded in a status word: with check=True (the default) encode/decode read it (one
4-byte copy, which waits for the stream) and raise ValueError, leaving the step and residual as they
were. With check=False nothing waits; call `status()` later (non-zero: that step failed).

With error feedback the residual is kept rotated (docs/ALGORITHM.md, "Error-feedback state"): a
float32 tensor of d_pad elements, zeros at the start, as codec.ThcCodec's. The norm then computes
y = Hu(sign * grad) + r (a transform) and flags an overflow of y; since encode always follows a
norm launch of the same tensor on the same status word, an overflow leaves the state untouched.

With ThcConfig(block_scale=True) (a scale per rotation block, docs/ALGORITHM.md) the norm gives
one norm per rotation block (`blocks` of them: a float64 array, or with sync=False the device
tensor), and encode/decode take one max norm M_k per block: a 1-D array, list or tensor of
`blocks` values (a CUDA tensor stays on the device; host values are checked here and copied).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .config import TILE_ALIGN, ThcConfig


def _extension():
    """byteps_thc._C, or None when it is not built (this module imports without it)."""
    try:
        from .. import _C
    except ImportError:
        return None
    return _C


def _kernels():
    """byteps_thc._C.cuda, or None when the extension was built without CUDA."""
    ext = _extension()
    return getattr(ext, "cuda", None) if getattr(ext, "with_cuda", False) else None


def built_with_cuda() -> bool:
    return _kernels() is not None


def available() -> bool:
    """True when the extension has the CUDA kernels and a CUDA device is present."""
    k = _kernels()
    return k is not None and k.device_count() > 0


def _require():
    k = _kernels()
    if k is None:
        raise ValueError("byteps_thc._C was built without CUDA (nvcc was not found at build time); "
                         "rebuild with THC_CUDA=1 on a machine with nvcc, or use CPU tensors")
    return k


def _torch():
    import torch
    return torch


@functools.lru_cache(maxsize=64)
def device_code(cfg: ThcConfig, fused_max_log: int = 14, column_max_bits: int = 11,
                chunk_log: int = 22):
    """The kernels' copy of the configuration (table included). The planning knobs force more
    transform passes and chunks on small sizes (tests); leave them at their defaults otherwise."""
    k = _require()
    return k.code_from_config(_extension().core_config(cfg), fused_max_log, column_max_bits,
                              chunk_log)


def _one_block_size(cfg: ThcConfig, size: int) -> ThcConfig:
    """cfg with the core's rotation block for a partition of `size` values (so that the kernels
    lay it out as the CPU core does), or a ValueError where the core's default tiling needs a
    smaller last block: the kernels rotate in blocks of one size."""
    from .reference import geometry
    geo = geometry(cfg, size)
    if geo.tail_block:
        raise ValueError(
            f"thc.cuda: a partition of {size} values is tiled by blocks of {geo.block} and a last "
            f"block of {geo.tail_block}, which the CUDA kernels do not do yet; give a "
            f"rotation_block (blocks of one size, e.g. {geo.block} pads it to "
            f"{-(-size // geo.block) * geo.block}) or use the CPU codec for it")
    # block_scale's blocks are at least TILE_ALIGN (the kernels cap the block at next_pow2(size)
    # as the core does, so a partition smaller than that is still one block of next_pow2(size))
    block = max(geo.block, TILE_ALIGN) if cfg.block_scale else geo.block
    return dataclasses.replace(cfg, rotation_block=block)


def _dtype_code(dtype) -> int:
    torch, k = _torch(), _require()
    codes = {torch.float32: k.FLOAT32, torch.float16: k.FLOAT16, torch.bfloat16: k.BFLOAT16}
    if dtype not in codes:
        raise ValueError(f"dtype {dtype} is not supported; expected float32, float16 or bfloat16")
    return codes[dtype]


def _lane_dtype(lane_bits: int):
    torch = _torch()
    return {8: torch.uint8, 16: torch.uint16, 32: torch.uint32}[lane_bits]


def _stream(device) -> int:
    return _torch().cuda.current_stream(device).cuda_stream


def _vector(x, what: str, size: int, device, dtypes=None):
    torch = _torch()
    if not isinstance(x, torch.Tensor) or not x.is_cuda:
        raise ValueError(f"{what} must be a CUDA tensor")
    if x.device != device:
        raise ValueError(f"{what} is on {x.device}, but this codec lives on {device}")
    if x.numel() != size:
        raise ValueError(f"{what} has {x.numel()} elements; expected {size}")
    if dtypes is not None and x.dtype not in dtypes:
        raise ValueError(f"{what} has dtype {x.dtype}; "
                         f"expected one of {', '.join(map(str, dtypes))}")
    return x.detach().reshape(-1).contiguous()


def _max_norm_args(max_norm, device):
    """(host value, device pointer, keep-alive) for a float or a 0-dim CUDA tensor."""
    torch = _torch()
    if isinstance(max_norm, torch.Tensor):
        if not max_norm.is_cuda:
            return float(max_norm.item()), 0, None
        if max_norm.numel() != 1 or max_norm.device != device:
            raise ValueError(f"max_norm must be one element on {device}")
        m = max_norm.detach().reshape(()).to(torch.float64).contiguous()
        return 0.0, m.data_ptr(), m
    return float(max_norm), 0, None


def _bad_block_norm(m) -> str:
    """The message for block_scale's max norms `m` (float64, host or device) with a value that is
    not finite or negative, naming the first one; "" when all are good."""
    v = m.detach().cpu().numpy() if not isinstance(m, np.ndarray) else m
    bad = np.flatnonzero(~(np.isfinite(v) & (v >= 0)))
    if not bad.size:
        return ""
    i = int(bad[0])
    more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
    return (f"block_scale: the max norm of block {i} must be finite and >= 0, "
            f"got {float(v[i])}{more}")


def _raise_status(value: int, what: str, block_norms=None):
    if value:
        named = ""
        if block_norms is not None and value & _require().STATUS_NON_FINITE_NORM:
            named = _bad_block_norm(block_norms)
        raise ValueError(f"{what}: {named or _require().status_text(value)}; "
                         "the step and the residual are unchanged")


class CudaCodec:
    """One worker's THC codec for one partition of `size` elements, on one CUDA device.

    Holds the error-feedback residual (the rotated state: float32, d_pad elements, on the device)
    and the step counter, like codec.ThcCodec. Inputs: 1-D CUDA tensors of float32, float16 or
    bfloat16 (read as float32).
    """

    def __init__(self, cfg: ThcConfig, size: int, rank: int = 0, device=None, *,
                 fused_max_log: int = 14, column_max_bits: int = 11, chunk_log: int = 22):
        torch, k = _torch(), _require()
        if not isinstance(cfg, ThcConfig):
            raise ValueError(f"cfg must be a ThcConfig, got {type(cfg).__name__}")
        max_size = _extension().MAX_SIZE
        if not isinstance(size, int) or not 1 <= size <= max_size:
            raise ValueError(f"size={size!r} must be an integer in [1, {max_size}]")
        max_rank = _extension().MAX_RANK
        if not isinstance(rank, int) or not 0 <= rank <= max_rank:
            raise ValueError(f"rank={rank!r} must be an integer in [0, {max_rank}]")
        self.config, self.size, self.rank = cfg, size, rank
        self.device = torch.device(device if device is not None else "cuda", )
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._k = k
        self._code = device_code(_one_block_size(cfg, size), fused_max_log, column_max_bits,
                                 chunk_log)
        _, self.block, self.padded, self.payload_bytes = k.geometry(self._code, size)
        self.block_scale = cfg.block_scale
        self.blocks = k.num_blocks(self._code, size)  # block_scale's norms per partition
        with torch.cuda.device(self.device):
            f32 = dict(dtype=torch.float32, device=self.device)
            f64 = dict(dtype=torch.float64, device=self.device)
            self._residual = torch.zeros(self.padded, **f32) if cfg.error_feedback else None
            ws = k.workspace_floats(self._code, size)
            # Kept for the codec's life (decode uses it too); 16-byte aligned as allocated.
            self._workspace = torch.empty(ws, **f32) if ws else None
            self._norm = torch.zeros(self.blocks if self.block_scale else (), **f64)
            # block_scale: where M_k given on the host are copied (the kernels read the device)
            self._m_dev = torch.zeros(self.blocks, **f64) if self.block_scale else None
            self._status = torch.zeros((), dtype=torch.int32, device=self.device)
        self._norm_of = None  # the input tensor whose norm (and check) was launched last
        self._step = 0

    def __repr__(self) -> str:
        return (f"CudaCodec(size={self.size}, rank={self.rank}, block={self.block}, "
                f"step={self._step}, device={self.device}, {self.config.describe()})")

    # -- state -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        max_step = _extension().MAX_STEP
        if not isinstance(value, int) or not 0 <= value <= max_step:
            raise ValueError(f"step={value!r} must be an integer in [0, {max_step}]")
        self._step = value

    @property
    def residual(self):
        """The error-feedback state (the device tensor itself: float32, d_pad elements, kept
        rotated: docs/ALGORITHM.md), or None."""
        return self._residual

    def reset_residual(self) -> None:
        if self._residual is not None:
            self._residual.zero_()

    def status(self) -> int:
        """The device status word of the last norm/encode/decode (reads it: waits)."""
        return int(self._status.item())

    def _ptr(self, t) -> int:
        return 0 if t is None else t.data_ptr()

    # -- the codec ---------------------------------------------------------------------------
    def _launch_norm(self, xv, stream) -> None:
        self._k.norm(self._code, xv.data_ptr(), _dtype_code(xv.dtype), self._ptr(self._residual),
                     self.size, self._norm.data_ptr(), self._ptr(self._workspace),
                     self._status.data_ptr(), stream,
                     norm_count=self.blocks if self.block_scale else 0)

    def norm(self, x, sync: bool = True):
        """The local norm in binary64 (docs/ALGORITHM.md, "Norm"): ||x||_2, or with error
        feedback sqrt(sum(y^2) / B) over y = Hu(sign * x) + r; with block_scale one per rotation
        block. sync=True: a float (block_scale: a float64 NumPy array of `blocks`), ValueError
        on NaN/Inf or overflow; sync=False: the float64 CUDA tensor (0-dim, or `blocks` long),
        nothing waits (encode then skips a bad input). The tensor is this codec's own, rewritten
        by its next norm."""
        torch = _torch()
        xv = _vector(x, "x", self.size, self.device)
        with torch.cuda.device(self.device):
            self._launch_norm(xv, _stream(self.device))
        self._norm_of = xv
        if not sync:
            return self._norm
        _raise_status(self.status(), "norm")
        if self.block_scale:
            return self._norm.cpu().numpy()
        return float(self._norm.item())

    def _scale_args(self, max_norm):
        """(host M, device pointer, max_norm_count, keep-alive) of encode's or decode's max norm:
        one M (a float or a 0-dim CUDA tensor), or with block_scale one M_k per rotation block
        (a CUDA tensor is read on the device, where the kernels check it; host values are
        checked here, naming a bad one, and copied to the device)."""
        torch = _torch()
        if not self.block_scale:
            if isinstance(max_norm, np.ndarray) and max_norm.ndim:
                raise ValueError(f"max_norm must be one number (block_scale is off), got an "
                                 f"array of shape {max_norm.shape}")
            m_host, m_ptr, m_keep = _max_norm_args(max_norm, self.device)
            return m_host, m_ptr, 0, m_keep
        want = (f"block_scale: max_norm must hold one max norm per rotation block "
                f"({self.blocks})")
        if isinstance(max_norm, torch.Tensor) and max_norm.is_cuda:
            if max_norm.device != self.device:
                raise ValueError(f"{want} on {self.device}, got a tensor on {max_norm.device}")
            if max_norm.dim() != 1 or max_norm.numel() != self.blocks:
                raise ValueError(f"{want}, got shape {tuple(max_norm.shape)}")
            m = max_norm.detach().to(torch.float64).contiguous()
            return 0.0, m.data_ptr(), self.blocks, m
        if isinstance(max_norm, torch.Tensor):
            max_norm = max_norm.detach().numpy()
        m = np.asarray(max_norm, dtype=np.float64)
        if m.ndim != 1 or m.size != self.blocks:
            raise ValueError(f"{want}, got shape {m.shape}" if m.ndim else f"{want}, got a number")
        bad = _bad_block_norm(m)
        if bad:
            raise ValueError(bad)
        self._m_dev.copy_(torch.from_numpy(np.ascontiguousarray(m)))
        return 0.0, self._m_dev.data_ptr(), self.blocks, self._m_dev

    def encode(self, x, max_norm, out=None, check: bool = True):
        """The packed b-bit indices: a uint8 CUDA tensor of payload_bytes (or `out`). max_norm:
        a float or a 0-dim CUDA tensor (the norm round's result, left on the device); with
        block_scale one M_k per rotation block (`blocks`: an array, or a CUDA tensor). Advances
        the step. The input is checked for NaN/Inf (and, with error feedback, y for overflow) by
        the norm launch of the same tensor, or by one launched here when there was none (with
        error feedback that one runs the transform too); a failed check leaves payload, residual
        and step as they were. Without error feedback an overflow is found by the encode itself:
        step unchanged, `out` partly written."""
        torch = _torch()
        xv = _vector(x, "x", self.size, self.device)
        with torch.cuda.device(self.device):
            m_host, m_ptr, m_count, m_keep = self._scale_args(max_norm)
        if out is None:
            out = torch.empty(self.payload_bytes, dtype=torch.uint8, device=self.device)
        elif not (out.is_cuda and out.dtype == torch.uint8 and out.is_contiguous()
                  and out.numel() == self.payload_bytes and out.device == self.device):
            raise ValueError(f"out must be a contiguous uint8 CUDA tensor of {self.payload_bytes} "
                             f"bytes on {self.device}")
        with torch.cuda.device(self.device):
            stream = _stream(self.device)
            if self._norm_of is None or self._norm_of.data_ptr() != xv.data_ptr():
                self._launch_norm(xv, stream)  # the input and overflow check
            self._k.encode(self._code, xv.data_ptr(), _dtype_code(xv.dtype),
                           self._ptr(self._residual), self.size, self.rank, self._step, m_host,
                           m_ptr, out.data_ptr(), self._ptr(self._workspace),
                           self._status.data_ptr(), stream, max_norm_count=m_count)
        self._norm_of = None
        if check:
            _raise_status(self.status(), "encode", m_keep if self.block_scale else None)
        del m_keep
        self._step += 1
        return out

    def decode(self, sums, max_norm, num_workers: int, out=None, out_dtype=None,
               check: bool = True):
        """The estimate of the mean input from the aggregated sums (lanes of lane_bits, d_pad
        long, on the device): float32, or `out_dtype` (float16/bfloat16: rounded once).
        max_norm as encode takes it (block_scale: one M_k per rotation block)."""
        torch, k = _torch(), self._k
        lane_bits = k.lane_bits(self._code, num_workers)
        if lane_bits == 0:
            raise ValueError(f"num_workers={num_workers} * granularity does not fit 32 bits")
        sv = _vector(sums, "sums", self.padded, self.device, (_lane_dtype(lane_bits),))
        with torch.cuda.device(self.device):
            m_host, m_ptr, m_count, m_keep = self._scale_args(max_norm)
        dtype = out_dtype or torch.float32
        code = _dtype_code(dtype)
        if out is None:
            out = torch.empty(self.size, dtype=dtype, device=self.device)
        elif not (out.is_cuda and out.dtype == dtype and out.is_contiguous()
                  and out.numel() == self.size and out.device == self.device):
            raise ValueError(f"out must be a contiguous {dtype} CUDA tensor of {self.size} "
                             f"elements on {self.device}")
        fp32 = dtype == torch.float32
        with torch.cuda.device(self.device):
            self._status.zero_()
            k.decode(self._code, sv.data_ptr(), lane_bits, num_workers, self.size, m_host, m_ptr,
                     out.data_ptr() if fp32 else 0, 0 if fp32 else out.data_ptr(), code,
                     self._ptr(self._workspace), self._status.data_ptr(), _stream(self.device),
                     max_norm_count=m_count)
        if check:
            _raise_status(self.status(), "decode", m_keep if self.block_scale else None)
        del m_keep
        return out


def aggregate(cfg: ThcConfig, payloads, size: int, num_workers: int, out=None,
              accumulate: bool = False):
    """S_j = sum over the payloads of TBL[index_j], in lanes of 8/16/32 bits (uint8/16/32 CUDA
    tensor of d_pad). payloads: a 2-D uint8 CUDA tensor [count, payload_bytes] (rows may be
    strided) or a list of 1-D ones. accumulate=True adds to `out`."""
    torch, k = _torch(), _require()
    code = device_code(_one_block_size(cfg, size))
    _, _, padded, nbytes = k.geometry(code, size)
    lane_bits = k.lane_bits(code, num_workers)
    if lane_bits == 0:
        raise ValueError(f"num_workers={num_workers} * granularity does not fit 32 bits")
    if isinstance(payloads, (list, tuple)):
        payloads = torch.stack([p.reshape(-1) for p in payloads]) if payloads else None
    if (payloads is None or payloads.dim() != 2 or payloads.dtype != torch.uint8
            or not payloads.is_cuda):
        raise ValueError("payloads must be a 2-D uint8 CUDA tensor [count, payload_bytes] "
                         "or a list")
    count = payloads.shape[0]
    if payloads.shape[1] != nbytes:
        raise ValueError(f"payloads of {payloads.shape[1]} bytes; expected {nbytes}")
    if count > num_workers:
        raise ValueError(f"{count} payloads for num_workers={num_workers}")
    if payloads.stride(1) != 1:
        payloads = payloads.contiguous()
    device = payloads.device
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs `out` (the sums to add to)")
        out = torch.empty(padded, dtype=_lane_dtype(lane_bits), device=device)
    elif not (out.is_cuda and out.dtype == _lane_dtype(lane_bits) and out.numel() == padded
              and out.is_contiguous() and out.device == device):
        raise ValueError(f"out must be a contiguous {_lane_dtype(lane_bits)} CUDA tensor "
                         f"of {padded}")
    with torch.cuda.device(device):
        k.aggregate(code, payloads.data_ptr(), count, payloads.stride(0), size, out.data_ptr(),
                    lane_bits, accumulate, _stream(device))
    return out


class CudaAggregator:
    """The server's job on a GPU: sums of up to num_workers payloads, added one at a time."""

    def __init__(self, cfg: ThcConfig, size: int, num_workers: int, device=None):
        torch, k = _torch(), _require()
        self.config, self.size, self.num_workers = cfg, size, num_workers
        code = device_code(_one_block_size(cfg, size))
        _, _, self.padded, self.payload_bytes = k.geometry(code, size)
        self.lane_bits = k.lane_bits(code, num_workers)
        if self.lane_bits == 0:
            raise ValueError(f"num_workers={num_workers} * granularity does not fit 32 bits")
        self.device = torch.device(device if device is not None else "cuda")
        self._sums = torch.zeros(self.padded, dtype=_lane_dtype(self.lane_bits), device=self.device)
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def add(self, payload) -> None:
        if self._count >= self.num_workers:
            raise ValueError(f"already {self._count} payloads for num_workers={self.num_workers}")
        aggregate(self.config, payload.reshape(1, -1), self.size, self.num_workers,
                  out=self._sums, accumulate=self._count > 0)
        self._count += 1

    def result(self):
        return self._sums

    def reset(self) -> None:
        self._count = 0
        self._sums.zero_()
