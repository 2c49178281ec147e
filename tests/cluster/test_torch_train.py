"""PyTorch training through the real BytePS pipeline on `bpslaunch --local 2` clusters.

- the digits example trains with THC to within 2 points of uncompressed, and after training both
  workers' parameters are bit-identical (THC and none);
- fp32, fp16 and bf16 gradients go through DistributedOptimizer with THC (and broadcasts);
- BYTEPS_THC_CODEC_THREADS=2 trains to the same parameters, bit for bit, as one codec thread.

Skipped when the BytePS fork is not installed (`make byteps`).
"""
import json
import os
import re
import sys

import pytest

from test_launch_local import ROOT, bpslaunch, pytestmark, worker_script  # noqa: F401

EXAMPLE = os.path.join(ROOT, "example", "pytorch", "train_digits.py")
EPOCHS = "3"


def _train(compressor, tmp_path, env=None):
    stats = tmp_path / f"{compressor}.json"
    code, out, err, took = bpslaunch(
        ["--local", "2", "--compressor", compressor, "--timeout", "400", "--", sys.executable,
         EXAMPLE, "--epochs", EPOCHS, "--stats-json", str(stats)], timeout=450, env=env)
    assert code == 0, out[-3000:] + err[-3000:]
    digests = re.findall(r"\[worker (\d)\] final test accuracy: ([0-9.]+) .*parameter digest (\w+)",
                         out)
    assert len(digests) == 2, out[-2000:]
    return json.loads(stats.read_text()), digests, out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    return {c: _train(c, tmp) for c in ("thc", "none")}


def test_thc_accuracy_within_two_points_of_uncompressed(trained):
    thc, none = trained["thc"][0], trained["none"][0]
    assert none["accuracy"] > 0.9, none
    assert thc["accuracy"] >= none["accuracy"] - 0.02, (thc, none)


@pytest.mark.parametrize("compressor", ["thc", "none"])
def test_workers_end_bit_identical(trained, compressor):
    (_, acc0, d0), (_, acc1, d1) = sorted(trained[compressor][1])
    assert d0 == d1 and acc0 == acc1


def test_codec_threads_train_to_the_same_bits(trained, tmp_path):
    """The digits MLP's 512 x 512 layer is one partition of one 2^18 rotation block: with two
    codec threads each worker splits that block's transform (encode, norm and decode). The
    server's sums are integers, so the run repeats the one-thread run's parameters exactly."""
    env = dict(os.environ, BYTEPS_THC_CODEC_THREADS="2")
    _, digests, _ = _train("thc", tmp_path, env)
    assert sorted(digests) == sorted(trained["thc"][1])


def test_thc_sends_fewer_bytes(trained):
    thc, none = trained["thc"][0], trained["none"][0]
    if not thc["bytes_per_step"] or not none["bytes_per_step"]:
        pytest.skip("no loopback counters")
    # measured on the shared loopback (other tests may add traffic): a loose bound here,
    # the precise figure comes from `make demo` in its own network namespace
    assert thc["bytes_per_step"] < 0.6 * none["bytes_per_step"], (thc, none)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtypes_through_thc(tmp_path, dtype):
    script = worker_script(tmp_path, f"""
        import hashlib
        dtype = torch.{dtype}
        torch.manual_seed(rank)                        # different on purpose: broadcast fixes it
        model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10)).to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # Adam: NaN in fp16
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=bps.Compression.thc())
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.broadcast_optimizer_state(opt, root_rank=0)
        g = torch.Generator().manual_seed(100 + rank)
        losses = []
        x = torch.randn(64, 64, generator=g).to(dtype)
        y = torch.randint(0, 10, (64,), generator=g)
        for step in range(6):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        for p in model.parameters():
            assert p.dtype == dtype and p.grad.dtype == dtype and torch.isfinite(p).all()
        h = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes()
                                    for p in model.parameters())).hexdigest()[:16]
        print("digest", h, "loss", losses[0], losses[-1], flush=True)
    """)
    code, out, err, _ = bpslaunch(["--local", "2", "--timeout", "200", "--",
                                   sys.executable, script])
    assert code == 0, out[-3000:] + err[-3000:]
    found = re.findall(r"\[worker (\d)\] digest (\w+) loss ([0-9.e-]+) ([0-9.e-]+)", out)
    assert len(found) == 2, out[-2000:]
    assert found[0][1] == found[1][1], "workers diverged"
    for _, _, first, last in found:
        assert float(last) < float(first)


def test_vanilla_error_feedback_gets_the_learning_rate(tmp_path):
    """BytePS's vanilla EF mmaps ./lr.s; upstream only MXNet wrote it, and a torch worker aborted
    ("open lr.s failed"). DistributedOptimizer writes it now (in the workers' directory)."""
    import struct
    code, out, err, _ = bpslaunch(
        ["--local", "2", "--compressor", "onebit", "--compressor-ef", "vanilla", "--timeout",
         "300", "--", sys.executable, EXAMPLE, "--epochs", "2", "--lr", "0.04"],
        timeout=360, cwd=str(tmp_path))
    assert code == 0, out[-3000:] + err[-3000:]
    assert "lr.s failed" not in out + err
    digests = re.findall(r"\[worker (\d)\] final test accuracy: ([0-9.]+) .*parameter digest (\w+)",
                         out)
    assert len(digests) == 2 and digests[0][2] == digests[1][2], out[-2000:]
    assert struct.unpack("d", (tmp_path / "lr.s").read_bytes()[:8])[0] == 0.04
