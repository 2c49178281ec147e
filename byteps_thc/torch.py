"""PyTorch adapter of byteps-thc: gradient compression (none, fp16, THC, BytePS's own) for BytePS.

The patched `byteps.torch` takes `Compression`, `DistributedOptimizer`, `broadcast_parameters` and
`broadcast_optimizer_state` from here (csrc/byteps/patches/0080-*), so user code stays BytePS's:

    import byteps.torch as bps
    bps.init()
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=bps.Compression.thc(bits=4))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)

Without a `compression=` argument, or with `compression=Compression.none` (upstream's default,
which its scripts pass as boilerplate), the optimizer uses what `bpslaunch --compressor ...`
chose (BYTEPS_COMPRESSOR and BYTEPS_THC_*, read by `Compression.from_env`; every variable's name
and default is in byteps_thc.env, THC's defaults are ThcConfig's). Any other explicit choice
stays in force, with one warning on rank 0 when the launcher chose something else. At its
declare rank 0 prints one line saying what is in force (byteps_thc.compression.announce).

Two kinds of compressor:
- framework compressors (`none`, `fp16`) change the tensor handed to BytePS (a cast) and undo it;
- registry compressors (`thc`, `onebit`, `topk`, `randomk`, `dithering`) hand BytePS a float32
  tensor and a set of kwargs; BytePS's worker pipeline compresses every partition with the C++
  compressor registered under that name, and the server sums (THC: integer sums of table values,
  never decompressing). Nothing of THC's math runs in Python: the norm round, the error-feedback
  state and the packing live in the pipeline. Tensors smaller than BYTEPS_MIN_COMPRESS_BYTES
  (env.MIN_COMPRESS_BYTES) are declared without kwargs and travel uncompressed.

This module imports `byteps.torch.ops` only when a function needs it, so that `byteps.torch`
can import this module while it initialises, and so that the compression objects can be used
(and tested) without a BytePS build.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Mapping, Optional, Tuple

import torch

from . import compression as _c
from . import env
from .compression import Compressor
from .forklib import ForkLib
from .lhc import LhcConfig  # noqa: F401 - part of this module's namespace
from .thc import ThcConfig  # noqa: F401 - part of this module's namespace
from .torch_broadcast import NATIVE as _NATIVE
from .torch_broadcast import broadcast_optimizer_state, broadcast_parameters


def _ops():
    from byteps.torch import ops  # deferred: byteps.torch imports this module
    return ops


# ------------------------------------------------------------------------------------------------
# Compressors (the framework-free part, kwargs and from_env, is byteps_thc.compression's)
# ------------------------------------------------------------------------------------------------
class NoneCompressor(Compressor):
    """No compression (the default without bpslaunch --compressor). bfloat16 travels as float32."""
    name = "none"

    def compress(self, tensor):
        if tensor.dtype in _NATIVE:
            return tensor, None
        return tensor.float(), tensor.dtype

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(Compressor):
    """Casts floating-point gradients to float16 for the push_pull and back (as upstream)."""
    name = "fp16"

    def compress(self, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class RegistryCompressor(_c.RegistryCompressor):
    """A compressor of BytePS's C++ registry, chosen by kwargs; tensors travel as float32."""

    def compress(self, tensor):
        if tensor.dtype == torch.float32 or not tensor.dtype.is_floating_point:
            return tensor, None
        return tensor.float(), tensor.dtype

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    def is_floating(self, tensor) -> bool:
        return tensor.dtype.is_floating_point

    def wire_bytes(self, tensor) -> int:
        """Bytes of the tensor as BytePS sees it (the float32 copy)."""
        return tensor.numel() * (4 if tensor.dtype.is_floating_point else tensor.element_size())


class ThcCompressor(_c.ThcMixin, RegistryCompressor):
    """THC: 4-bit (by default) table indices up, integer sums down; see docs/ALGORITHM.md.

    Carries one ThcConfig; `kwargs()` is `config.to_kwargs()`, which the worker declares and the
    server checks on every push.
    """


class LhcCompressor(_c.LhcMixin, RegistryCompressor):
    """LHC: support bitmap and int32 sketch up, their OR and sum down, the exact sum decoded by
    peeling (docs/LHC.md). Carries one LhcConfig, declared as `config.to_kwargs()`."""


class Compression(_c.CompressionBase):
    """Optional gradient compression used by DistributedOptimizer and push_pull: `none` (do not
    compress), `fp16` (cast floating-point gradients to 16 bits), `thc(...)`, BytePS's
    `onebit()`, `topk(k)`, `randomk(k)`, `dithering(k)`, or `from_env()` (what bpslaunch
    --compressor chose)."""

    none = NoneCompressor()
    fp16 = FP16Compressor()
    _registry_class = RegistryCompressor
    _thc_class = ThcCompressor
    _lhc_class = LhcCompressor


# ------------------------------------------------------------------------------------------------
# Declaring tensors with compressor kwargs
# ------------------------------------------------------------------------------------------------
def declare(name: str, kwargs: Optional[Mapping[str, str]] = None) -> None:
    """Declare a BytePS tensor name, with compressor kwargs when given (before its first push)."""
    ops = _ops()
    if not kwargs:
        ops.declare(name)
        return
    try:
        ops.declare(name, **dict(kwargs))
    except TypeError as e:
        raise RuntimeError(
            "this BytePS build cannot declare tensors with compressor kwargs (byteps.torch.ops."
            "declare(name, **kwargs)); rebuild it with `make byteps`") from e


def declare_gradients(by_name: Mapping[str, torch.Tensor], choice: _c.Choice, lr: float = 1.0,
                      extra: Tuple[str, ...] = ()) -> Optional[_c.LearningRateFile]:
    """Declare `Gradient.<name>` of every tensor in `by_name` with the kwargs of the compressor
    in force, then `Parameter.<name>` (broadcasts) and `<prefix><name>` for each prefix in
    `extra`, each group in sorted order (BytePS assigns keys in declare order, so every worker
    must declare alike), and announce the choice (rank 0, once per process).

    Returns the `./lr.s` file that BytePS's vanilla error feedback reads, when a kwargs set asks
    for it (the caller keeps its learning rate current), else None."""
    ops = _ops()
    compression = choice.compressor
    kwargs = {name: compression.kwargs(t) for name, t in by_name.items()}
    lr_file = None
    if any(_c.uses_vanilla_ef(kw) for kw in kwargs.values()):
        lr_file = _c.LearningRateFile(lr)
    for name in sorted(by_name):
        declare("Gradient." + name, kwargs[name])
    for prefix in ("Parameter.",) + tuple(extra):
        for name in sorted(by_name):
            declare(prefix + name)
    _c.announce(choice, _c.tally(compression, by_name.values()), ops.rank())
    return lr_file


def async_refusal(compressor) -> Optional[str]:
    """Why asynchronous training (BYTEPS_ENABLE_ASYNC=1) cannot run with `compressor`, or None.

    In async mode BytePS's server adds each pushed buffer to its store as it arrives, as float
    values, and serves the store: only an uncompressed push is such a buffer."""
    name = getattr(compressor, "name", None)
    if name == "none":
        return None
    flag = f"{env.ENABLE_ASYNC.name}=1"
    if name in ("thc", "lhc"):
        why = (f"{name.upper()}'s server adds integer table values of one round and holds no "
               "weights, so it cannot keep the parameters that asynchronous workers push")
    elif name == "fp16":
        why = "the server would keep the parameters in float16"
    else:
        why = (f"its server adds each push as it arrives without decompressing it ({name} "
               "payloads are not float values)")
    return (f"{flag} (asynchronous training) cannot use {compressor!r}: {why}; train "
            f"asynchronously uncompressed (Compression.none, no bpslaunch --compressor), or "
            f"unset {env.ENABLE_ASYNC.name} to train synchronously with {name}")


# ------------------------------------------------------------------------------------------------
# Cluster failure (csrc/byteps/src/byteps/common/failure.h)
# ------------------------------------------------------------------------------------------------
def _fork_lib() -> ForkLib:
    return ForkLib(_ops()._basics.C_LIB_CTYPES, "torch")


def fail_cluster(why: str) -> None:
    """Fail this worker's cluster: every push_pull in flight and every later one raises
    RuntimeError carrying `why`, and BytePS's shutdown no longer waits for the other nodes.
    The first reason wins."""
    _fork_lib().fail_cluster(why)


def cluster_failure() -> Optional[str]:
    """The reason the cluster failed (fail_cluster, a dead node, a stall), or None."""
    return _fork_lib().cluster_failure()


# ------------------------------------------------------------------------------------------------
# DistributedOptimizer
# ------------------------------------------------------------------------------------------------
class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class: push_pull each gradient as soon as it is ready."""

    _hooks_wanted = True  # CrossBarrier (torch_barrier.py) pushes the gradients itself

    def __init__(self, params, named_parameters, choice, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        ops = _ops()
        compression = choice.compressor
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._enable_async = env.ENABLE_ASYNC.get()
        if self._enable_async:
            refusal = async_refusal(compression)
            if refusal:
                raise ValueError(refusal)

        named = list(named_parameters) if named_parameters is not None else []
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) "
                             "tuples, usually model.named_parameters()")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. "
                             f"Found duplicates: {', '.join(dups)}")
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named:
            by_id = {id(p): n for n, p in named}
            missing = [p for p in all_params if id(p) not in by_id]
            if missing:
                raise ValueError(f"{len(missing)} optimizer parameter(s) are not in "
                                 "named_parameters")
            self._names = {id(p): by_id[id(p)] for p in all_params}
        else:
            self._names = {id(p): f"push_pull.noname.{i}" for i, p in enumerate(all_params)}

        self._handles: Dict[int, Tuple[object, object, torch.nn.Parameter]] = {}
        self._delay = {id(p): backward_passes_per_step for p in all_params}
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._hook_handles = []
        self._should_sync = True
        self._size = ops.size()
        self._origin: Dict[int, torch.Tensor] = {}
        if self._size > 1 and not self._enable_async and self._hooks_wanted:
            self._register_hooks()
        by_name = {self._names[id(p)]: p for p in all_params}
        self._lr_file = declare_gradients(by_name, choice, self.param_groups[0]["lr"],
                                          extra=("AsyncParam.",) if self._enable_async else ())

    @property
    def compressor(self):
        """The compressor in force (the one the in-force line named)."""
        return self._compression

    def gradient_name(self, p) -> str:
        """The name `p`'s gradient is declared and pushed under, after "Gradient."."""
        return self._names[id(p)]

    # -- hooks -----------------------------------------------------------------------------------
    def _register_hooks(self):
        for p in self._requires_update:
            if p.grad is None:
                # every worker must push every gradient, used in this step or not
                p.grad = torch.zeros_like(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _hook(self, p):
        key = id(p)
        if key in self._handles and self._handles[key][0] is not None and self._delay[key] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step "
                                 "times before call to step(). Increase "
                                 "backward_passes_per_step to accumulate gradients locally.")
        self._delay[key] -= 1
        if self._delay[key] == 0:
            handle, ctx = self._push_pull_grad_async(p)
            self._handles[key] = (handle, ctx, p)
        else:
            self._handles[key] = (None, None, p)

    def _push_pull_grad_async(self, p):
        ops = _ops()
        if self._lr_file is not None:
            self._lr_file.set(self.param_groups[0]["lr"])
        name = self._names[id(p)]
        tensor, ctx = self._compression.compress(p.grad)
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        handle = ops.push_pull_async_inplace(tensor, average=True, name="Gradient." + name)
        return handle, (ctx, tensor)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for k in self._delay:
            self._delay[k] = passes

    def synchronize(self):
        """Wait for every gradient's push_pull; each p.grad then holds the averaged gradient
        (asynchronous training: nothing to wait for, step() pushes the parameters)."""
        if self._size <= 1 or self._enable_async:
            return
        ops = _ops()
        for p in self._requires_update:
            key = id(p)
            if key not in self._handles or self._handles[key][0] is None:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                handle, ctx = self._push_pull_grad_async(p)
                self._handles[key] = (handle, ctx, p)
        failed = None
        for key, (handle, (ctx, tensor), p) in list(self._handles.items()):
            self._delay[key] = self.backward_passes_per_step
            try:
                output = ops.synchronize(handle)  # logs a stall (patch 0063, torch_waits)
            except RuntimeError as e:
                # a failed push_pull (failure.h): wait for the others, then raise the first
                failed = failed or e
                continue
            if output is None:
                output = tensor
            result = self._compression.decompress(output, ctx)
            if result is not p.grad:
                p.grad.copy_(result)
        self._handles.clear()
        if failed is not None:
            raise failed

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize(), e.g. to clip the averaged gradients first."""
        if self._enable_async:
            raise AssertionError("skip_synchronize cannot be used in asynchronous training "
                                 f"({env.ENABLE_ASYNC.name}=1): no gradient is averaged")
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._enable_async and self._size > 1:
            return self._async_step(closure)
        if self._should_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)

    def _async_step(self, closure=None):
        """Asynchronous training (BYTEPS_ENABLE_ASYNC=1, upstream's scheme): step locally, push
        each parameter's change as `AsyncParam.<name>`, which the server adds to its store at once
        (no waiting for the other workers), and take the store back.

        The server's store of a key starts at zero (BytePS's first push of a key sends a zeroed
        buffer), so it holds the sum of every worker's changes so far; each parameter is its
        value at the first step (the same on every worker after broadcast_parameters) plus that
        sum."""
        ops = _ops()
        params = [p for p in self._requires_update if p.grad is not None]
        for p in params:
            if id(p) not in self._origin:
                self._origin[id(p)] = p.detach().clone()
        before = [p.detach().clone() for p in params]
        loss = super(self.__class__, self).step(closure)
        pending = []
        with torch.no_grad():
            for p, old in zip(params, before):
                delta = (p.detach() - old).contiguous()
                name = "AsyncParam." + self._names[id(p)]
                pending.append((p, delta, name,
                                ops.push_pull_async_inplace(delta, average=False, name=name)))
            for p, delta, name, handle in pending:
                ops.synchronize(handle)
                p.copy_(self._origin[id(p)] + delta)
        return loss

    def _local_step(self, closure=None):
        """The wrapped optimizer's step without any communication."""
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1):
    """Wrap `optimizer` so that step() applies gradients averaged over all workers.

    Each gradient's push_pull starts as soon as backward() has produced it; step() waits for
    them all. `compression`: `Compression.fp16`, `.thc(...)` (or BytePS's own `.onebit()`,
    `.topk(k)`, `.randomk(k)`, `.dithering(k)`); None or `Compression.none`: what `bpslaunch
    --compressor` chose (`Compression.from_env()`; none without it). Every worker must use the
    same one.
    Call `synchronize()` then use `with optimizer.skip_synchronize(): optimizer.step()` to modify
    the averaged gradients (e.g. clipping) before they are applied.
    """
    return wrap_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                          stacklevel=2)


def choose(compression, stacklevel: int = 2) -> _c.Choice:
    """The compressor in force for a script that passed `compression` (byteps_thc.compression.
    choose), with the warning on rank 0 when it overrides the launcher's (`stacklevel` as
    warnings.warn's, counted from choose's caller)."""
    if isinstance(compression, type) and issubclass(compression, Compressor):
        compression = compression()
    choice = _c.choose(compression, Compression.from_env)
    _c.warn_conflict(choice, _ops().rank(), stacklevel=stacklevel + 1)
    return choice


def wrap_optimizer(optimizer, named_parameters, compression, backward_passes_per_step=1,
                   hooks: bool = True, stacklevel: int = 3):
    """DistributedOptimizer; `hooks=False`: no gradient hooks (the caller pushes gradients)."""
    choice = choose(compression, stacklevel + 1)
    attrs = dict(_DistributedOptimizer.__dict__, _hooks_wanted=hooks)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), attrs)
    opt = cls(optimizer.param_groups, named_parameters, choice, backward_passes_per_step)
    if optimizer.state:  # keep any state the wrapped optimizer already has
        opt.load_state_dict(optimizer.state_dict())
    return opt


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "RegistryCompressor",
           "ThcCompressor", "LhcCompressor", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_optimizer_state", "declare"]
