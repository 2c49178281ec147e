"""What a worker is waiting for: a push_pull that has not finished after BYTEPS_THC_STALL_WARN
seconds is logged (once per wait) by a daemon thread, naming the tensor and this worker's rank.

The server logs the other half (which workers have not pushed; thc_stall.h). The adapters wrap
each blocking wait in `waiting(...)`; a wait costs a dictionary entry, the thread wakes once a
second and only while some wait is open.

TensorFlow waits inside its own executor (eager ops and tf.function alike), where no Python code
of ours runs; there the fork's op keeps the open waits itself (csrc/byteps/src/byteps/common/
thc_waits.h) and `OpenWaitsLog` polls them (`ForkLib.open_waits`) once a second, logging each
one older than BYTEPS_THC_STALL_WARN once, in the same words.
"""
from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, TextIO, Tuple

from . import env


def _report(out: TextIO, rank: int, waited: float, what: str, warn_s: float) -> None:
    out.write(f"byteps-thc: worker {rank} has waited {waited:.0f} s for the push_pull of "
              f"{what!r} ({env.STALL_WARN.name}={warn_s:g}); the server's log names the workers "
              "it still waits for\n")
    out.flush()


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
            _report(out, rank, now - since, what, self.warn_s)
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


class OpenWaitsLog:
    """Logs the waits that `list_waits()` returns ([(id, seconds waited, tensor name)], as
    ForkLib.open_waits) once each, when one has waited warn_s; `start()` polls once a second.
    `rank()` names this worker; it is read only when a wait is logged (after BytePS's init, where
    a polling thread started on import can read it)."""

    def __init__(self, list_waits: Callable[[], List[Tuple[int, float, str]]],
                 rank: Callable[[], int], warn_s: Optional[float] = None,
                 out: Optional[TextIO] = None):
        self.list_waits = list_waits
        self.rank = rank
        self.warn_s = env.STALL_WARN.get() if warn_s is None else warn_s
        self.out = out
        self._logged: set = set()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> int:
        """Log every listed wait older than warn_s not yet logged; how many were logged."""
        if not self.warn_s:
            return 0
        waits = self.list_waits()
        open_ids = {wid for wid, _, _ in waits}
        self._logged &= open_ids  # closed waits are forgotten (ids are never reused)
        out = self.out if self.out is not None else sys.stderr
        n = 0
        for wid, waited, what in waits:
            if wid not in self._logged and waited >= self.warn_s:
                self._logged.add(wid)
                _report(out, self.rank(), waited, what, self.warn_s)
                n += 1
        return n

    def start(self) -> "OpenWaitsLog":
        """Poll in a daemon thread (once; nothing when warn_s is 0)."""
        if self.warn_s and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="byteps-thc-open-waits",
                                            daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            self.check()


_WATCHED: Dict[str, OpenWaitsLog] = {}  # plugin -> its poller
_WATCHED_LOCK = threading.Lock()


def watch_fork_waits(lib, rank: Callable[[], int]) -> Optional[OpenWaitsLog]:
    """Poll the open waits of a plugin's op (`lib`: a byteps_thc.forklib.ForkLib), once per
    plugin and process; None where the build keeps no such list."""
    with _WATCHED_LOCK:
        if lib.plugin not in _WATCHED and lib.open_waits() is not None:
            _WATCHED[lib.plugin] = OpenWaitsLog(lib.open_waits, rank).start()
        return _WATCHED.get(lib.plugin)

