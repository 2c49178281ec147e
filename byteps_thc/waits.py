"""What a worker is waiting for: a push_pull that has not finished after BYTEPS_THC_STALL_WARN
seconds is logged (once per wait) by a daemon thread, naming the tensor and this worker's rank.

The server logs the other half (which workers have not pushed; thc_stall.h). The adapters wrap
each blocking wait in `waiting(...)`; a wait costs a dictionary entry, the thread wakes once a
second and only while some wait is open.
"""
from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from typing import Dict, Iterator, Optional, TextIO, Tuple

from . import env


class WaitLog:
    def __init__(self, warn_s: Optional[float] = None, out: Optional[TextIO] = None,
                 clock=time.monotonic):
        self.warn_s = env.STALL_WARN.get() if warn_s is None else warn_s
        self.out = out
        self.clock = clock
        self._open: Dict[int, Tuple[str, int, float]] = {}   # id -> (what, rank, since)
        self._logged = set()
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    @contextlib.contextmanager
    def waiting(self, what: str, rank: int) -> Iterator[None]:
        if not self.warn_s:
            yield
            return
        wid = next(self._ids)
        with self._cv:
            self._open[wid] = (what, rank, self.clock())
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="byteps-thc-waits",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        try:
            yield
        finally:
            with self._cv:
                self._open.pop(wid, None)
                self._logged.discard(wid)

    def check(self) -> int:
        """Log every open wait older than warn_s not yet logged; how many were logged."""
        now = self.clock()
        with self._cv:
            due = [(wid, w) for wid, w in self._open.items()
                   if wid not in self._logged and now - w[2] >= self.warn_s]
            self._logged.update(wid for wid, _ in due)
        out = self.out if self.out is not None else sys.stderr
        for _, (what, rank, since) in due:
            out.write(f"byteps-thc: worker {rank} has waited {now - since:.0f} s for the "
                      f"push_pull of {what!r} ({env.STALL_WARN.name}={self.warn_s:g}); the "
                      "server's log names the workers it still waits for\n")
            out.flush()
        return len(due)

    def _watch(self) -> None:
        while True:
            with self._cv:
                while not self._open:
                    self._cv.wait()
            time.sleep(1.0)
            self.check()


_LOG: Optional[WaitLog] = None


def waiting(what: str, rank: int):
    """The process's WaitLog (made on first use, from the environment) around one wait."""
    global _LOG
    if _LOG is None:
        _LOG = WaitLog()
    return _LOG.waiting(what, rank)
