"""`byteps.torch.parallel.DistributedDataParallel` of the fork: upstream's module wrapper, with
the compressor chosen as DistributedOptimizer chooses it.

The patched `byteps.torch.parallel` takes `DistributedDataParallel` from here (patch 0060), so
upstream's scripts keep their code:

    model = bps.parallel.DistributedDataParallel(model, device_ids=[0])   # or none on a CPU
    opt = torch.optim.SGD(model.parameters(), lr=0.01)                   # a plain optimizer
    loss_fn(model(x), y).backward()                                       # averaged in .grad
    opt.step()

The compressor is the one `byteps_thc.compression.choose` picks (the script's `compression=`
when it names one other than `Compression.none`, else `bpslaunch --compressor`'s), announced
with the one in-force line on rank 0; THC, LHC and BytePS's own compressors are declared with
their kwargs on every gradient of at least BYTEPS_MIN_COMPRESS_BYTES, fp16 casts.

As upstream: gradients travel as `Gradient.<parameter name>`, the module's state is broadcast
from rank 0 at construction and its buffers before every forward (`broadcast_buffers`), and
`backward()` returns with every gradient averaged. Each parameter's push_pull starts once its
gradient is accumulated; the end of the backward pass pushes the parameters the pass did not
reach (with their current gradient, zero unless accumulated) and waits for all of them, so a
model with unused branches needs no explicit `synchronize()`. `no_sync()` accumulates locally.
Asynchronous training (BYTEPS_ENABLE_ASYNC) needs DistributedOptimizer: this wrapper averages
gradients, and the asynchronous server would add them into its store as if they were weights.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import torch

from . import env
from . import torch as _bt
from .torch_broadcast import broadcast_parameters


def _ops():
    from byteps.torch import ops  # deferred: byteps.torch imports byteps_thc.torch
    return ops


class DistributedDataParallel(torch.nn.Module):
    """Average the gradients of `module` over all BytePS workers during backward().

    `device_ids`: at most one device (the one the module lives on); None on a CPU worker.
    `broadcast_buffers`: broadcast the module's buffers from rank 0 before every forward.
    `compression`: as DistributedOptimizer's (None or `Compression.none`: bpslaunch's choice).
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, broadcast_buffers: bool = True,
                 compression=None):
        super().__init__()
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError(f"DistributedDataParallel takes one device per process, got "
                             f"device_ids={list(device_ids)}; start one worker per device")
        if env.ENABLE_ASYNC.get():
            raise ValueError(
                f"{env.ENABLE_ASYNC.name}=1 (asynchronous training) needs "
                "byteps.torch.DistributedOptimizer, which pushes parameter changes; "
                "DistributedDataParallel averages gradients, and the asynchronous server would "
                f"add them into its store as if they were parameters. Unset "
                f"{env.ENABLE_ASYNC.name} or wrap the optimizer instead")
        self.device_ids = list(device_ids) if device_ids is not None else None
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.require_forward_param_sync = broadcast_buffers
        ops = _ops()
        self.choice = _bt.choose(compression)  # the compressor in force, and who chose it
        self._compression = self.choice.compressor
        named = list(module.named_parameters())
        self._params: List[Tuple[str, torch.nn.Parameter]] = named
        self._names = {id(p): n for n, p in named}
        self._handles: Dict[int, Tuple[object, object, torch.Tensor]] = {}
        self._require_backward_grad_sync = True
        self._end_queued = False
        self._hook_handles = []
        self._size = ops.size()
        self._rank = ops.rank()
        by_name = {n: p for n, p in named}
        self._lr_file = _bt.declare_gradients(by_name, self.choice)
        if self._size > 1:
            for _, p in named:
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))
        if module.state_dict():
            broadcast_parameters(module.state_dict(), root_rank=0)

    # -- what upstream's wrapper offers ----------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block averages them."""
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        if self.require_forward_param_sync and self.broadcast_buffers and self._size > 1:
            buffers = list(self.module.named_buffers())
            if buffers:
                broadcast_parameters(buffers, root_rank=0)
        return self.module(*inputs, **kwargs)

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate BytePS's vanilla error feedback (`--compressor-ef vanilla`) scales
        its kept error by (`./lr.s`); without a call it is 1.0. Nothing else reads it."""
        if self._lr_file is not None:
            self._lr_file.set(lr)

    # -- the gradients' push_pulls ---------------------------------------------------------------
    def _hook(self, p: torch.nn.Parameter) -> None:
        if not self._require_backward_grad_sync:
            return
        if not self._end_queued:
            # runs once the whole backward pass is done, in the thread that ran it
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._end_queued = True
        if id(p) in self._handles:
            raise RuntimeError(f"the gradient of {self._names[id(p)]!r} was produced twice in one "
                               "backward pass; DistributedDataParallel pushes each once")
        self._handles[id(p)] = self._push_pull(p)

    def _push_pull(self, p: torch.nn.Parameter):
        tensor, ctx = self._compression.compress(p.grad)
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        handle = _ops().push_pull_async_inplace(tensor, average=True,
                                                name="Gradient." + self._names[id(p)])
        return handle, ctx, tensor

    def _end_of_backward(self) -> None:
        self._end_queued = False
        self.synchronize()

    def synchronize(self) -> None:
        """Push the gradients this backward pass has not reached, then wait for every push_pull;
        each `p.grad` then holds the average over the workers. backward() calls it at its end;
        a push_pull that failed raises here (RuntimeError) once all of them have finished."""
        if self._size <= 1:
            return
        ops = _ops()
        for name, p in self._params:
            if p.requires_grad and id(p) not in self._handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._handles[id(p)] = self._push_pull(p)
        failed: Optional[BaseException] = None
        by_id = {id(p): p for _, p in self._params}
        for key, (handle, ctx, tensor) in list(self._handles.items()):
            try:
                output = ops.synchronize(handle)  # logs a stall (patch 0063, torch_waits)
            except RuntimeError as e:
                failed = failed or e
                continue
            result = self._compression.decompress(tensor if output is None else output, ctx)
            p = by_id[key]
            if result is not p.grad:
                p.grad.copy_(result)
        self._handles.clear()
        if failed is not None:
            raise failed


__all__ = ["DistributedDataParallel"]
