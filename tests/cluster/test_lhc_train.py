"""`bpslaunch --local 2 --compressor lhc` trains a model with a large embedding table (most rows
untouched per batch) through the fork's `lhc` compressor, its server path and THC's max round.

The script (tests/cluster/scripts/lhc_embedding.py) records each worker's local gradient of the
table (before the push_pull) and the averaged one (after it). Checked from outside the code
under test:

- both workers end bit-identical (averaged gradients of every step, final parameters);
- every step's averaged gradient equals, bit for bit, the exact mean of the two workers'
  quantised gradients, computed here from the NumPy reference (byteps_thc.lhc.reference.encode's
  values q, summed in int64, times 2^-e / 2, rounded once to float32), with the key the server's log
  names and the max |v| the local gradients give;
- the loss curve stays within 1e-4 (relative) of an uncompressed run's: per coordinate the sum
  differs from the float sum by at most one unit 2^-e per worker, and 2^-e < 2 M 2^-30 for the
  largest value M;
- the bytes on the wire (a private network namespace, when root) are printed (-rP);
- the flag: the in-force line names LHC and bpslaunch, the server registered exactly the table;
- an overloaded sketch (--lhc-capacity far below the union): the exact fallback round (each
  worker's values at the unresolved indices, summed by the server) completes every step, the
  same exact mean, and the workers log it.
"""
import os
import re
import sys

import numpy as np
import pytest

import test_compressor_flag as flag
from byteps_thc import LhcConfig
from byteps_thc.lhc import reference as R
from test_launch_local import ROOT, pytestmark  # noqa: F401

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "lhc_embedding.py")
ROWS, DIM, BATCH, STEPS = 20000, 16, 48, 12
TABLE = ROWS * DIM  # one partition: 1.28 MB < BYTEPS_PARTITION_BYTES
CAPACITY = 4096     # the union of two batches' rows: at most 4 * 48 * 16 = 3072 nonzeros


def bpslaunch(launcher_args, script_argv, timeout=600):
    """test_compressor_flag's bpslaunch (a private network namespace when root) with any
    launcher flags."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BYTEPS_COMPRESSOR", "BYTEPS_THC_", "BYTEPS_LHC_",
                                "BYTEPS_MIN_COMPRESS"))}
    args = ["--local", "2", "--timeout", str(timeout - 60)] + list(launcher_args)
    args += ["--", sys.executable] + list(script_argv)
    shell = ('ip link set lo up && "$@"; rc=$?; '
             'awk \'$1 == "lo:" {print "LO_TX " $10}\' /proc/net/dev; exit $rc')
    prefix = (flag.NETNS + ["sh", "-c", shell, "netns"]) if flag.NETNS else ()
    code, out, err, _ = flag.launch_local.bpslaunch(args, timeout=timeout, env=env, prefix=prefix)
    r = flag.Run(code, out + err)
    assert r.code == 0, (out + err)[-4000:]
    return r


def run(tmp_path, name, launcher_args, steps=STEPS, catch=False):
    out = tmp_path / name
    r = bpslaunch(launcher_args, [SCRIPT, "--out", str(out), "--rows", str(ROWS), "--dim",
                                  str(DIM), "--batch", str(BATCH), "--steps", str(steps)]
                  + (["--catch"] if catch else []))
    if r.lo_bytes:
        print(f"wire bytes ({name}, whole run): {r.lo_bytes}")
    return r, [np.load(out / f"rank{i}.npz") for i in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lhc_train")
    return {"lhc": run(tmp, "lhc", ["--compressor", "lhc", "--lhc-capacity", str(CAPACITY)]),
            "none": run(tmp, "none", [])}


def table_key(output):
    keys = re.findall(rf"LHC key (\d+) registered: capacity=(\d+) seed=(\d+) d={TABLE} m=(\d+)",
                      output)
    assert len(keys) == 1, output[-3000:]
    key, capacity, seed, m = map(int, keys[0])
    return key, capacity, seed, m


def test_flag_registers_the_table_and_says_lhc(runs):
    r, _ = runs["lhc"]
    assert len(re.findall(r"LHC key \d+ registered", r.output)) == 1, r.output[-3000:]
    assert table_key(r.output)[1] == CAPACITY
    assert len(r.in_force) == 1, r.output[-3000:]
    line = r.in_force[0]
    assert f"LHC capacity={CAPACITY}" in line and "chosen by bpslaunch --compressor lhc" in line
    assert "1 compressed" in line, line
    assert runs["none"][0].thc_keys == set()


def test_workers_bit_identical(runs):
    _, (a, b) = runs["lhc"]
    assert np.array_equal(a["averaged"].view(np.uint32), b["averaged"].view(np.uint32))
    for name in a.files:
        if name.startswith("param_"):
            assert np.array_equal(a[name], b[name]), name
    assert not np.array_equal(a["local"], b["local"])  # different batches: a real sum


def check_exact_means(r, a, b, steps):
    """Every step's averaged gradient is the exact mean of the workers' quantised gradients."""
    key, capacity, seed, m = table_key(r.output)
    cfg = LhcConfig(capacity=capacity, seed=seed)
    assert cfg.m_buckets(TABLE) == m  # the C++ sizing is byteps_thc.lhc.config's
    for step in range(steps):
        xs = [a["local"][step].ravel(), b["local"][step].ravel()]
        nnz = [int(np.count_nonzero(x)) for x in xs]
        assert 0 < max(nnz) < TABLE // 10  # sparse
        M = max(float(np.max(np.abs(x))) for x in xs)
        e = R.scale_exponent(M, 2)
        total = np.zeros(TABLE, np.int64)
        for rank, x in enumerate(xs):
            _, _, idx, q = R.encode(cfg, x, M, 2, m, rank=rank, step=step, key=key,
                                    with_values=True)
            total[idx] += q
        exact = (total.astype(np.float64) * 2.0 ** -e / 2).astype(np.float32)
        got = a["averaged"][step].ravel()
        assert np.array_equal(got.view(np.uint32), exact.view(np.uint32)), step
        # and near the real mean: under one unit 2^-e (each worker's rounding is below one
        # unit, the mean of two), plus half an ulp of the float32 the result is rounded to
        mean = (xs[0].astype(np.float64) + xs[1]) / 2
        bound = 2.0 ** -e + np.abs(np.spacing(got)).astype(np.float64) / 2
        assert np.all(np.abs(got - mean) <= bound), step
        assert np.all(got[(xs[0] == 0) & (xs[1] == 0)] == 0)
    assert np.array_equal(a["averaged"].view(np.uint32), b["averaged"].view(np.uint32))


def test_averaged_gradient_is_the_exact_mean_of_the_quantised_inputs(runs):
    r, (a, b) = runs["lhc"]
    check_exact_means(r, a, b, STEPS)
    assert "exact fallback round" not in r.output  # the capacity holds the union


def test_loss_curve_matches_uncompressed(runs):
    lhc, none = runs["lhc"][1][0]["losses"], runs["none"][1][0]["losses"]
    assert len(lhc) == len(none) == STEPS
    assert np.allclose(lhc, none, rtol=1e-4, atol=0), (lhc, none)


def test_overloaded_sketch_takes_the_exact_fallback_round(tmp_path):
    """--lhc-capacity far below the union: peeling leaves most indices unresolved, every worker
    sends its values there in the fallback round, and the result is still the exact mean."""
    r, (a, b) = run(tmp_path, "overload", ["--lhc-capacity", "300"], steps=4, catch=True)
    assert "STEP_FAILED" not in r.output, r.output[-3000:]
    for w in "01":
        said = re.findall(rf"^\[worker {w}\] .*LHC key \d+ \('.*'\): peeling left (\d+) of "
                          r"(\d+) indices unresolved .*the exact fallback round sends them again",
                          r.output, re.M)
        assert said and int(said[0][0]) > 0, r.output[-3000:]
    check_exact_means(r, a, b, 4)
