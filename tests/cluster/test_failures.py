"""Failures reach the training script as exceptions, and non-finite gradients behave as they do
uncompressed, on real `bpslaunch --local 2` clusters (tests/cluster/scripts/torch_failures.py and
tf_failures.py are the workers):

- a tensor declared with compressor kwargs that name no registered compressor (a misspelt type,
  a key without its prefix): the declare and its push_pulls raise RuntimeError naming the kwargs
  and the registered compressors; the server stays up and training goes on;
- workers that declare THC with different `bits`: optimizer.step() raises RuntimeError (torch),
  push_pull and model.fit raise InternalError (TF); the script catches it and exits 0, and the
  message names the refusal and both settings;
- torch.amp.GradScaler with one inf gradient on one worker at step k: both workers see inf in
  that step's averaged gradients, both skip it, the scale halves on both and training goes on;
  both end bit-identical, and bit-identical to a run in which step k never happened (same data,
  the halved scale from k on): the skipped step left no trace in THC's error-feedback state or
  step counter;
- BYTEPS_THC_NONFINITE=error: the NaN raises on both workers, the worker that had it names itself;
- fail_cluster() with push_pulls pending (in the pipeline, and a new tensor's first push): they
  raise with the reason, and so does every later one; the workers then exit without waiting for
  each other;
- the server's replies that come after such a failure write nothing into the tensors the script
  got back with the error (a THC-compressed weight and uncompressed biases alike).
"""
import json
import os
import sys

import pytest

from test_launch_local import ROOT, bpslaunch, pytestmark  # noqa: F401

SCRIPTS = os.path.join(ROOT, "tests", "cluster", "scripts")


def run(tmp_path, script, *script_args, env=None, timeout=200):
    e = dict(os.environ, **(env or {}))
    code, out, err, _ = bpslaunch(
        ["--local", "2", "--timeout", str(timeout - 20), "--", sys.executable,
         os.path.join(SCRIPTS, script), *script_args, str(tmp_path)], timeout=timeout, env=e)
    return code, out + err


def texts(tmp_path, name):
    return [(tmp_path / f"{name}_{r}.txt").read_text() for r in (0, 1)]


def torch_run(tmp_path, mode, *extra, env=None):
    # torch_failures.py takes MODE OUT_DIR [options]: the options go after OUT_DIR
    e = dict(os.environ, **(env or {}))
    code, out, err, _ = bpslaunch(
        ["--local", "2", "--timeout", "180", "--", sys.executable,
         os.path.join(SCRIPTS, "torch_failures.py"), mode, str(tmp_path), *extra],
        timeout=200, env=e)
    return code, out + err


def test_torch_mismatched_bits_raise_runtime_error(tmp_path):
    code, log = torch_run(tmp_path, "mismatch")
    assert code == 0, log[-4000:]
    for text in texts(tmp_path, "error"):
        assert text.startswith("RuntimeError: "), text
        assert "registration refused" in text and "THC settings differ between workers" in text
        assert "bits=3" in text and "bits=4" in text, text
        assert "Gradient.0.weight" in text and "same THC or LHC settings" in text, text
    assert "Check failed" not in log and "SIGABRT" not in log


def test_torch_unknown_compressor_raises_and_the_cluster_lives(tmp_path):
    code, log = torch_run(tmp_path, "bad-kwargs")
    assert code == 0, log[-4000:]
    for r in (0, 1):
        for what in ("declare", "pushpull"):
            typo = (tmp_path / f"{what}-typo_{r}.txt").read_text()
            assert typo.startswith("RuntimeError: BytePS tensor 'byteps.typo': "), typo
            assert "compressor_type=thx is not one of " in typo, typo
            known = typo.split("is not one of ")[1].split(".")[0].split(", ")
            assert {"thc", "lhc", "onebit", "topk"} <= set(known), typo
            bare = (tmp_path / f"{what}-noprefix_{r}.txt").read_text()
            assert bare.startswith("RuntimeError: BytePS tensor 'byteps.noprefix': "), bare
            assert "{thc_bits=4, type=thc}" in bare and "compressor_type is missing" in bare, bare
            assert "byteps_compressor_type" in bare, bare
        # 1 + 2 from the two workers: the cluster and its server lived on
        assert (tmp_path / f"alive_{r}.txt").read_text() == "3.0"
    assert "Check failed" not in log and "SIGABRT" not in log and "No compressor" not in log


@pytest.mark.needs_tf
@pytest.mark.needs_fork("server", "tensorflow")
def test_tf_mismatched_bits_raise_in_eager_and_fit(tmp_path):
    code, log = run(tmp_path, "tf_failures.py", timeout=300)
    assert code == 0, log[-4000:]
    for style in ("eager", "fit"):
        for text in texts(tmp_path, style):
            assert text.startswith(("InternalError: ", "InvalidArgumentError: ")), text
            assert "registration refused" in text and "bits=3" in text and "bits=4" in text, text
    for style in ("badkwargs-declare", "badkwargs-pushpull"):
        for text in texts(tmp_path, style):
            assert text.startswith("InvalidArgumentError: BytePS tensor 'badkw': "), text
            assert "compressor_type=thx is not one of " in text and "thc" in text, text
    assert "after [2.0, 2.0, 2.0, 2.0]" in log, log[-3000:]


@pytest.fixture(scope="module")
def amp_runs(tmp_path_factory):
    k = 2
    runs = {}
    for name, extra in (("inject", ["--inject-step", str(k)]), ("never", ["--skip-step", str(k)]),
                        ("plain", [])):
        d = tmp_path_factory.mktemp(name)
        code, log = torch_run(d, "amp", "--steps", "6", *extra)
        assert code == 0, log[-4000:]
        runs[name] = ([json.loads((d / f"amp_{r}.json").read_text()) for r in (0, 1)], log)
    return k, runs


def test_amp_inf_step_is_skipped_on_both_workers(amp_runs):
    k, runs = amp_runs
    reports, log = runs["inject"]
    for r in reports:
        assert r["inf_at"] == [k], r                    # inf in the averaged gradients, step k only
        assert r["weight_grad_all_inf"], r             # the THC partition's result is +inf
        assert r["skipped_by_scaler"] == [k], r         # GradScaler skipped it, and only it
        s = 2.0 ** 12
        assert r["scales"] == [s] * k + [s / 2] * (6 - k), r  # halved at k, on both workers
    assert reports[0]["digest"] == reports[1]["digest"]
    assert "the agreed norm is +inf" in log and "Skipped steps of this key: 1." in log


def test_amp_skipped_step_leaves_no_trace(amp_runs):
    _, runs = amp_runs
    inject, never, plain = (runs[n][0] for n in ("inject", "never", "plain"))
    assert never[0]["digest"] == never[1]["digest"]
    assert inject[0]["digest"] == never[0]["digest"]
    # the comparison can fail: a run that does take step k ends elsewhere
    assert plain[0]["digest"] != never[0]["digest"]
    assert plain[0]["inf_at"] == [] and plain[0]["skipped_by_scaler"] == []


def test_nonfinite_error_mode_raises_naming_the_worker(tmp_path):
    code, log = torch_run(tmp_path, "nonfinite-error", env={"BYTEPS_THC_NONFINITE": "error"})
    assert code == 0, log[-4000:]
    t0, t1 = texts(tmp_path, "error")
    for text in (t0, t1):
        assert text.startswith("RuntimeError: ") and "Gradient.0.weight" in text, text
        assert "BYTEPS_THC_NONFINITE" in text, text
    assert "rank 1" in t1 and "this worker's gradient has NaN" in t1, t1
    assert "is nan" in t0 and "must be finite" in t0, t0  # the server's words: node, value


def test_fail_cluster_fails_pending_and_later_push_pulls(tmp_path):
    code, log = torch_run(tmp_path, "fail-cluster")
    assert code == 0, log[-4000:]
    for name in ("pending", "fresh"):  # in the pipeline; in a new tensor's first push
        text = (tmp_path / f"{name}_0.txt").read_text()
        assert text.startswith("RuntimeError: ") and "node 1 declared dead" in text, text
    for r, peer in ((0, 1), (1, 0)):
        later = (tmp_path / f"later_{r}.txt").read_text()
        assert f"node {peer} declared dead" in later and "the cluster has failed" in later, later
        assert (tmp_path / f"reason_{r}.txt").read_text() == f"test: node {peer} declared dead"


def test_replies_after_fail_cluster_write_nothing(tmp_path):
    code, log = torch_run(tmp_path, "late-reply")
    assert code == 0, log[-4000:]
    text = (tmp_path / "pending_0.txt").read_text()
    assert text.startswith("RuntimeError: ") and "test: late replies" in text, text
    late = json.loads((tmp_path / "late_0.txt").read_text())
    assert set(late) == {"0.weight", "0.bias", "2.weight", "2.bias"}, late
    assert all(values == [7.0] for values in late.values()), late
