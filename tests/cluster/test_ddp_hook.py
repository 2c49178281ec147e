"""The THC DDP comm hook (byteps_thc.ddp) on real gloo process groups on 127.0.0.1.

Each test starts n ranks of scripts/ddp_worker.py under the launcher's Supervisor (own process
groups, a timeout, every process stopped at the end) and checks what they saved against values
computed here from the same inputs: the NumPy reference's THC round (byteps_thc.thc.reference), with
the bucket's block and seed derived here from the rules the docs state, never by the hook's code.
"""
import hashlib
import io
import math
import os
import re
import sys

import numpy as np
import pytest
import torch

from byteps_thc import ThcCodec, ThcConfig
from byteps_thc.ddp import geometry
from byteps_thc.launch.supervisor import ProcSpec, Supervisor
from byteps_thc.thc import reference
from conftest import ROOT, free_port
from tests.cluster.scripts import ddp_worker as worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_worker.py")


def run_ranks(n, args, out_dir, timeout=240, worker=WORKER):
    """Run n ranks of the worker script; return each rank's saved dict. Fails with the logs."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
    argv = [sys.executable, worker, args[0], str(out_dir), *args[1:]]
    specs = [ProcSpec(f"rank {r}", "worker", argv, dict(env, RANK=str(r)), ROOT)
             for r in range(n)]
    sup = Supervisor(specs, err=io.StringIO(), echo=False, keep_lines=True, grace=60,
                     timeout=timeout, shutdown_timeout=0, kill_timeout=5.0, poll_interval=0.2,
                     tag="ddp")
    with sup:
        outcome = sup.wait()
    logs = "\n".join(f"---- {s.name}\n{sup.logs[s.name].text()[-3000:]}" for s in specs)
    assert outcome.kind == "ok", f"{outcome.message}\n{logs}"
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
            for r in range(n)]


# -- the rules, as the docs state them -----------------------------------------------------------
def expected_block(d, largest=None):
    """Largest power of two B >= 2^10 (and <= largest) with ceil(d/B)*B <= 1.05 d, else
    min(2^10, next_pow2(d))."""
    whole = 1 << max(0, math.ceil(math.log2(d)))
    top = min(whole, largest or whole)
    for b in (1 << k for k in range(top.bit_length() - 1, 9, -1)):
        if math.ceil(d / b) * b <= 1.05 * d:
            return b
    return min(whole, 1024)


def expected_seed(seed, key):
    text = f"{seed}:" + ",".join(map(str, key))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def test_block_rule_pads_at_most_five_percent():
    assert geometry.bucket_block(1_059_850) == 1 << 15  # 2^21 would double it
    assert geometry.bucket_block(1 << 20) == 1 << 20
    assert geometry.bucket_block(5000) == 1024
    assert geometry.bucket_block(1100) == 1024          # no block >= 2^10 fits: the smallest
    assert geometry.bucket_block(700) == 1024           # one block
    assert geometry.bucket_block(1000, requested=4096) == 1024
    for d in (16385, 20000, 20481, 100_003, 327_681, 1_059_850, 3_000_001, 25 * 2 ** 18 + 1):
        b = geometry.bucket_block(d)
        assert b == expected_block(d)
        cfg = ThcConfig(rotation_block=b)
        padded = ThcCodec(cfg, d).padded  # the codec's own geometry
        assert padded <= (1.05 * d if d >= 20 * 1024 else d + 1023), (d, b, padded)


@pytest.mark.parametrize("bits", [1, 3, 4, 8])
@pytest.mark.parametrize("n", [2, 3, 7])
def test_shards_are_whole_bytes_of_the_payload(bits, n):
    for padded in (4, 64, 1000, 1 << 15, 81920):
        bounds = geometry.shard_bounds(padded, n)
        assert bounds[0][0] == 0 and bounds[-1][1] == padded
        ranges = [geometry.byte_range(s, e, bits) for s, e in bounds]
        assert ranges[-1][1] == -(-padded * bits // 8)  # the whole payload
        for (s, e), (s2, _), (b0, b1), (c0, _) in zip(bounds, bounds[1:], ranges, ranges[1:]):
            assert e == s2 and b1 == c0 and (s % 8 == 0 or s == e == padded)
        # the bytes of each shard unpack to exactly that shard's indices
        idx = np.arange(padded) % (1 << bits)
        payload = reference.pack(idx, bits)
        for (s, e), (b0, b1) in zip(bounds, ranges):
            assert np.array_equal(reference.unpack(payload[b0:b1], bits, e - s), idx[s:e])


# -- the reference simulation of a run ------------------------------------------------------------
# The error-feedback rule (byteps_thc/ddp/state.py): each parameter's residual is either rotated,
# in the codec of the layout (key, d) that last encoded it, or in its own coordinates. A layout
# whose parameters are not all its own moves every other layout's rotated residual that holds one
# of them to per-parameter form (reference.unrotate_residual, cut to the pieces), zeroes its own,
# and encodes gradient + those pieces; state_dict() moves every rotated residual to that form.
def bucket_cfg(cfg, key, d):
    return ThcConfig(**dict(cfg, rotation_block=requested_block(cfg, d),
                            seed=expected_seed(cfg["seed"], key)))


def requested_block(cfg, d):
    """The block rule (with block_scale: blocks of at most 2^16), or a requested block capped at
    next_pow2(d); with block_scale at least 32."""
    rb, bs = cfg["rotation_block"], cfg.get("block_scale")
    block = (min(rb, 1 << max(0, math.ceil(math.log2(d)))) if rb
             else expected_block(d, 1 << 16 if bs else None))
    return max(block, 32) if bs else block


def max_norms(cfg, xs, residuals):
    """The norm round's result: the max over ranks of each norm (block_scale: of each block's)."""
    if cfg.block_scale:
        return np.max([reference.block_norms(x, r, cfg) for x, r in zip(xs, residuals)], axis=0)
    return max(reference.norm(x, r, cfg) for x, r in zip(xs, residuals))


def release(sim, r, lid):
    key, d, sizes, cfg = sim["layouts"][lid]
    flat = reference.unrotate_residual(bucket_cfg(cfg, key, d), sim["rot"].pop((r, lid)), d)
    for k, piece in zip(key, np.split(flat, np.cumsum(sizes)[:-1])):
        if sim["owner"].get((r, k)) == lid:
            sim["loose"][(r, k)] = piece
            del sim["owner"][(r, k)]


def release_all(sim, n):
    for r in range(n):
        for lid in {lid for (rr, _), lid in sim["owner"].items() if rr == r}:
            release(sim, r, lid)


def simulate(n, layouts, trace, cfg, dtype, start_iter, min_bytes, sim):
    """Expected p.grad per step (model index -> tensor) for the logged bucket layouts.

    `sim` (canonical numbering, residuals, steps) carries over between calls, as the hook's."""
    canon, steps = sim.setdefault("canon", {}), sim.setdefault("steps", {})
    owner, loose, rot = (sim.setdefault(k, {}) for k in ("owner", "loose", "rot"))
    sim.setdefault("layouts", {})
    rounds = iter(trace)
    expected = {}
    for it, idxs in layouts:
        key = tuple(canon.setdefault(i, len(canon)) for i in idxs)
        grads = [worker.inputs(r, it, worker.SHAPES, dtype) for r in range(n)]
        pdtype = grads[0][idxs[0]].dtype
        flat = [torch.cat([g[i].reshape(-1) for g in [grads[r]] for i in idxs]) for r in range(n)]
        d = flat[0].numel()
        out = expected.setdefault(it, {})
        sizes = [grads[0][i].numel() for i in idxs]
        if it < start_iter or d * flat[0].element_size() < min_bytes:
            # a plain all-reduce of buf / n in the bucket's dtype: within a few roundings of that
            # dtype at the inputs' scale (gloo's summation order is its own)
            mean = sum(f.double() for f in flat) / n
            scale = sum(f.double().abs() for f in flat) / n * 4 * torch.finfo(pdtype).eps
            parts = zip(torch.split(mean.to(pdtype), sizes), torch.split(scale, sizes))
            for i, (p, tol) in zip(idxs, parts):
                shape = grads[0][i].shape
                out[i] = (p.reshape(shape), tol.reshape(shape))
            continue
        got_key, m = next(rounds)
        assert tuple(got_key) == key
        lid = (key, d)
        sim["layouts"][lid] = (key, d, sizes, cfg)
        c = bucket_cfg(cfg, key, d)
        x = []
        for r in range(n):
            xr = flat[r].float().numpy().copy()
            if not all(owner.get((r, k)) == lid for k in key):
                for k in key:
                    other = owner.get((r, k))
                    if other is not None and other != lid:
                        release(sim, r, other)
                rot[(r, lid)] = reference.initial_residual(c, d)
                lo = 0
                for k, size in zip(key, sizes):
                    if (r, k) in loose:
                        xr[lo:lo + size] += loose[(r, k)]
                    lo += size
            x.append(xr)
        if not all(np.isfinite(xr).all() for xr in x):  # NaN on every rank, the state kept
            assert math.isnan(m)
            for i in idxs:
                out[i] = ("nan", None)
            continue
        want_m = max_norms(c, x, [rot[(r, lid)] for r in range(n)])
        m = np.asarray(m) if c.block_scale else m
        np.testing.assert_allclose(m, want_m, rtol=1e-6)  # the norm is not bit-exact (contract)
        step = steps.get(key, 0)
        enc = [reference.encode(c, x[r], m, r, step, rot[(r, lid)]) for r in range(n)]
        mean = reference.decode(c, reference.aggregate(c, [e[0] for e in enc], d, n), d, n, m)
        parts = torch.split(torch.from_numpy(mean).to(pdtype), sizes)
        for i, p in zip(idxs, parts):
            out[i] = (p.reshape(grads[0][i].shape), None)
        for r in range(n):
            rot[(r, lid)] = enc[r][1]
            for k in key:
                owner[(r, k)] = lid
                loose.pop((r, k), None)
        steps[key] = step + 1
    return expected, list(rounds)


def check(expected, got_steps, first_step):
    for s, grads in enumerate(got_steps):
        for i, g in enumerate(grads):
            want, tol = expected[first_step + s][i]
            if isinstance(want, str):
                assert torch.isnan(g).all(), f"step {first_step + s}, parameter {i}"
            elif tol is None:
                assert torch.equal(g, want), f"step {first_step + s}, parameter {i}"
            else:
                assert torch.all((g.double() - want.double()).abs() <= tol)


@pytest.mark.parametrize("n, dtype, start_iter, block", [
    # block: "0" the default (a scale per block), "one" one norm a bucket, else a scale per
    # block of that size
    (2, "float32", 0, "0"), (3, "bfloat16", 1, "one"),
    (2, "float32", 0, "one"), (3, "bfloat16", 1, "1024")])
def test_hook_is_the_reference_bit_for_bit(tmp_path, n, dtype, start_iter, block):
    ranks = run_ranks(n, ["exact", dtype, str(start_iter), block], tmp_path)
    r0 = ranks[0]
    # every rank holds the same bits: after the run and after the state_dict round trip
    for other in ranks[1:]:
        for a, b in zip(r0["grads"] + r0["cont_a"], other["grads"] + other["cont_a"]):
            assert all(torch.equal(x, y) or (x.isnan().all() and y.isnan().all())
                       for x, y in zip(a, b))
    # the rebuild was exercised: the first iteration's buckets differ from the later ones'
    first = [tuple(i) for it, i in r0["layouts"] if it == 0]
    later = [tuple(i) for it, i in r0["layouts"] if it == 1]
    assert first != later
    sim = {}
    expected, rest = simulate(n, r0["layouts"], r0["trace"], r0["config"],
                              getattr(torch, dtype), start_iter, 1024, sim)
    check(expected, r0["grads"], 0)
    release_all(sim, n)  # the worker called state_dict() here
    # the original state on a new wrapper, continuing from the same residuals and steps
    expected, rest = simulate(n, r0["layouts_a"], rest, r0["config"], getattr(torch, dtype),
                              start_iter, 1024, sim)
    assert rest == []
    check(expected, r0["cont_a"], len(r0["grads"]))
    # a fresh state loaded from torch.save/torch.load on a new wrapper: the same bits
    for a, b in zip(r0["cont_a"], r0["cont_b"]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    stats = r0["stats"]
    assert stats["buckets_warmup"] == sum(1 for it, _ in r0["layouts"] if it < start_iter)
    assert stats["buckets_skipped"] > 0 and stats["buckets_compressed"] > 0
    # worker.NONFINITE: one round (the bucket of parameter 0 at step 1) was non-finite
    assert stats["nonfinite_steps"] == 1


@pytest.mark.parametrize("what", ["config", "start_iter"])
def test_mismatched_configuration_is_refused_on_every_rank(tmp_path, what):
    ranks = run_ranks(2, ["mismatch", what], tmp_path)
    for r in ranks:
        assert r["result"].startswith("refused: "), r["result"]
        assert "configurations differ" in r["result"]


def test_a_state_on_another_models_wrapper_is_refused_naming_the_state_dict(tmp_path):
    for r in run_ranks(2, ["second"], tmp_path):
        assert r["second"].startswith("refused: "), r["second"]
        assert "has not met" in r["second"] and "load_state_dict" in r["second"]
        assert r["moved"] == "accepted"
        assert r["steps"] and all(s == 2 for s in r["steps"])  # continued from 1, not reset


def test_world_size_one_returns_the_gradient(tmp_path):
    (r0,) = run_ranks(1, ["single"], tmp_path)
    for s, grads in enumerate(r0["grads"]):
        want = worker.inputs(0, s, worker.SHAPES)
        assert all(torch.equal(g, w) for g, w in zip(grads, want))
    assert r0["stats"]["buckets_compressed"] == 0


def run_torchrun(n, script, args, timeout=300):
    """`script args` under torchrun with n ranks (gloo, CPU); returns the ranks' shared output."""
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", script, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
    sup = Supervisor([ProcSpec("torchrun", "worker", argv, env, ROOT)], err=io.StringIO(),
                     echo=False, keep_lines=True, grace=60, timeout=timeout, shutdown_timeout=0,
                     kill_timeout=5.0, poll_interval=0.2, tag="ddp")
    with sup:
        outcome = sup.wait()
    text = sup.logs["torchrun"].text()
    assert outcome.kind == "ok", f"{outcome.message}\n{text[-4000:]}"
    return text


def run_digits(n, compressor, timeout=300):
    """example/pytorch/train_digits_ddp.py under torchrun; [(accuracy, digest)] of every rank."""
    text = run_torchrun(n, os.path.join(ROOT, "example", "pytorch", "train_digits_ddp.py"),
                        ["--compressor", compressor], timeout)
    # the ranks share torchrun's stdout: a line may break where another rank's begins
    finals = re.findall(r"final test accuracy: ([0-9.]+) .*?parameter digest ([0-9a-f]{16})",
                        text, re.S)
    assert len(finals) == n, text[-4000:]
    return [(float(acc), digest) for acc, digest in finals]


def test_digits_accuracy_within_one_point_of_plain_ddp():
    plain, thc = run_digits(2, "none"), run_digits(2, "thc")
    for ranks in (plain, thc):  # every rank ends with the same parameters
        assert len({digest for _, digest in ranks}) == 1, ranks
    assert plain[0][1] != thc[0][1]  # the hook did change the gradients
    assert abs(thc[0][0] - plain[0][0]) <= 0.01, (thc, plain)
