"""Upstream's other torch APIs in the fork, without a BytePS build: the DDP wrapper
(byteps_thc.torch_ddp), CrossBarrier (byteps_thc.torch_barrier), asynchronous training and
the launcher's trace folders, against the stand-in `byteps.torch.ops` of test_torch_adapter
(it records declares and pushes; the other worker's tensor is `peer(name, tensor)`).

The expected values come from plain torch optimizers fed the gradients the stand-in's average
must produce, never from the code under test. tests/cluster/test_torch_apis.py runs the same
APIs on real clusters.
"""
import io

import pytest
import test_torch_adapter as ta
import torch

from byteps_thc import torch as bt
from byteps_thc import torch_barrier, torch_ddp, torch_waits, waits
from byteps_thc.launch import cli
from byteps_thc.torch import Compression

_model = ta._model

GRADIENTS = ["Gradient.0.bias", "Gradient.0.weight", "Gradient.2.bias", "Gradient.2.weight"]
PARAMETERS = [n.replace("Gradient.", "Parameter.") for n in GRADIENTS]


@pytest.fixture
def fake_ops(monkeypatch):
    return ta.install_fake_ops(monkeypatch)


@pytest.fixture
def report(monkeypatch):
    return ta.install_report(monkeypatch)


def _loss(model, x):
    return model(x).pow(2).mean()


# -- DistributedDataParallel ---------------------------------------------------------------------
def test_ddp_takes_the_launchers_thc_and_says_so(fake_ops, monkeypatch, report):
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    monkeypatch.setenv("BYTEPS_COMPRESSOR_SET_BY", "bpslaunch")
    torch_ddp.DistributedDataParallel(_model(), device_ids=[0], compression=Compression.none)
    declared = dict(fake_ops.declared)
    assert [n for n, _ in fake_ops.declared][:8] == GRADIENTS + PARAMETERS
    assert declared["Gradient.0.weight"] == Compression.thc().config.to_kwargs()  # 128 KiB
    assert all(declared[n] == {} for n in GRADIENTS if n != "Gradient.0.weight")
    line = report.stream.getvalue()
    assert line.startswith("byteps-thc: compressor THC bits=4 ")
    assert "chosen by bpslaunch --compressor thc" in line
    assert "4 gradient tensors: 1 compressed, 3 under BYTEPS_MIN_COMPRESS_BYTES" in line
    # the construction broadcasts the state from rank 0
    assert sorted(n for n, _, avg in fake_ops.pushed if not avg) == PARAMETERS


def test_ddp_explicit_fp16_stays(fake_ops, monkeypatch, report):
    monkeypatch.setenv("BYTEPS_COMPRESSOR", "thc")
    with pytest.warns(UserWarning, match="the script's Compression.fp16 is in force") as caught:
        torch_ddp.DistributedDataParallel(_model(), compression=Compression.fp16)
    assert caught[0].filename == __file__
    assert all(kw == {} for _, kw in fake_ops.declared)


def test_ddp_backward_returns_averaged_gradients(fake_ops):
    # the other worker: a gradient 3x ours (mean 2x ours); zeros in broadcasts (we are the root)
    fake_ops.peer = lambda name, t: 3 * t if name.startswith("Gradient.") else 0 * t
    ref = _model()
    model = torch_ddp.DistributedDataParallel(_model(), broadcast_buffers=False)
    x = torch.randn(8, 128)
    _loss(model, x).backward()
    _loss(ref, x).backward()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, 2 * q.grad, rtol=1e-6, atol=1e-7, msg=name)
    grads = [n for n, _, avg in fake_ops.pushed if avg]
    assert sorted(grads) == GRADIENTS


def test_ddp_pushes_unused_parameters_at_the_end_of_backward(fake_ops):
    model = torch_ddp.DistributedDataParallel(_model())
    model.module[0](torch.randn(2, 128)).sum().backward()  # layer 2 unused
    assert sorted(n for n, _, avg in fake_ops.pushed if avg) == GRADIENTS
    assert torch.count_nonzero(model.module[2].weight.grad) == 0


def test_ddp_no_sync_accumulates_then_averages(fake_ops):
    ref = _model()
    fake_ops.peer = lambda name, t: t if name.startswith("Gradient.") else 0 * t  # mean = ours
    model = torch_ddp.DistributedDataParallel(_model())
    x1, x2 = torch.randn(4, 128), torch.randn(4, 128)
    with model.no_sync():
        _loss(model, x1).backward()
    assert not [n for n, _, avg in fake_ops.pushed if avg]
    _loss(model, x2).backward()
    _loss(ref, x1).backward()
    _loss(ref, x2).backward()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert sorted(n for n, _, avg in fake_ops.pushed if avg) == GRADIENTS


def test_ddp_refuses_async_and_two_devices(fake_ops, monkeypatch):
    with pytest.raises(ValueError, match=r"device_ids=\[0, 1\]"):
        torch_ddp.DistributedDataParallel(_model(), device_ids=[0, 1])
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    with pytest.raises(ValueError, match="needs byteps.torch.DistributedOptimizer"):
        torch_ddp.DistributedDataParallel(_model())


# -- CrossBarrier --------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    lambda ps: torch.optim.Adam(ps, lr=1e-3),
    lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
    lambda ps: torch.optim.AdamW(ps, lr=1e-3),
], ids=["sgd", "adam", "rmsprop", "adamw"])
def test_cross_barrier_updates_as_the_optimizer_on_the_averaged_gradient(fake_ops, make):
    fake_ops.peer = lambda name, t: 3 * t  # mean: 2x ours
    steps = 3
    model, ref = _model(), _model()
    opt = torch_barrier.CrossBarrier(model, make(model.parameters()),
                                     named_parameters=model.named_parameters(), num_steps=steps)
    ref_opt = make(ref.parameters())
    torch.manual_seed(5)
    for _ in range(steps):
        x = torch.randn(8, 128)
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(ref, x).backward()
        for q in ref.parameters():
            q.grad.mul_(2)
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
    assert len([n for n, _, avg in fake_ops.pushed if avg]) == 4 * steps


def test_cross_barrier_declares_and_refuses_lbfgs(fake_ops):
    model = _model()
    torch_barrier.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(),
                               compression=Compression.thc())
    declared = dict(fake_ops.declared)
    assert declared["Gradient.0.weight"]["compressor_type"] == "thc"
    with pytest.raises(ValueError, match="LBFGS"):
        torch_barrier.CrossBarrier(model, torch.optim.LBFGS(model.parameters()))


def test_cross_barrier_raises_a_failed_push_pull_at_step(fake_ops):
    model = _model()
    opt = torch_barrier.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), num_steps=1)

    def failing(handle):
        raise RuntimeError("push_pull of Gradient.0.weight failed: a test")

    fake_ops.synchronize = failing
    _loss(model, torch.randn(2, 128)).backward()
    with pytest.raises(RuntimeError, match="a test"):
        opt.step()


# -- asynchronous training -----------------------------------------------------------------------
def test_async_step_pushes_the_change_and_takes_origin_plus_the_sum(fake_ops, monkeypatch):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    fake_ops.peer = lambda name, t: t  # the server's store: our change plus the peer's, equal
    model, ref = _model(), _model()
    opt = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    x = torch.randn(8, 128)
    _loss(model, x).backward()
    _loss(ref, x).backward()
    assert fake_ops.pushed == []  # no gradient push_pull in async mode
    opt.step()
    assert sorted(n for n, _, avg in fake_ops.pushed) == [
        n.replace("Gradient.", "AsyncParam.") for n in GRADIENTS]
    assert not any(avg for _, _, avg in fake_ops.pushed)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q - 2 * 0.1 * q.grad)


@pytest.mark.parametrize("compression,why", [
    (Compression.thc(), "THC's server adds integer table values"),
    (Compression.lhc(capacity=1000), "LHC's server adds integer table values"),
    (Compression.fp16, "keep the parameters in float16"),
    (Compression.onebit(), "without decompressing it"),
    (Compression.topk(0.01), "without decompressing it"),
])
def test_async_refuses_compressors_saying_why(fake_ops, monkeypatch, compression, why):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    model = _model()
    with pytest.raises(ValueError, match="BYTEPS_ENABLE_ASYNC=1") as e:
        bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters(),
                                compression=compression)
    assert why in str(e.value) and "Compression.none" in str(e.value)


def test_async_refusals_of_the_gradient_apis_and_unnamed_broadcasts(fake_ops, monkeypatch):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    model = _model()
    with pytest.raises(ValueError, match="CrossBarrier averages gradients"):
        torch_barrier.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="a broadcast needs named tensors"):
        bt.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert fake_ops.pushed == []


# -- the launcher's trace folders ----------------------------------------------------------------
def test_trace_dirs_one_per_rank(tmp_path):
    base = tmp_path / "traces"
    environ = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_DIR": str(base)}
    assert cli.trace_dirs(environ, range(3)) == [str(base / str(r)) for r in range(3)]
    assert sorted(p.name for p in base.iterdir()) == ["0", "1", "2"]
    assert cli.trace_dirs({"BYTEPS_TRACE_DIR": str(tmp_path / "off")}, [0]) == []
    assert not (tmp_path / "off").exists()


def test_trace_steps_that_byteps_would_abort_on_are_refused(tmp_path):
    environ = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_DIR": str(tmp_path),
               "BYTEPS_TRACE_START_STEP": "20", "BYTEPS_TRACE_END_STEP": "20"}
    with pytest.raises(ValueError, match="BYTEPS_TRACE_END_STEP=20 must be larger"):
        cli.trace_dirs(environ, [0])
    with pytest.raises(ValueError, match="BYTEPS_TRACE_ON='true' is not valid"):
        cli.trace_dirs({"BYTEPS_TRACE_ON": "true"}, [0])


# -- byteps.torch.synchronize's stall log (patch 0063) --------------------------------------------
def test_logged_waits_name_the_tensor_and_rank(monkeypatch):
    now = [0.0]
    log = waits.WaitLog(warn_s=5, out=io.StringIO(), clock=lambda: now[0])
    monkeypatch.setattr(waits, "_LOG", log)

    def synchronize(handle):  # a wait of 6 s on the log's clock
        now[0] += 6
        log.check()
        return f"output of {handle}"

    pushed = []
    push_pull, wait = torch_waits.logged_waits(
        lambda tensor, output, average, name, *rest: pushed.append(name) or 41 + len(pushed),
        synchronize, lambda: 1)
    handles = [push_pull(None, None, True, "Gradient.w"), push_pull(None, None, False, None)]
    assert [wait(h) for h in handles] == ["output of 42", "output of 43"]
    lines = log.out.getvalue().splitlines()
    assert lines[0].startswith("byteps-thc: worker 1 has waited 6 s for the push_pull of "
                               "'Gradient.w' (BYTEPS_THC_STALL_WARN=5)")
    assert "for the push_pull of 'an unnamed tensor (handle 43)'" in lines[1]
    assert len(lines) == 2
