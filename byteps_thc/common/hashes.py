"""The hashes both codecs are built on (csrc/common/hash.h is their C++ twin, bit for bit).

splitmix64 mixes seeds and keys (Python ints, wrapping at 2^64); `splitmix64_v` is the same on a
uint64 array; `hash32` (lowbias32) draws per-coordinate words from a 32-bit key. `digest64` is
the 64-bit digest of a configuration's text that workers and the server compare.
"""
from __future__ import annotations

import hashlib

import numpy as np

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix64_v(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each element of a uint64 array (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on a uint32 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def digest64(text: str) -> int:
    """The first 8 bytes of the SHA-256 of `text`, little-endian: a configuration's fingerprint."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
