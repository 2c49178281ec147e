"""The fork's own C functions, one wrapper for every framework plugin.

Each plugin of the BytePS fork (torch, TensorFlow, MXNet) links our common sources, so each of
its libraries exports the same `byteps_thc_*` functions (csrc/byteps/src/byteps/common/:
failure.h, compressor/kwargs_check.h). An adapter hands this class the library its plugin
loaded (`ctypes.CDLL`) and the plugin's name; everything that calls those functions goes through
here, so that the three adapters share one failure API and one refusal check.
"""
from __future__ import annotations

import ctypes
from typing import List, Mapping, Optional, Tuple

# Reasons and refusals are a line or a short report; longer ones are cut to this size.
_TEXT_BYTES = 4096
# The open waits' list: the oldest ones that fit (a line is an id, a duration and a tensor name).
_WAITS_BYTES = 1 << 16
_REBUILD = {"torch": "make byteps", "tensorflow": "make byteps-tf", "mxnet": "make mxnet-env"}


class ForkLib:
    """The `byteps_thc_*` functions of one plugin's library."""

    def __init__(self, cdll, plugin: str):
        if plugin not in _REBUILD:
            raise ValueError(f"unknown BytePS plugin {plugin!r}; one of {sorted(_REBUILD)}")
        self.lib = cdll
        self.plugin = plugin

    def _fn(self, symbol: str, patch: str, restype=ctypes.c_int):
        fn = getattr(self.lib, symbol, None)
        if fn is None:
            raise RuntimeError(f"this BytePS build's {self.plugin} plugin has no {symbol} "
                               f"(patch {patch}); rebuild it with `{_REBUILD[self.plugin]}`")
        fn.restype = restype
        return fn

    # -- cluster failure (failure.h) ---------------------------------------------------------
    def fail_cluster(self, why: str) -> None:
        """Fail this worker's cluster: every push_pull in flight and every later one fails
        carrying `why`, and BytePS's shutdown no longer waits for the other nodes. The first
        reason wins."""
        self._fn("byteps_thc_fail_cluster", "0044", restype=None)(
            ctypes.c_char_p(str(why).encode()))

    def cluster_failure(self) -> Optional[str]:
        """The reason the cluster failed (fail_cluster, a dead node, a stall), or None."""
        buf = ctypes.create_string_buffer(_TEXT_BYTES)
        if not self._fn("byteps_thc_cluster_failed", "0044")(buf, ctypes.c_int(len(buf))):
            return None
        return buf.value.decode(errors="replace")

    # -- open waits (thc_waits.h) ----------------------------------------------------------
    def open_waits(self) -> Optional[List[Tuple[int, float, str]]]:
        """The push_pulls this plugin's op is waiting for: [(id, seconds waited, tensor name)],
        oldest first; None when this build has no such list (before patch 0096)."""
        fn = getattr(self.lib, "byteps_thc_open_waits", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        buf = ctypes.create_string_buffer(_WAITS_BYTES)
        fn(buf, ctypes.c_int(len(buf)))
        waits = []
        for line in buf.value.decode(errors="replace").splitlines():
            wid, seconds, name = line.split("\t", 2)
            waits.append((int(wid), float(seconds), name))
        return waits

    # -- compressor kwargs (kwargs_check.h) --------------------------------------------------
    def compressor_refusal(self, name: str) -> str:
        """Why BytePS refused the compressor kwargs tensor `name` was declared with (they name
        no registered compressor, or a value it rejects), or "". A build without patch 0030 has
        no such check and refuses nothing."""
        fn = getattr(self.lib, "byteps_thc_compressor_refusal", None)
        if fn is None:
            return ""
        fn.restype = ctypes.c_int
        buf = ctypes.create_string_buffer(_TEXT_BYTES)
        if fn(ctypes.c_char_p(name.encode("ascii")), buf, ctypes.c_int(len(buf))) == 0:
            return ""
        return buf.value.decode(errors="replace")

    def declare_with_kwargs(self, symbol: str, patch: str, name: str,
                            kwargs: Optional[Mapping[str, str]]) -> None:
        """Call a plugin's `symbol(name, n, keys, values)` declare function (a C array of n
        key and n value strings); raises when it returns non-zero."""
        fn = self._fn(symbol, patch)
        items = sorted((kwargs or {}).items())
        n = len(items)
        keys = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k, _ in items])
        vals = (ctypes.c_char_p * max(n, 1))(*[str(v).encode() for _, v in items])
        rc = fn(ctypes.c_char_p(name.encode("ascii")), ctypes.c_int(n), keys, vals)
        if rc != 0:
            raise RuntimeError(f"declaring BytePS tensor {name!r} failed ({rc})")
