"""`./lr.s`, the learning rate that BytePS's vanilla error feedback reads (every framework)."""
from __future__ import annotations

import os
import struct
from typing import Mapping, Optional


class LearningRateFile:
    """`./lr.s`, the learning rate BytePS's vanilla error feedback (ef_type=vanilla) reads.

    Its C++ opens `lr.s` in the process's working directory when the compressor is created and
    mmaps the 8-byte native double; every compression step rescales the kept error by
    previous_lr / current_lr. Upstream only its MXNet trainer writes the file; without it a torch
    worker aborted ("open lr.s failed"). `set(lr)` writes it when the value changes (a cheap
    comparison otherwise), so a learning-rate schedule reaches the error feedback; a zero or
    non-finite rate keeps the last positive one (1.0 before any). The file stays
    after the run: workers sharing a directory share it, and one that leaves must not take it
    from the others (they all write the same schedule).
    """

    PATH = "lr.s"

    def __init__(self, lr: float):
        self._pack = struct.Struct("d").pack
        self._f = open(self.PATH, "r+b" if os.path.exists(self.PATH) else "w+b")
        self._lr = None
        self.set(lr)

    def set(self, lr: float) -> None:
        lr = float(lr)
        if lr == self._lr:
            return
        if not (lr > 0 and lr < float("inf")):
            # a zero learning rate (warm-up from 0, a frozen replay) would make the ratio
            # previous_lr / current_lr infinite: keep the last positive rate (1.0 before any),
            # so the kept error is carried over unscaled while the rate is zero
            if self._lr is not None:
                return
            lr = 1.0
        self._f.seek(0)
        self._f.write(self._pack(lr))
        self._f.flush()
        self._lr = lr


def uses_vanilla_ef(kwargs: Optional[Mapping[str, str]]) -> bool:
    return bool(kwargs) and kwargs.get("ef_type") == "vanilla"
