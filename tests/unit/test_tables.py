"""The table solver: the published tables, symmetry, optimality and the error figures of spec §2."""
import itertools

import numpy as np
import pytest

from byteps_thc.thc import tables
from byteps_thc.thc.tables import expected_error, solve_table

REFERENCE = [
    ((4, 30, 1 / 32), [0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30]),
    ((4, 30, 1 / 128), [0, 4, 6, 8, 10, 12, 13, 14, 16, 17, 18, 20, 22, 24, 26, 30]),
    ((3, 16, 1 / 32), [0, 3, 5, 7, 9, 11, 13, 16]),
    ((3, 42, 1 / 1024), [0, 10, 15, 19, 23, 27, 32, 42]),
]


@pytest.mark.parametrize("args,expected", REFERENCE)
def test_published_tables(args, expected):
    assert list(solve_table(*args)) == expected


@pytest.mark.parametrize("bits,g,p", [(1, 1, 0.1), (2, 3, 1 / 32), (2, 10, 1 / 16),
                                      (5, 100, 1 / 64), (8, 255, 1 / 32), (4, 31, 1 / 32)])
def test_valid_shape(bits, g, p):
    t = solve_table(bits, g, p)
    assert len(t) == 1 << bits and t[0] == 0 and t[-1] == g
    assert all(a < b for a, b in zip(t, t[1:]))
    assert all(t[i] + t[-1 - i] == g for i in range(len(t)))


def _brute_force(bits, g, p):
    """Every symmetric table, scored by the same objective (small cases only)."""
    k = 1 << bits
    clip = tables.clip_threshold(p)
    z, cdf, pdf = tables._grid(g, clip)
    best = None
    for lower in itertools.combinations(range(1, (g - 1) // 2 + 1), k // 2 - 1):
        lo = [0, *lower]
        t = np.array(lo + [g - v for v in reversed(lo)])
        cost = float(np.sum(tables._interval_cost(z, cdf, pdf, t[:-1], t[1:])))
        if best is None or cost < best[0] - 1e-15:
            best = (cost, tuple(int(v) for v in t))
    return best[1]


@pytest.mark.parametrize("bits,g,p", [(3, 16, 1 / 32), (3, 20, 1 / 8), (3, 25, 1 / 100),
                                      (4, 30, 1 / 32)])
def test_dynamic_programming_matches_brute_force(bits, g, p):
    assert solve_table(bits, g, p) == _brute_force(bits, g, p)


@pytest.mark.parametrize("bits,g", [(4, 301), (5, 400), (3, 999)])
def test_divide_and_conquer_matches_exact(monkeypatch, bits, g):
    clip = tables.clip_threshold(1 / 64)
    exact = tables._solve(bits, g, clip)
    monkeypatch.setattr(tables, "_EXACT_LIMIT", 0)
    assert tables._solve(bits, g, clip) == exact


def test_error_figures_of_the_spec():
    e = expected_error(4, 30, 1 / 32)
    assert e["rounding"] == pytest.approx(0.0131, abs=5e-5)
    assert e["clipping"] == pytest.approx(0.0073, abs=5e-5)
    assert e["total"] == pytest.approx(0.0204, abs=1e-4)  # 0.0131 + 0.0073
    best = min(expected_error(4, 30, 2.0 ** -k)["total"] for k in range(3, 12))
    assert best == pytest.approx(0.0194, abs=1e-4)


@pytest.mark.parametrize("bad,msg", [((0, 30, 0.1), "bits=0"), ((9, 300, 0.1), "bits=9"),
                                     ((4, 14, 0.1), "granularity=14"),
                                     ((4, 30, 0.0), "overflow_prob=0.0"),
                                     ((4, 30, 1.5), "overflow_prob=1.5")])
def test_bad_arguments_are_named(bad, msg):
    with pytest.raises(ValueError, match=msg):
        solve_table(*bad)
