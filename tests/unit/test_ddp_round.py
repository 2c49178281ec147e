"""The DDP comm hook's round (byteps_thc/ddp/hook.py, `_compressed`) on CPU and CUDA buffers,
against the NumPy reference, with two ranks in this one process.

NCCL refuses two ranks on one GPU, and a one-rank group makes the hook return the bucket as it
is, so the ranks here are two ThcHookStates (rank 0 and 1 of 2) whose rounds run in lockstep: each
rank's round runs to the collective it issued, then `Lockstep` completes that collective for both
(MAX all-reduce, all_to_all, all_gather: plain tensor copies on the buffers' device). Everything
between the collectives is the hook's own code: its codec's norm and encode, its ThcAggregator's
integer sums and its decode, on the device of the bucket.

Checked per rank and step (two steps, so the rotated error feedback carries over):
- the agreed norm M is the maximum of the reference's norms (rel 1e-6: the norm is not bit-exact
  by contract, docs/ALGORITHM.md);
- the payload equals reference.encode's with that M: bit for bit on the CPU; on CUDA
  byteps_thc.thc.cuda's rule (tests/unit/test_cuda.py): indices equal except within float
  rounding of a level boundary, off by one there, at most max(2, d / 10^5) of them;
- the gathered sums equal reference.aggregate of the payloads the ranks sent, exactly;
- the mean equals reference.decode of those sums: bit for bit on the CPU; on CUDA within
  rtol 1e-6 and bit for bit in at least 99.9% of the coordinates (test_cuda.py's rule; the
  kernels do the same float operations in the same order, so in fact all of them);
- the codec's rotated residual equals the reference's, bit for bit, where the indices matched.

The CUDA cases need a GPU (`needs_gpu`, run by scripts/gpu_check.sh); the CPU case runs here and
checks the lockstep driver and the comparisons themselves.
"""
import dataclasses
import hashlib

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_cuda import _compare_indices  # the CUDA kernels' rule for indices at a boundary

from byteps_thc.ddp import ThcHookState, default_config, hook
from byteps_thc.thc import reference

N = 2  # ranks
STEPS = 2


class _Issued:
    """What hook code got back from a collective issued with async_op=True: the driver has
    completed it before the round resumes, so waiting is a no-op."""

    def wait(self, timeout=None):
        return True


class Lockstep:
    """Collectives of N ranks that live in one process: the ranks' rounds each run to their next
    collective, then `complete` carries it out for all of them."""

    def __init__(self):
        self.issued = []

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        assert op == dist.ReduceOp.MAX and async_op
        self.issued.append(("max", tensor))
        return _Issued()

    def all_to_all_single(self, out, inp, out_splits, in_splits, group=None, async_op=False):
        assert async_op
        self.issued.append(("all_to_all", out, inp, list(out_splits), list(in_splits)))
        return _Issued()

    def all_gather(self, out, inp, group=None, async_op=False):
        assert async_op
        self.issued.append(("all_gather", out, inp))
        return _Issued()

    def complete(self):
        kinds = {c[0] for c in self.issued}
        assert len(self.issued) == N and len(kinds) == 1, [c[0] for c in self.issued]
        kind = kinds.pop()
        if kind == "max":
            top = torch.stack([c[1] for c in self.issued]).max(dim=0).values
            for c in self.issued:
                c[1].copy_(top)
        elif kind == "all_to_all":
            # rank j receives, in rank order, each rank's in_splits[j] bytes for j
            starts = [np.cumsum([0] + c[4]) for c in self.issued]
            for j, (_, out, _, out_splits, _) in enumerate(self.issued):
                pieces = [c[2][int(s[j]):int(s[j + 1])] for c, s in zip(self.issued, starts)]
                assert [p.numel() for p in pieces] == out_splits
                out.copy_(torch.cat(pieces))
        else:
            whole = torch.cat([c[2] for c in self.issued])
            for c in self.issued:
                c[1].copy_(whole)
        self.issued = []

    def run(self, rounds):
        """Drive the ranks' rounds (generators) to their ends; returns each one's result."""
        results, live = [None] * N, [True] * N
        while any(live):
            for r, gen in enumerate(rounds):
                if live[r]:
                    try:
                        gen.send(None)
                    except StopIteration as stop:
                        results[r], live[r] = stop.value, False
            if self.issued:
                assert all(live), "a rank ended while another issued a collective"
                self.complete()
        return results


def _bucket_seed(seed, key):
    """The bucket's codec seed, by the rule docs/DDP.md's geometry states (sha256 of seed:key)."""
    text = f"{seed}:" + ",".join(map(str, key))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def _states(monkeypatch, cfg):
    """ThcHookStates of rank 0 and 1 of a 2-rank group, without a process group (the hook's
    collectives are Lockstep's here)."""
    states = []
    with monkeypatch.context() as m:
        m.setattr(dist, "is_initialized", lambda: True)
        m.setattr(dist, "get_world_size", lambda group=None: N)
        for r in range(N):
            m.setattr(dist, "get_rank", lambda group=None, r=r: r)
            states.append(ThcHookState(config=cfg, min_compress_bytes=0))
    return states


CASES = [pytest.param("cpu", 300_001, 1 << 14, id="cpu-300001"),
         pytest.param("cuda", 300_001, 1 << 14, id="cuda-300001-fused",
                      marks=pytest.mark.needs_gpu),
         pytest.param("cuda", 1 << 20, 1 << 20, id="cuda-1M-passes", marks=pytest.mark.needs_gpu)]


@pytest.mark.parametrize("device, d, block", CASES)
def test_hook_round_is_the_reference(monkeypatch, device, d, block):
    exact = device == "cpu"
    dev = torch.device(device)
    # the hook's own default for the device: a scale per rotation block (block_scale) on CPU
    # and CUDA buffers alike
    cfg = dataclasses.replace(default_config(N, device), rotation_block=block)
    assert cfg.block_scale
    states = _states(monkeypatch, cfg)
    sizes = (d - 1000, 1000)  # two parameters in the bucket
    params = [[torch.empty(s, device=dev) for s in sizes] for _ in range(N)]
    keys = [s.bucket_key(p) for s, p in zip(states, params)]
    assert keys == [(0, 1)] * N
    lays = [s.layout(k, p, d, dev) for s, k, p in zip(states, keys, params)]
    # the reference's configuration, from the rules: the requested block, the key's seed
    c = dataclasses.replace(cfg, rotation_block=block, seed=_bucket_seed(cfg.seed, keys[0]))
    assert lays[0].cfg == c
    for s in states:
        s.trace = []

    lock = Lockstep()
    monkeypatch.setattr(dist, "all_reduce", lock.all_reduce)
    monkeypatch.setattr(dist, "all_to_all_single", lock.all_to_all_single)
    monkeypatch.setattr(hook, "_all_gather", lock.all_gather)

    rng = np.random.default_rng(d)
    res = [reference.initial_residual(c, d) for _ in range(N)]
    for step in range(STEPS):
        # the ranks' gradients differ in scale, so that M is one rank's norm
        grads = [(rng.standard_normal(d) * (1.0 + r)).astype(np.float32) for r in range(N)]
        bufs = [torch.from_numpy(g.copy()).to(dev) for g in grads]
        means = lock.run([hook._compressed(s, lay, b) for s, lay, b in zip(states, lays, bufs)])
        ms = [np.atleast_1d(np.asarray(s.trace[-1][1], dtype=np.float64)) for s in states]
        assert np.array_equal(ms[0], ms[1])
        local = reference.block_norms if c.block_scale else reference.norm
        want_m = np.max([np.atleast_1d(local(g, rr, c)) for g, rr in zip(grads, res)], axis=0)
        np.testing.assert_allclose(ms[0], want_m, rtol=1e-6)
        m = ms[0] if c.block_scale else float(ms[0][0])
        payloads = []
        for r in range(N):
            want_p, want_res, want_q = reference.encode(c, grads[r], m, r, step, res[r])
            got_p = lays[r].exchange.payload.cpu().numpy().copy()
            if exact:
                assert np.array_equal(got_p, want_p), f"rank {r} step {step}: payloads differ"
                bad = 0
            else:
                bad = _compare_indices(c, got_p, want_q, grads[r], res[r], m, r, step)
            payloads.append(got_p)
            got_res = lays[r].codec.residual
            if bad == 0:  # y - dequant(q): the same float operations, bit for bit
                assert np.array_equal(got_res.view(np.uint32), want_res.view(np.uint32))
            res[r] = got_res  # the next step continues from what the rank holds
        sums = reference.aggregate(c, payloads, d, N)
        for lay in lays:
            lanes = lay.lanes.cpu().numpy() if isinstance(lay.lanes, torch.Tensor) else lay.lanes
            assert np.array_equal(lanes.astype(np.uint64), sums.astype(np.uint64))
        want = reference.decode(c, sums, d, N, m)
        for r, mean in enumerate(means):
            assert mean.device.type == device and mean.shape == (d,)
            got = mean.cpu().numpy()
            if exact:
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), r
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * np.max(m))
                same = np.count_nonzero(got.view(np.uint32) == want.view(np.uint32))
                assert same >= 0.999 * d, f"rank {r}: {d - same} of {d} coordinates differ"
        # every rank decodes the same sums: the same bits
        assert torch.equal(means[0].cpu(), means[1].cpu())
        for s in states:
            assert s.step_of(keys[0]) == step + 1
    assert all(s.stats["buckets_compressed"] == STEPS for s in states)
