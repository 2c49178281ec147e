"""THC as FSDP2's reduce-scatter (byteps_thc.fsdp) on real gloo process groups on 127.0.0.1.

The ranks run scripts/fsdp_worker.py (calls of the comm as FSDP makes them) or
example/pytorch/train_digits_fsdp.py (training under fully_shard). What they saved is checked
against the NumPy reference's THC round of the same shards (byteps_thc.reference), with each
shard's block and seed derived here from the rules the docs state, never by the comm's code.
"""
import hashlib
import math
import os
import re

import numpy as np
import pytest
import torch

from byteps_thc import ThcConfig, reference
from conftest import ROOT
from test_ddp_hook import max_norms, run_ranks, run_torchrun
from tests.cluster.scripts import fsdp_worker as worker

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")

WORKER = os.path.join(SCRIPTS, "fsdp_worker.py")
STEPS, MORE = 4, 2  # the worker's steps before the state_dict, and after it
SUM_STEP = 1        # the worker's one call with op SUM


def shard_cfg(cfg, key, j, size, ef):
    """Shard j of a group: blocks of the largest power of two B >= 2^10 with ceil(S/B)*B <=
    1.05 S (with block_scale B <= 2^16; a requested block instead, capped at next_pow2(S);
    with block_scale >= 32),
    seed = the first 8 bytes (little-endian) of sha256(f"{seed}:{key},{j}")."""
    whole = 1 << max(0, math.ceil(math.log2(size)))
    top = min(whole, 1 << 16) if cfg.block_scale else whole  # block_scale: blocks up to 2^16
    block = next((b for b in (1 << k for k in range(top.bit_length() - 1, 9, -1))
                  if math.ceil(size / b) * b <= 1.05 * size), min(whole, 1024))
    if cfg.rotation_block:
        block = min(cfg.rotation_block, whole)
    if cfg.block_scale:
        block = max(block, 32)
    seed = int.from_bytes(hashlib.sha256(f"{cfg.seed}:{key},{j}".encode()).digest()[:8], "little")
    return ThcConfig(**dict(cfg.__dict__, rotation_block=block, seed=seed, error_feedback=ef))


def simulate(n, cfg, ef, dtype, trace):
    """Expected output of every rank at every step (list per step of n tensors, or "nan")."""
    S = worker.SIZE
    cfgs = [shard_cfg(cfg, worker.KEY, j, S, ef == "fp32") for j in range(n)]
    rot = {(r, j): reference.initial_residual(cfgs[j], S) for r in range(n) for j in range(n)}
    own = {(r, j): np.zeros(S, np.float32) for r in range(n) for j in range(n)}  # textbook
    step, expected, rounds = 0, [], iter(trace)
    for s in range(STEPS + MORE):
        if s == STEPS and ef == "fp32":  # state_dict(): the rotated residuals to own coordinates
            for (r, j), res in rot.items():
                own[(r, j)] = reference.unrotate_residual(cfgs[j], res, S)
                rot[(r, j)] = reference.initial_residual(cfgs[j], S)
        x = [worker.inputs(r, s, n, dtype).float().numpy() for r in range(n)]
        xs = {(r, j): x[r][j * S:(j + 1) * S] + (own[(r, j)] if ef != "off" else 0)
              for r in range(n) for j in range(n)}
        if ef == "bf16":
            xs = {k: x[k[0]][k[1] * S:(k[1] + 1) * S]
                  + torch.from_numpy(own[k]).to(torch.bfloat16).float().numpy() for k in xs}
        ms = next(rounds)
        if not all(np.isfinite(v).all() for v in xs.values()):
            assert ms is None
            expected.append("nan")
            continue
        ms = [np.asarray(m) if cfg.block_scale else m for m in ms]
        for j in range(n):
            want = max_norms(cfgs[j], [xs[(r, j)] for r in range(n)],
                             [rot[(r, j)] if ef == "fp32" else None for r in range(n)])
            np.testing.assert_allclose(ms[j], want, rtol=1e-6)  # the norm is not bit-exact
        outs = []
        for j in range(n):
            enc = [reference.encode(cfgs[j], xs[(r, j)], ms[j], r, step,
                                    rot[(r, j)] if ef == "fp32" else None) for r in range(n)]
            sums = reference.aggregate(cfgs[j], [e[0] for e in enc], S, n)
            mean = reference.decode(cfgs[j], sums, S, n, ms[j])
            if s == SUM_STEP:
                mean = mean * np.float32(n)
            outs.append(torch.from_numpy(mean).to(dtype))
            for r in range(n):
                if ef == "fp32":
                    rot[(r, j)] = enc[r][1]
                    own[(r, j)] = np.zeros(S, np.float32)
                elif ef == "bf16":
                    one = reference.aggregate(cfgs[j], [enc[r][0]], S, 1)
                    est = reference.decode(cfgs[j], one, S, 1, ms[j])
                    own[(r, j)] = torch.from_numpy(xs[(r, j)] - est).to(torch.bfloat16).float() \
                        .numpy()
        expected.append(outs)
        step += 1
    assert next(rounds, "end") == "end"
    return expected


def check(expected, got, rank):
    for s, (want, g) in enumerate(zip(expected, got)):
        if isinstance(want, str):
            assert torch.isnan(g).all(), f"step {s}"
        else:
            assert torch.equal(g, want[rank]), f"step {s}, rank {rank}"


@pytest.mark.parametrize("n, dtype, ef, block", [
    # block: "0" the default (a scale per block), "one" one norm a shard, else a scale per
    # block of that size
    (2, "float32", "fp32", "0"), (3, "bfloat16", "fp32", "one"), (2, "float16", "bf16", "0"),
    (3, "float32", "off", "one"), (2, "float32", "fp32", "1024"), (3, "float16", "bf16", "one")])
def test_reduce_scatter_is_the_reference_bit_for_bit(tmp_path, n, dtype, ef, block):
    ranks = run_ranks(n, ["exact", dtype, ef, block], tmp_path, worker=WORKER)
    r0 = ranks[0]
    expected = simulate(n, r0["config"], ef, getattr(torch, dtype), r0["trace"])
    for r, got in enumerate(ranks):
        assert got["trace"] == r0["trace"]  # one agreement
        check(expected, got["got"] + got["cont_a"], r)
        # a fresh instance loaded from the state_dict continues with the same bits
        for a, b in zip(got["cont_a"], got["cont_b"]):
            assert torch.equal(a, b)
    stats = r0["stats"]
    assert stats["calls"] == STEPS + MORE - 1 and stats["calls_nonfinite"] == 1
    payload = -(-shard_cfg(r0["config"], 0, 0, worker.SIZE, True).bits * 20480 // 8)
    assert stats["bytes_sent"] == stats["calls"] * (n - 1) * payload
    assert r0["residual_bytes"] == {"fp32": 4 * n * 20480, "bf16": 2 * n * worker.SIZE,
                                    "off": 0}[ef]


def test_refusals_name_the_bad_value_on_every_rank(tmp_path):
    ranks = run_ranks(2, ["refuse"], tmp_path, worker=WORKER)
    for r in ranks:
        assert r["op"].startswith("refused: ") and "not supported" in r["op"], r["op"]
        assert "AVG" in r["op"] and r["premul"].startswith("refused: ")
        assert "'fp8'" in r["ef"]
        assert "configurations differ" in r["config"], r["config"]
        assert "serves one param group" in r["size"], r["size"]
        assert r["load_config"].startswith("refused: ") and "same ones" in r["load_config"]
        assert r["load_ef"].startswith("refused: ") and "error_feedback" in r["load_ef"]
        assert r["load_world"].startswith("refused: ") and "of 3" in r["load_world"]


def run_digits(n, compressor, *extra):
    text = run_torchrun(n, os.path.join(ROOT, "example", "pytorch", "train_digits_fsdp.py"),
                        ["--compressor", compressor, *extra])
    finals = re.findall(r"final test accuracy: ([0-9.]+) .*?parameter digest ([0-9a-f]{16})",
                        text, re.S)
    assert len(finals) == n, text[-4000:]
    return [(float(acc), digest) for acc, digest in finals]


@pytest.mark.parametrize("n", [2, 3])
def test_digits_under_fully_shard_within_one_point_of_plain_fsdp(n):
    plain, thc = run_digits(n, "none"), run_digits(n, "thc")
    for ranks in (plain, thc):  # every rank gathers the same parameters
        assert len({digest for _, digest in ranks}) == 1, ranks
    assert plain[0][1] != thc[0][1]  # THC did change the gradients
    assert abs(thc[0][0] - plain[0][0]) <= 0.01, (thc, plain)
