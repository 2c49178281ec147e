"""`byteps.torch.cross_barrier.CrossBarrier` of the fork: each parameter is updated as soon as
its own gradient has been averaged, and the next forward pass waits only for the parameters it
is about to use (the barrier crossing of ByteScheduler, https://dl.acm.org/citation.cfm?id=3359642).

The patched `byteps.torch.cross_barrier` takes `CrossBarrier` from here (patch 0060), so
upstream's scripts keep their code:

    opt = bps.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.01),
                           named_parameters=model.named_parameters(), num_steps=steps)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

How it runs:
- the wrapped optimizer is a DistributedOptimizer without its gradient hooks: it chooses and
  announces the compressor (`byteps_thc.compression.choose`) and declares every gradient with
  its kwargs, so THC, LHC, fp16 and BytePS's own compressors apply as they do there;
- a gradient's push_pull starts once backward() has accumulated it (every
  `backward_passes_per_step` passes) and takes the parameter's lock; `step()` pushes the
  parameters the pass did not reach and returns without waiting;
- one thread waits for the push_pulls in the order they started, writes each averaged gradient
  to `p.grad`, updates that parameter alone with the wrapped optimizer's own `step()` (on a
  parameter group holding only `p`, with the optimizer's state and hyper-parameters), zeroes the
  gradient and releases the lock. Every worker thus applies the same update to the same bits, in
  whatever order its push_pulls finish; any optimizer whose update of a parameter depends on
  that parameter alone works (LBFGS does not);
- before a module's forward, a pre-hook waits for the locks of the module's own parameters;
- the `num_steps`-th step(), or `synchronize()`, waits until every update is applied; a failed
  push_pull raises there (or at the next step()) as RuntimeError. Each wait longer than
  BYTEPS_THC_STALL_WARN is logged, naming the tensor (byteps_thc.waits).
`zero_grad()` does nothing while training on several workers: the updates zero each gradient.
"""
from __future__ import annotations

import queue
import threading
from typing import Dict, List, Optional

import torch

from . import env
from . import torch as _bt
from . import waits as _waits


def _ops():
    from byteps.torch import ops  # deferred: byteps.torch imports byteps_thc.torch
    return ops


class _CrossBarrier(torch.optim.Optimizer):
    """An Optimizer (LR schedulers accept it) whose state and parameter groups are the wrapped
    DistributedOptimizer's; Optimizer.__init__ is not run, everything is forwarded."""

    def __init__(self, model: torch.nn.Module, opt, num_steps: int):
        if isinstance(opt, torch.optim.LBFGS):
            raise ValueError("CrossBarrier updates one parameter at a time; torch.optim.LBFGS "
                             "needs all of them at once (use DistributedOptimizer)")
        ops = _ops()
        self._model = model
        self._opt = opt
        self._final_step = num_steps
        self._steps = 0
        self._size = ops.size()
        self._rank = ops.rank()
        self._params: List[torch.nn.Parameter] = [
            p for group in opt.param_groups for p in group["params"] if p.requires_grad]
        self._group_of: Dict[int, dict] = {
            id(p): group for group in opt.param_groups for p in group["params"]}
        self._locks = {id(p): threading.Lock() for p in self._params}
        self._passes = opt.backward_passes_per_step
        self._delay = {id(p): self._passes for p in self._params}
        self._started: set = set()
        self._failed: Optional[BaseException] = None
        self._queue: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        if self._size > 1:
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.register_post_accumulate_grad_hook(self._hook)
            for mod in model.modules():
                if any(True for _ in mod.parameters(recurse=False)):
                    mod.register_forward_pre_hook(self._before_forward)
            self._thread = threading.Thread(target=self._updates, name="byteps-cross-barrier",
                                            daemon=True)
            self._thread.start()

    def __getattr__(self, item):
        # param_groups, state, defaults, _local_step, hooks, ...: the optimizer's
        if item == "_opt":
            raise AttributeError(item)
        return getattr(self._opt, item)

    def state_dict(self):
        return self._opt.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self._opt.load_state_dict(state_dict)

    def add_param_group(self, param_group) -> None:
        raise ValueError("CrossBarrier cannot take parameter groups after it is built: its hooks "
                         "and locks cover the parameters it was given")

    # -- backward: start each gradient's push_pull -----------------------------------------------
    def _hook(self, p: torch.nn.Parameter) -> None:
        key = id(p)
        self._delay[key] -= 1
        if self._delay[key] == 0:
            self._start(p)

    def _start(self, p: torch.nn.Parameter) -> None:
        key = id(p)
        self._delay[key] = self._passes
        self._started.add(key)
        self._locks[key].acquire()  # released once p is updated
        try:
            compression = self._opt.compressor
            tensor, ctx = compression.compress(p.grad)
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            name = "Gradient." + self._opt.gradient_name(p)
            handle = _ops().push_pull_async_inplace(tensor, average=True, name=name)
        except BaseException:
            self._locks[key].release()
            raise
        self._queue.put((p, name, handle, ctx, tensor))

    # -- the update thread -----------------------------------------------------------------------
    def _updates(self) -> None:
        ops = _ops()
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            p, name, handle, ctx, tensor = item
            try:
                output = ops.synchronize(handle)  # logs a stall (patch 0063, torch_waits)
                result = self._opt.compressor.decompress(
                    tensor if output is None else output, ctx)
                if result is not p.grad:
                    p.grad.copy_(result)
                self._update(p)
                p.grad.zero_()
            except BaseException as e:  # raised in the training thread at step()/synchronize()
                self._failed = self._failed or e
            finally:
                self._locks[id(p)].release()
                self._queue.task_done()

    def _update(self, p: torch.nn.Parameter) -> None:
        """The wrapped optimizer's step on `p` alone: a shallow view of the optimizer whose only
        parameter group is p's group (its current hyper-parameters) restricted to p; the state
        dictionary is the optimizer's own."""
        view = object.__new__(type(self._opt))
        view.__dict__.update(self._opt.__dict__)
        view.param_groups = [dict(self._group_of[id(p)], params=[p])]
        view._local_step()

    # -- forward: wait for the parameters about to be used ---------------------------------------
    def _before_forward(self, module, inputs) -> None:
        for p in module.parameters(recurse=False):
            lock = self._locks.get(id(p))
            if lock is not None:
                with _waits.waiting("the update of Gradient." + self._opt.gradient_name(p),
                                    self._rank):
                    lock.acquire()
                lock.release()

    # -- the optimizer's interface ---------------------------------------------------------------
    def step(self, closure=None):
        if self._size <= 1:
            return self._opt._local_step(closure)
        loss = closure() if closure is not None else None
        for p in self._params:
            if id(p) not in self._started:
                self._start(p)  # not reached by this pass: its current (accumulated) gradient
        self._started.clear()
        self._steps += 1
        if self._steps == self._final_step:
            self.synchronize()
            self._stop()
        self._raise_failure()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._size <= 1:
            self._opt.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Wait until every started push_pull's update has been applied."""
        if self._thread is not None:
            self._queue.join()
        self._raise_failure()

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _raise_failure(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed


def CrossBarrier(model, optimizer, named_parameters=None, compression=None,
                 backward_passes_per_step=1, num_steps=10**6):
    """Wrap `optimizer` so that each parameter is updated as soon as its averaged gradient
    arrives and the next forward pass waits only for the parameters it uses. `compression` as
    DistributedOptimizer's; `num_steps`: the step() after which every update is waited for."""
    if env.ENABLE_ASYNC.get():
        raise ValueError(f"{env.ENABLE_ASYNC.name}=1 (asynchronous training) needs "
                         "byteps.torch.DistributedOptimizer, which pushes parameter changes; "
                         "CrossBarrier averages gradients")
    opt = _bt.wrap_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                             hooks=False, stacklevel=2)
    return _CrossBarrier(model, opt, num_steps)


__all__ = ["CrossBarrier"]
