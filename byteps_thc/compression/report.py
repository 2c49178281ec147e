"""Which compressor is in force, and saying so once, on rank 0: the script's explicit choice,
else the launcher's (`choose`; `Compression.none` counts as no choice), the warning when the
script overrides the launcher, the in-force line at the first declare (the choice, its settings,
where it came from, how many tensors stay under the size threshold), and at exit, a THC choice
under which nothing was compressed (`RunReport`, the process's `REPORT`).
"""
from __future__ import annotations

import atexit
import dataclasses
import sys
import threading
import warnings
from typing import Callable, Mapping, Optional

from .. import codecs, env
from ..thc import ThcConfig
from .compressors import RegistryCompressor

SCRIPT = "script"
DEFAULT = "default (neither the script nor bpslaunch --compressor / BYTEPS_COMPRESSOR chose one)"


def is_no_choice(compression) -> bool:
    """`compression=None` or `Compression.none`: upstream's scripts pass the latter as boilerplate
    (it is upstream's default), so it cannot mean "refuse the launcher's compressor"."""
    return compression is None or getattr(compression, "name", None) == "none"


def launcher_source(environ: Optional[Mapping[str, str]] = None) -> str:
    """Where BYTEPS_COMPRESSOR's value came from, in words."""
    value = env.COMPRESSOR.get(environ)
    if env.COMPRESSOR_SET_BY.get(environ) == "bpslaunch":
        return f"bpslaunch --compressor {value}"
    return f"the environment ({env.COMPRESSOR.name}={value})"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The compressor in force, where it came from (SCRIPT, DEFAULT or launcher_source()), and
    the launcher's compressor when the script's explicit choice overrides a different one."""
    compressor: object
    source: str
    overridden: object = None


def choose(script, from_env: Callable[[], object],
           environ: Optional[Mapping[str, str]] = None) -> Choice:
    """The compressor in force for a script that passed `script` (None, Compression.none, or
    anything else); `from_env()` builds the adapter's compressor from BYTEPS_COMPRESSOR and co.

    No choice (is_no_choice): the launcher's compressor when one is set, else `script` itself
    (none). An explicit other choice stays in force; `overridden` is the launcher's compressor
    when that differs (the same settings, repr equal, are no conflict)."""
    launched = env.COMPRESSOR.get(environ) != "none"
    if is_no_choice(script):
        if launched:
            return Choice(from_env(), launcher_source(environ))
        return Choice(from_env() if script is None else script, DEFAULT)
    other = from_env() if launched else None
    if other is not None and repr(other) == repr(script):
        other = None
    return Choice(script, SCRIPT, other)


def conflict_message(choice: Choice, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    if choice.overridden is None:
        return None
    return (f"byteps-thc: the script chose {choice.compressor!r}, {launcher_source(environ)} chose "
            f"{choice.overridden!r}; the script's {choice.compressor!r} is in force (pass "
            "compression=Compression.none, or nothing, to use the launcher's)")


def describe(compressor) -> str:
    """The compressor and its settings (a codec's: its configuration's describe())."""
    config = getattr(compressor, "config", None)
    if codecs.of_config(config) is not None:
        return config.describe()
    return repr(compressor)


def is_thc(compressor) -> bool:
    return isinstance(getattr(compressor, "config", None), ThcConfig)


@dataclasses.dataclass
class Tally:
    """Gradient tensors of one declare: how many, how many compressed, how many under
    BYTEPS_MIN_COMPRESS_BYTES (floating, known size, too small) and so uncompressed."""
    tensors: int = 0
    compressed: int = 0
    small: int = 0


def tally(compressor, tensors, environ: Optional[Mapping[str, str]] = None) -> Tally:
    """Count `tensors` as the adapter's `compressor` declares them (RegistryCompressor.kwargs)."""
    out = Tally()
    threshold = env.MIN_COMPRESS_BYTES.get(environ)
    registry = isinstance(compressor, RegistryCompressor)
    for t in tensors:
        out.tensors += 1
        if not registry:
            continue
        if compressor.kwargs(t, environ) is not None:
            out.compressed += 1
        elif compressor.is_floating(t):
            nbytes = compressor.wire_bytes(t)
            if nbytes is not None and nbytes < threshold:
                out.small += 1
    return out


def _say(text: str, stream=None) -> None:
    stream = sys.stderr if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


def in_force_line(choice: Choice, counts: Tally,
                  environ: Optional[Mapping[str, str]] = None) -> str:
    """The one line saying what is in force: compressor and settings, source, tensor counts."""
    threshold = env.MIN_COMPRESS_BYTES.get(environ)
    line = (f"byteps-thc: compressor {describe(choice.compressor)}; chosen by {choice.source}; "
            f"{counts.tensors} gradient tensors")
    if getattr(choice.compressor, "name", None) not in ("none", "fp16"):  # size-gated
        line += (f": {counts.compressed} compressed, {counts.small} under "
                 f"{env.MIN_COMPRESS_BYTES.name}={threshold} go uncompressed")
        other = counts.tensors - counts.compressed - counts.small
        if other:
            line += f", {other} not floating point or of unknown size go uncompressed"
    return line


class RunReport:
    """What one process says about compression, each thing once, on rank 0: the warning when
    the script overrides the launcher, the in-force line at the first declare, and at exit,
    under THC, that no tensor of the whole run was compressed (every declare counts).

    The adapters use the process's REPORT; `at_exit=False` (tests) registers no exit hook."""

    def __init__(self, at_exit: bool = True, stream=None):
        self._lock = threading.Lock()
        self._said: set = set()
        self._thc_chosen = False
        self._compressed = 0
        self._threshold = None
        self._at_exit = at_exit
        self._hooked = False
        self.stream = stream  # None: sys.stderr at the time of writing

    def warn_conflict(self, choice: Choice, rank: int,
                      environ: Optional[Mapping[str, str]] = None, stacklevel: int = 2) -> None:
        """warnings.warn(conflict_message) on rank 0, once per message; `stacklevel` as
        warnings.warn's, counted from the caller."""
        message = conflict_message(choice, environ)
        if message is None or rank != 0:
            return
        with self._lock:
            if message in self._said:
                return
            self._said.add(message)
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)

    def announce(self, choice: Choice, counts: Tally, rank: int,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        """At a declare of gradient tensors: the in-force line (rank 0, the first declare only);
        adds to the end-of-run count."""
        with self._lock:
            first = rank == 0 and "in-force" not in self._said
            if first:
                self._said.add("in-force")
            self._compressed += counts.compressed
            if is_thc(choice.compressor):
                self._thc_chosen = True
                self._threshold = env.MIN_COMPRESS_BYTES.get(environ)
            hook = self._at_exit and rank == 0 and self._thc_chosen and not self._hooked
            self._hooked = self._hooked or hook
        if hook:
            atexit.register(self.end_of_run)
        if first:
            _say(in_force_line(choice, counts, environ), self.stream)

    def nothing_compressed(self) -> Optional[str]:
        """The end-of-run message when THC was chosen and no tensor was compressed, else None."""
        with self._lock:
            if not self._thc_chosen or self._compressed:
                return None
            name = env.MIN_COMPRESS_BYTES.name
            return (f"byteps-thc: THC was chosen but no tensor reached {name}={self._threshold}: "
                    f"nothing was compressed (a smaller {name}, e.g. 0, compresses smaller "
                    "tensors)")

    def end_of_run(self) -> None:
        message = self.nothing_compressed()
        if message is not None:
            _say(message, self.stream)


REPORT = RunReport()
warn_conflict = REPORT.warn_conflict
announce = REPORT.announce
