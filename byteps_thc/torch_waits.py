"""Every wait of `byteps.torch.synchronize` is logged once it has taken longer than
BYTEPS_THC_STALL_WARN, naming the tensor (byteps_thc.waits).

Patch 0063 ends upstream's `byteps/torch/ops.py` with

    _do_push_pull_async, synchronize = logged_waits(_do_push_pull_async, synchronize, rank)

so that every push_pull that module starts (`push_pull`, `push_pull_async`,
`push_pull_async_inplace`, `push_pull_inplace`, and byteps_thc's optimizer, DDP wrapper,
CrossBarrier and broadcasts, which all call those) records its name with its handle, and every
`synchronize(handle)` waits inside `byteps_thc.waits.waiting(name, rank)`. This module imports
nothing of BytePS: ops.py hands it its functions.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

from . import waits as _waits


def logged_waits(do_push_pull: Callable, synchronize: Callable,
                 rank: Callable[[], int]) -> Tuple[Callable, Callable]:
    """`do_push_pull` that remembers each handle's tensor name, and `synchronize` that logs a
    wait past BYTEPS_THC_STALL_WARN with that name and `rank()`."""
    names: Dict[object, Optional[str]] = {}
    lock = threading.Lock()

    def push_pull(tensor, output, average, name, *args, **kwargs):
        handle = do_push_pull(tensor, output, average, name, *args, **kwargs)
        with lock:
            names[handle] = name
        return handle

    def wait(handle):
        with lock:
            name = names.get(handle)
        interrupted = False
        try:
            with _waits.waiting(name or f"an unnamed tensor (handle {handle})", rank()):
                return synchronize(handle)
        except KeyboardInterrupt:  # the push_pull goes on: its handle can be waited for again
            interrupted = True
            raise
        finally:
            if not interrupted:
                with lock:
                    names.pop(handle, None)

    push_pull.__doc__ = do_push_pull.__doc__
    wait.__doc__ = synchronize.__doc__
    return push_pull, wait
