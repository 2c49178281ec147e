"""Broadcasts of the PyTorch adapter: parameters and optimizer state from one rank to all.

`byteps_thc.torch` re-exports `broadcast_parameters` and `broadcast_optimizer_state` (and the
patched `byteps.torch` takes them from there). A broadcast is a push_pull of the sum with zeros on
every rank but the root, always uncompressed; each wait is logged once it has taken longer than
BYTEPS_THC_STALL_WARN (byteps_thc.waits), naming the tensor. Under asynchronous training
(BYTEPS_ENABLE_ASYNC=1) the server answers a push with its store at once, so a broadcast then
meets the other workers at a barrier and reads the store with a second push of zeros.
"""
from __future__ import annotations

import collections
import collections.abc
import itertools
import time

import torch

from . import env
from . import waits as _waits

# dtypes BytePS's torch plugin pushes as they are; others (bfloat16) travel as float32.
NATIVE = (torch.float32, torch.float64, torch.float16, torch.uint8, torch.int32, torch.int64)


def _ops():
    from byteps.torch import ops  # deferred: byteps.torch imports this module
    return ops


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
    asynchronous = env.ENABLE_ASYNC.get()
    pending = []
    with torch.no_grad():
        for name, p in params:
            if not torch.is_tensor(p):
                raise ValueError(f"cannot broadcast {name!r}: {type(p).__name__} is not a tensor")
            full = (prefix + name) if name else None
            if asynchronous and full is None:
                raise ValueError(f"{env.ENABLE_ASYNC.name}=1: a broadcast needs named tensors "
                                 "(a dict, or (name, tensor) pairs such as "
                                 "model.named_parameters())")
            wire = _exact_wire(p)
            if me != root_rank:
                wire.zero_()
            _push_pull(ops, wire, full, me)
            pending.append((full, wire, p))
        if asynchronous:
            # An asynchronous server adds each push into its store as it arrives and answers
            # with the store, so a worker's answer holds the root's tensor only if the root
            # pushed first. Once every worker has passed the barrier every push is in, and a push
            # of zeros answers with the root's tensor.
            _async_barrier(ops, me)
            for full, wire, _ in pending:
                wire.zero_()
                _push_pull(ops, wire, full, me)
        for _, wire, p in pending:
            if wire is not p:
                p.copy_(wire.reshape(p.shape).to(p.dtype))


def _push_pull(ops, wire: torch.Tensor, name, rank: int) -> None:
    handle = ops.push_pull_async_inplace(wire, average=False, name=name)
    ops.synchronize(handle)  # logs a stall (patch 0063, torch_waits)


_BARRIERS = itertools.count()


def _async_barrier(ops, rank: int) -> None:
    """Return once every worker has called it (the n-th call of each worker meets the n-th of
    the others): each adds 1 to a fresh counter key, then adds 0 until the counter, the
    server's answer, reaches the number of workers. float64 counts exactly."""
    name = f"AsyncBarrier.{next(_BARRIERS)}"
    count = torch.ones(1, dtype=torch.float64)
    with _waits.waiting(name, rank):
        while True:
            handle = ops.push_pull_async_inplace(count, average=False, name=name)
            ops.synchronize(handle)
            if count.item() >= ops.size():
                return
            time.sleep(0.01)
            count.zero_()


def _exact_wire(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when BytePS can push it in place, else a copy in a dtype that holds it exactly."""
    if t.dtype in NATIVE and t.is_contiguous() and t.dim() > 0:
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
