"""byteps_thc.torch without a BytePS build: compression objects, and the optimizer/broadcast glue
against a stand-in `byteps.torch.ops` that records what would reach BytePS.

The real pipeline is exercised by tests/cluster/test_torch_*.py.
"""
import io
import itertools
import sys
import types

import pytest
import torch

from byteps_thc import ThcConfig
from byteps_thc import compression as bc
from byteps_thc import torch as bt
from byteps_thc import torch_broadcast as bb
from byteps_thc.torch import Compression


# -- compression objects -------------------------------------------------------------------------
def test_thc_carries_its_config_and_kwargs():
    c = Compression.thc(bits=3, granularity=16, seed=5)
    assert c.config == ThcConfig(bits=3, granularity=16, seed=5)
    big = torch.zeros(1 << 15)  # 128 KiB of float32
    assert c.kwargs(big, {}) == c.config.to_kwargs()
    assert c.kwargs(big, {})["compressor_type"] == "thc"
    assert Compression.thc(config=c.config) == c
    assert "bits=3" in repr(c)


def test_thc_validates_at_once():
    with pytest.raises(ValueError):
        Compression.thc(bits=4, granularity=7)


def test_small_tensors_go_uncompressed():
    c = Compression.thc()
    assert c.kwargs(torch.zeros(16383), {}) is None           # 65532 bytes
    assert c.kwargs(torch.zeros(16384), {}) is not None       # 65536 bytes
    assert c.kwargs(torch.zeros(100), {"BYTEPS_MIN_COMPRESS_BYTES": "64"}) is not None
    # sizes count as float32, whatever the gradient's dtype
    assert c.kwargs(torch.zeros(16384, dtype=torch.bfloat16), {}) is not None
    assert c.kwargs(torch.zeros(1 << 20, dtype=torch.int64), {}) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_registry_compressors_push_float32_and_restore_the_dtype(dtype):
    c = Compression.thc()
    g = torch.randn(10).to(dtype)
    wire, ctx = c.compress(g)
    assert wire.dtype == torch.float32
    assert c.decompress(wire, ctx).dtype == dtype
    assert torch.equal(c.decompress(wire, ctx), g)


def test_none_and_fp16():
    g = torch.randn(10)
    assert Compression.none.compress(g)[0] is g
    b = g.to(torch.bfloat16)
    wire, ctx = Compression.none.compress(b)  # BytePS has no bfloat16: exact float32 copy
    assert wire.dtype == torch.float32 and torch.equal(Compression.none.decompress(wire, ctx), b)
    wire, ctx = Compression.fp16.compress(g)
    assert wire.dtype == torch.float16 and Compression.fp16.decompress(wire, ctx).dtype == g.dtype
    assert Compression.none.kwargs(torch.zeros(1 << 20)) is None
    assert Compression.fp16.kwargs(torch.zeros(1 << 20)) is None


def test_from_env():
    assert Compression.from_env({}) is Compression.none
    assert Compression.from_env({"BYTEPS_COMPRESSOR": "fp16"}) is Compression.fp16
    c = Compression.from_env({"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3",
                              "BYTEPS_THC_GRANULARITY": "16", "BYTEPS_THC_SEED": "9"})
    assert c.config == ThcConfig(bits=3, granularity=16, seed=9)
    t = Compression.from_env({"BYTEPS_COMPRESSOR": "topk", "BYTEPS_COMPRESSOR_K": "0.01",
                              "BYTEPS_COMPRESSOR_EF": "vanilla"})
    assert t.kwargs(torch.zeros(1 << 20), {}) == {"compressor_type": "topk",
                                                  "compressor_k": "0.01", "ef_type": "vanilla"}
    with pytest.raises(ValueError, match="BYTEPS_COMPRESSOR_K"):
        Compression.from_env({"BYTEPS_COMPRESSOR": "randomk"})
    with pytest.raises(ValueError, match="zip"):
        Compression.from_env({"BYTEPS_COMPRESSOR": "zip"})


def test_launcher_and_adapter_agree():
    from byteps_thc import launch
    ns = launch.parse_args(["--compressor", "thc", "--thc-bits", "2", "--thc-granularity", "6",
                            "--", "true"])
    c = Compression.from_env(launch.compression_env(ns, {}))
    assert c.config == ThcConfig(bits=2, granularity=6)


def test_numbers_round_trip():
    for v in (0.1, 3, True, (0.9, 0.999), [1, (2.5, False)]):
        flat = bb._numbers(v)
        assert bb._rebuild(v, flat) == v and type(bb._rebuild(v, flat)) is type(v)
    assert bb._numbers(None) is None and bb._numbers("x") is None and bb._numbers(()) is None


# -- glue against a stand-in BytePS ----------------------------------------------------------------
class FakeOps(types.ModuleType):
    """Two workers; the other one pushes `peer(name, tensor)`; records declares and pushes."""

    def __init__(self, rank=0, size=2):
        super().__init__("byteps.torch.ops")
        self._rank, self._size = rank, size
        self.declared = []      # (name, kwargs)
        self.pushed = []        # (name, dtype, average)
        self.peer = lambda name, t: t.clone()  # default: the other worker sends the same
        self._handles = {}
        self._ids = itertools.count(1)

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def declare(self, name, **kwargs):
        self.declared.append((name, dict(kwargs)))
        return 0

    def push_pull_async_inplace(self, tensor, average=True, name=None, version=0, priority=0):
        self.pushed.append((name, tensor.dtype, average))
        total = tensor + self.peer(name, tensor)
        tensor.copy_(total / self._size if average else total)
        h = next(self._ids)  # distinct while others are waited for (CrossBarrier's thread)
        self._handles[h] = tensor
        return h

    def synchronize(self, handle):
        return self._handles.pop(handle)


@pytest.fixture
def fake_ops(monkeypatch):
    return install_fake_ops(monkeypatch)


def install_fake_ops(monkeypatch) -> FakeOps:
    """A FakeOps as `byteps.torch.ops` for the test (test_torch_wrappers.py uses it too)."""
    ops = FakeOps()
    byteps = types.ModuleType("byteps")
    btorch = types.ModuleType("byteps.torch")
    btorch.ops = ops
    byteps.torch = btorch
    monkeypatch.setitem(sys.modules, "byteps", byteps)
    monkeypatch.setitem(sys.modules, "byteps.torch", btorch)
    monkeypatch.setitem(sys.modules, "byteps.torch.ops", ops)
    return ops


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 4)).to(dtype)


def test_optimizer_declares_gradients_with_kwargs_then_parameters(fake_ops):
    model = _model()
    thc = Compression.thc()
    bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                            named_parameters=model.named_parameters(), compression=thc)
    names = [n for n, _ in fake_ops.declared]
    assert names == ["Gradient.0.bias", "Gradient.0.weight", "Gradient.2.bias", "Gradient.2.weight",
                     "Parameter.0.bias", "Parameter.0.weight", "Parameter.2.bias",
                     "Parameter.2.weight"]
    kw = dict(fake_ops.declared)
    # only 0.weight (128x256 float32 = 128 KiB) is large enough to compress
    assert kw["Gradient.0.weight"] == thc.config.to_kwargs()
    assert all(kw[n] == {} for n in names if n != "Gradient.0.weight")


def test_optimizer_uses_the_launcher_choice_by_default(fake_ops, monkeypatch):
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    monkeypatch.setenv("BYTEPS_THC_SEED", "77")
    model = _model()
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    assert opt._compression.config.seed == 77
    assert dict(fake_ops.declared)["Gradient.0.weight"]["thc_seed"] == "77"


@pytest.fixture
def report(monkeypatch):
    return install_report(monkeypatch)


def install_report(monkeypatch) -> bc.RunReport:
    """A fresh byteps_thc.compression report (the process's says each thing once per process)."""
    r = bc.RunReport(at_exit=False, stream=io.StringIO())
    monkeypatch.setattr(bc, "announce", r.announce)
    monkeypatch.setattr(bc, "warn_conflict", r.warn_conflict)
    return r


@pytest.mark.parametrize("none", [Compression.none, bt.NoneCompressor])
def test_explicit_none_takes_the_launchers_thc(fake_ops, monkeypatch, report, none, recwarn):
    """Upstream's scripts pass compression=Compression.none (an instance, or upstream's class)."""
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    monkeypatch.setenv("BYTEPS_THC_SEED", "77")
    model = _model()
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), compression=none)
    assert opt._compression == Compression.thc(seed=77)
    assert dict(fake_ops.declared)["Gradient.0.weight"]["compressor_type"] == "thc"
    assert len(recwarn) == 0
    line = report.stream.getvalue()
    # 0.weight is 128x256 float32 (128 KiB); 0.bias, 2.weight (4x256) and 2.bias are small
    assert line.count("\n") == 1 and line.startswith("byteps-thc: compressor THC bits=4 ")
    assert "seed=77" in line and "chosen by the environment (BYTEPS_COMPRESSOR=thc)" in line
    assert "4 gradient tensors: 1 compressed, 3 under BYTEPS_MIN_COMPRESS_BYTES=65536" in line


def test_explicit_fp16_stays_with_one_warning(fake_ops, monkeypatch, report):
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    monkeypatch.setenv("BYTEPS_COMPRESSOR_SET_BY", "bpslaunch")
    model = _model()
    with pytest.warns(UserWarning) as caught:
        for _ in range(2):  # a second optimizer: the same warning is not repeated
            opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          named_parameters=model.named_parameters(),
                                          compression=Compression.fp16)
    assert opt._compression is Compression.fp16
    assert all(kw == {} for _, kw in fake_ops.declared)
    [w] = caught
    assert "the script chose Compression.fp16, bpslaunch --compressor thc chose " \
           "Compression.thc(" in str(w.message)
    assert "the script's Compression.fp16 is in force" in str(w.message)
    assert w.filename == __file__  # points at the script's call
    assert report.stream.getvalue() == ("byteps-thc: compressor Compression.fp16; chosen by "
                                        "script; 4 gradient tensors\n")


def test_rank_1_says_nothing(fake_ops, monkeypatch, report, recwarn):
    fake_ops._rank = 1
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    model = _model()
    bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                            named_parameters=model.named_parameters(),
                            compression=Compression.fp16)
    assert report.stream.getvalue() == "" and len(recwarn) == 0


@pytest.mark.parametrize("value,on", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_async_training_uncompressed_is_taken(fake_ops, monkeypatch, value, on):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", value)
    model = _model()
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    assert opt._enable_async is on
    async_names = [n for n, _ in fake_ops.declared if n.startswith("AsyncParam.")]
    assert async_names == (["AsyncParam.0.bias", "AsyncParam.0.weight", "AsyncParam.2.bias",
                            "AsyncParam.2.weight"] if on else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_training_step_averages_and_keeps_dtypes(fake_ops, dtype):
    model = _model(dtype)
    ref = _model(dtype)
    # the other worker's gradient is twice ours: the average is 1.5x ours
    fake_ops.peer = lambda name, t: 2 * t
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(),
                                  compression=Compression.thc())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.15)
    x = torch.randn(8, 128).to(dtype)
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).float().pow(2).mean().backward()
    assert len(fake_ops.pushed) == 4  # the hooks pushed during backward, before step()
    assert all(d == torch.float32 for _, d, _ in fake_ops.pushed)  # THC pushes float32
    opt.step()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.dtype == dtype and p.grad.dtype == dtype
        tol = 1e-6 if dtype == torch.float32 else 2e-2
        assert torch.allclose(p.float(), q.float(), atol=tol), (p - q).abs().max()


def test_unused_parameters_are_pushed_too(fake_ops):
    model = _model()
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    model[0](torch.randn(2, 128)).sum().backward()  # layer 2 unused
    opt.step()
    assert sorted(n for n, _, _ in fake_ops.pushed) == [
        "Gradient.0.bias", "Gradient.0.weight", "Gradient.2.bias", "Gradient.2.weight"]


def test_bad_named_parameters(fake_ops):
    model = _model()
    with pytest.raises(ValueError, match="duplicates"):
        bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=[("a", p) for p in model.parameters()])


@pytest.mark.parametrize("rank", [0, 1])
def test_broadcasts(fake_ops, rank):
    fake_ops._rank = rank
    root_values = {}

    def peer(name, t):  # the root's tensor, or zeros if we are the root
        return torch.zeros_like(t) if rank == 0 else root_values[name].to(t.dtype).reshape(t.shape)

    fake_ops.peer = peer
    model = _model(torch.bfloat16)
    for n, p in model.state_dict().items():
        root_values["Parameter." + n] = torch.full(p.shape, 0.5)
    bt.broadcast_parameters(model.state_dict(), root_rank=0)
    for n, p in model.state_dict().items():
        expect = p if rank == 0 else torch.full(p.shape, 0.5, dtype=torch.bfloat16)
        assert torch.equal(p, expect)

    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    fake_ops.peer = lambda name, t: torch.zeros_like(t) if rank == 0 else torch.ones_like(t) * 0.25
    bt.broadcast_optimizer_state(opt, root_rank=0)
    g = opt.param_groups[0]
    if rank == 0:
        assert g["lr"] == 0.01 and g["betas"] == (0.8, 0.9)
    else:
        assert g["lr"] == 0.25 and g["betas"] == (0.25, 0.25)
        assert isinstance(g["betas"], tuple) and isinstance(g["amsgrad"], bool)
    state = opt.state[next(iter(model.parameters()))]
    assert "exp_avg" in state
