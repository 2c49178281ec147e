"""THC lookup tables: which 2^b integers in [0, g] the quantiser rounds to.

A table TBL has K = 2^b integer levels 0 = TBL[0] < ... < TBL[K-1] = g, symmetric about g/2.
Table value t stands for z = (t - g/2) * (2T/g), T = Phi^-1(1 - p/2), so the table spans
[-T, T] in units of a rotated, scaled coordinate (close to a standard normal).
The table minimises the expected variance of unbiased stochastic rounding,
E[(z - a)(b - z)] with a <= z <= b adjacent levels, for z standard normal truncated to [-T, T].

Solver: the cost adds up over intervals, so dynamic programming over the integer grid finds the
best symmetric table: choose the lower half 0 = l_0 < ... < l_{K/2-1} = x (< g - x), mirror it,
and pay 2 * (lower intervals) + the middle interval [x, g - x]. Small grids (g/2 <= 2048) use the
exact O(K g^2) recurrence; larger grids use divide-and-conquer on the monotone argmin,
which the tests check against the exact recurrence.
"""
from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

_EXACT_LIMIT = 2048  # grid points of the half table up to which the exact recurrence is used


def clip_threshold(overflow_prob: float) -> float:
    """T = Phi^-1(1 - p/2): the two-sided mass p lies beyond +-T."""
    if not 0.0 < overflow_prob < 1.0:
        raise ValueError(f"overflow_prob={overflow_prob!r} must lie strictly between 0 and 1")
    return NormalDist().inv_cdf(1.0 - overflow_prob / 2.0)


def _grid(granularity: int, clip: float):
    """z, Phi(z), phi(z) at every integer t in [0, g]."""
    t = np.arange(granularity + 1, dtype=np.float64)
    z = (t - granularity / 2.0) * (2.0 * clip / granularity)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return z, cdf, pdf


def _interval_cost(z, cdf, pdf, a, b):
    """E[(z - z_a)(z_b - z); z_a <= z <= z_b] for a standard normal z (a, b index arrays)."""
    za, zb = z[a], z[b]
    m0 = cdf[b] - cdf[a]
    m1 = pdf[a] - pdf[b]
    m2 = m0 + za * pdf[a] - zb * pdf[b]
    return np.maximum(-m2 + (za + zb) * m1 - za * zb * m0, 0.0)


def _solve(bits: int, granularity: int, clip: float) -> tuple[int, ...]:
    g = granularity
    k = 1 << bits
    if k == 2:
        return (0, g)
    z, cdf, pdf = _grid(g, clip)
    half = (g - 1) // 2 + 1          # x in [0, half): x < g - x
    steps = k // 2 - 1               # intervals in the lower half chain 0 -> x
    inf = np.inf
    f = np.full(half, inf)
    f[0] = 0.0
    choice = np.zeros((steps, half), dtype=np.int64)
    xs = np.arange(half)
    for m in range(steps):
        new = np.full(half, inf)
        if half <= _EXACT_LIMIT:
            y = xs[:, None]
            x = xs[None, :]
            cost = np.where(y < x, f[:, None] + _interval_cost(z, cdf, pdf, np.minimum(y, x), x),
                            inf)
            arg = np.argmin(cost, axis=0)
            new = cost[arg, xs]
            choice[m] = arg
        else:
            _divide_and_conquer(f, new, choice[m], z, cdf, pdf, half)
        f = new
    total = 2.0 * f + np.where(xs < g - xs, _interval_cost(z, cdf, pdf, xs, g - xs), inf)
    x = int(np.argmin(total))
    lower = [x]
    for m in range(steps - 1, -1, -1):
        x = int(choice[m][x])
        lower.append(x)
    lower.reverse()
    assert lower[0] == 0, lower
    return tuple(lower + [g - v for v in reversed(lower)])


def _divide_and_conquer(f, out, arg, z, cdf, pdf, half):
    """out[x] = min_{y<x} f[y] + c(y, x), using that the argmin is non-decreasing in x."""
    stack = [(1, half - 1, 0, half - 2)]
    while stack:
        lo, hi, olo, ohi = stack.pop()
        if lo > hi:
            continue
        mid = (lo + hi) // 2
        ys = np.arange(olo, min(mid - 1, ohi) + 1)
        vals = f[ys] + _interval_cost(z, cdf, pdf, ys, np.full_like(ys, mid))
        j = int(np.argmin(vals))
        out[mid], arg[mid] = vals[j], ys[j]
        stack.append((lo, mid - 1, olo, int(ys[j])))
        stack.append((mid + 1, hi, int(ys[j]), ohi))


@lru_cache(maxsize=256)
def solve_table(bits: int, granularity: int, overflow_prob: float) -> tuple[int, ...]:
    """The optimal symmetric table of 2^bits integers in [0, granularity] (cached).

    >>> solve_table(4, 30, 1/32)
    (0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30)
    """
    _check(bits, granularity)
    return _solve(bits, granularity, clip_threshold(overflow_prob))


def _check(bits, granularity):
    if not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise ValueError(f"bits={bits!r} is out of range: use an integer in 1..8")
    levels = 1 << bits
    if (not isinstance(granularity, (int, np.integer))
            or not levels - 1 <= granularity <= (1 << 24) - 1):
        raise ValueError(f"granularity={granularity!r} is out of range for bits={bits}: "
                         f"use an integer in {levels - 1}..{(1 << 24) - 1} "
                         "(2^bits - 1 levels apart)")


def expected_error(bits: int, granularity: int, overflow_prob: float, table=None) -> dict:
    """Per-coordinate squared error in z units for one worker without error feedback.

    Returns {'rounding', 'clipping', 'total'}: the stochastic-rounding variance over [-T, T]
    plus the clipping error E[(|z| - T)^2; |z| > T], z standard normal. With n independent
    workers the error of the mean is total / n.
    """
    clip = clip_threshold(overflow_prob)
    tbl = np.asarray(table if table is not None else solve_table(bits, granularity, overflow_prob))
    z, cdf, pdf = _grid(granularity, clip)
    rounding = float(np.sum(_interval_cost(z, cdf, pdf, tbl[:-1], tbl[1:])))
    tail = 1.0 - NormalDist().cdf(clip)
    dens = math.exp(-0.5 * clip * clip) / math.sqrt(2.0 * math.pi)
    clipping = 2.0 * ((1.0 + clip * clip) * tail - clip * dens)
    return {"rounding": rounding, "clipping": clipping, "total": rounding + clipping}
