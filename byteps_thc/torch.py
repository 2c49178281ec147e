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

import collections.abc
import contextlib
from typing import Dict, Mapping, Optional, Tuple

import torch

from . import compression as _c
from . import env
from . import waits as _waits
from .compression import Compressor
from .forklib import ForkLib
from .lhc import LhcConfig  # noqa: F401 - part of this module's namespace
from .thc import ThcConfig  # noqa: F401 - part of this module's namespace

# dtypes BytePS's torch plugin pushes as they are; others (bfloat16) travel as float32.
_NATIVE = (torch.float32, torch.float64, torch.float16, torch.uint8, torch.int32, torch.int64)


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


# ------------------------------------------------------------------------------------------------
# Cluster failure (csrc/byteps/src/byteps/common/thc_failure.h)
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

    def __init__(self, params, named_parameters, choice, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        ops = _ops()
        compression = choice.compressor
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._enable_async = env.ENABLE_ASYNC.get()
        if self._enable_async:
            raise ValueError(f"{env.ENABLE_ASYNC.name} is not supported by byteps-thc's "
                             "DistributedOptimizer")

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
        if self._size > 1:
            self._register_hooks()
        # Declare every name in the same order on every worker (BytePS assigns keys in order):
        # gradients with their compressor kwargs first, then the parameters for broadcasts.
        by_name = {self._names[id(p)]: p for p in all_params}
        kwargs = {name: compression.kwargs(by_name[name]) for name in by_name}
        # BytePS's vanilla error feedback reads the learning rate from ./lr.s (kept current here)
        self._lr_file = None
        if any(_c.uses_vanilla_ef(kw) for kw in kwargs.values()):
            self._lr_file = _c.LearningRateFile(self.param_groups[0]["lr"])
        for name in sorted(by_name):
            declare("Gradient." + name, kwargs[name])
        for name in sorted(by_name):
            declare("Parameter." + name)
        _c.announce(choice, _c.tally(compression, by_name.values()), ops.rank())

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
        """Wait for every gradient's push_pull; each p.grad then holds the averaged gradient."""
        if self._size <= 1:
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
                with _waits.waiting("Gradient." + self._names[key], ops.rank()):
                    output = ops.synchronize(handle)
            except RuntimeError as e:
                # a failed push_pull (thc_failure.h): wait for the others, then raise the first
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
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._should_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)

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
    if isinstance(compression, type) and issubclass(compression, Compressor):
        compression = compression()
    choice = _c.choose(compression, Compression.from_env)
    _c.warn_conflict(choice, _ops().rank())
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    opt = cls(optimizer.param_groups, named_parameters, choice, backward_passes_per_step)
    if optimizer.state:  # keep any state the wrapped optimizer already has
        opt.load_state_dict(optimizer.state_dict())
    return opt


# ------------------------------------------------------------------------------------------------
# Broadcasts
# ------------------------------------------------------------------------------------------------
def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter."):
    """Make every worker's tensors equal to `root_rank`'s (model.state_dict() or
    named_parameters()). Implemented as push_pull of the sum with zeros on the other ranks;
    always uncompressed; bfloat16 and other dtypes travel as float64/float32 exactly."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, (list, tuple)) or isinstance(params, collections.abc.Iterator):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    ops = _ops()
    if ops.size() <= 1:
        return
    me = ops.rank()
    with torch.no_grad():
        for name, p in params:
            if not torch.is_tensor(p):
                raise ValueError(f"cannot broadcast {name!r}: {type(p).__name__} is not a tensor")
            wire = _exact_wire(p)
            if me != root_rank:
                wire.zero_()
            handle = ops.push_pull_async_inplace(
                wire, average=False, name=(prefix + name) if name else None)
            ops.synchronize(handle)
            if wire is not p:
                p.copy_(wire.reshape(p.shape).to(p.dtype))


def _exact_wire(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when BytePS can push it in place, else a copy in a dtype that holds it exactly."""
    if t.dtype in _NATIVE and t.is_contiguous() and t.dim() > 0:
        return t.data if isinstance(t, torch.nn.Parameter) else t
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        return t.detach().reshape(-1).to(torch.float64).clone()
    return t.detach().reshape(-1).to(torch.int64).clone()


def broadcast_optimizer_state(optimizer, root_rank: int, prefix: str = "Parameter."):
    """Make every worker's optimizer state (tensors and numeric hyper-parameters such as lr,
    momentum or betas) equal to `root_rank`'s. Works for plain and Distributed optimizers."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    ops = _ops()
    if ops.size() <= 1:
        return
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        # create the state with a zero-gradient step (no communication: every rank may differ)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        if hasattr(optimizer, "_local_step"):
            optimizer._local_step()
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        return  # a stateless optimizer (plain SGD): only the hyper-parameters below

    tensors = []          # (key, tensor) to broadcast, in the same order on every rank
    setters = []          # after the broadcast: write the values back
    for index, group in enumerate(optimizer.param_groups):
        for option, value in sorted(group.items()):
            if option == "params":
                continue
            flat = _numbers(value)
            if flat is None:
                continue  # None, strings, ...: not broadcast
            t = torch.tensor(flat, dtype=torch.float64)
            tensors.append((f"{option}.{index}", t))
            setters.append((lambda g=group, o=option, v=value, t=t:
                            g.__setitem__(o, _rebuild(v, t.tolist()))))
    occurrences = collections.Counter()
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for name in sorted(state):
                value = state[name]
                occurrences[name] += 1
                key = f"{name}.{occurrences[name]}"
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    flat = _numbers(value)
                    if flat is None:
                        continue
                    t = torch.tensor(flat, dtype=torch.float64)
                    tensors.append((key, t))
                    setters.append((lambda s=state, n=name, v=value, t=t:
                                    s.__setitem__(n, _rebuild(v, t.tolist()))))
    broadcast_parameters(tensors, root_rank, prefix)
    for set_back in setters:
        set_back()


def _numbers(value):
    """A flat list of the numbers in value (a number or nested tuples/lists), else None."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (tuple, list)) and value:
        out = []
        for v in value:
            sub = _numbers(v)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _rebuild(like, flat: list):
    """Inverse of _numbers: values from `flat` in the structure and types of `like`."""
    it = iter(flat)

    def build(x):
        if isinstance(x, (tuple, list)):
            return type(x)(build(v) for v in x)
        v = next(it)
        if isinstance(x, bool):
            return bool(v)
        if isinstance(x, int):
            return int(round(v))
        return float(v)
    return build(like)


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "RegistryCompressor",
           "ThcCompressor", "LhcCompressor", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_optimizer_state", "declare"]
