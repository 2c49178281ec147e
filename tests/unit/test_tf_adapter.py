"""byteps_thc.tensorflow without a BytePS build: compressors, kwargs, names, the tape, the Keras 3
optimizer and model.fit against a stand-in for byteps.tensorflow.ops (push_pull = 2 x the tensor,
as two identical workers would sum).

The checks run in a subprocess (tests/unit/tf_adapter_checks.py): TensorFlow and PyTorch are not
loaded into one process, and the test process has torch. One subprocess runs them all, since
TensorFlow and Keras take tens of seconds to start here; it reports each check on its own, and each
test below is one check, failing with that check's traceback. Skipped without TensorFlow.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_adapter_checks.py")

pytestmark = pytest.mark.needs_tf


class Report:
    """What the checks' process reported: {check name: None (passed) or its traceback}."""

    def __init__(self, proc, results):
        self.proc, self.results = proc, results

    def output(self):
        return (f"exit status {self.proc.returncode}\n--- stdout\n{self.proc.stdout[-3000:]}"
                f"\n--- stderr\n{self.proc.stderr[-5000:]}")

    def check(self, name):
        if name not in self.results:
            pytest.fail(f"check {name!r} did not run (no such check, or the process died before "
                        f"it):\n{self.output()}", pytrace=False)
        if self.results[name] is not None:
            pytest.fail(f"check {name!r} failed in the TensorFlow process:\n{self.results[name]}",
                        pytrace=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf_adapter") / "report.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2")
    env.pop("BYTEPS_COMPRESSOR", None)
    proc = subprocess.run([sys.executable, CHECKS, str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    results = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            results[r["check"]] = r["error"]
    return Report(proc, results)


def test_every_check_ran_and_has_a_test(report):
    """The process ran every check to the end, and each check it ran is one test here."""
    assert report.proc.returncode == 0 and report.results, report.output()
    tests = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    assert set(report.results) <= tests, sorted(set(report.results) - tests)


# ---- compressors and kwargs ---------------------------------------------------------------------
def test_thc_kwargs_only_for_large_float_tensors(report):
    report.check("thc_kwargs_only_for_large_float_tensors")


def test_compression_from_env(report):
    report.check("compression_from_env")


def test_lhc_kwargs_and_from_env(report):
    report.check("lhc_kwargs_and_from_env")


def test_compress_casts_and_decompress_restores_dtype(report):
    report.check("compress_casts_and_decompress_restores_dtype")


# ---- names --------------------------------------------------------------------------------------
def test_variable_names_stable_and_unique(report):
    report.check("variable_names_stable_and_unique")


def test_eager_push_pull_needs_a_name(report):
    report.check("eager_push_pull_needs_a_name")


def test_push_pull_average_and_sum(report):
    report.check("push_pull_average_and_sum")


# ---- DistributedGradientTape ------------------------------------------------------------------
def test_tape_gradients_equal_plain_ones(report):
    report.check("tape_gradients_equal_plain_ones")


def test_tape_names_same_eager_and_in_tf_function(report):
    report.check("tape_names_same_eager_and_in_tf_function")


def test_tape_declares_each_gradient_once(report):
    report.check("tape_declares_each_gradient_once")


# ---- Keras 3 DistributedOptimizer ---------------------------------------------------------------
def test_optimizer_is_the_keras_optimizer(report):
    report.check("optimizer_is_the_keras_optimizer")


def test_optimizer_applies_averaged_gradients(report):
    report.check("optimizer_applies_averaged_gradients")


def test_model_fit_traces_push_pull_once(report):
    report.check("model_fit_traces_push_pull_once")


def test_legacy_optimizer_refused(report):
    report.check("legacy_optimizer_refused")


# ---- broadcast_variables ------------------------------------------------------------------------
def test_broadcast_variables_takes_roots_values(report):
    report.check("broadcast_variables_takes_roots_values")


# ---- Keras 3 learning-rate callbacks ------------------------------------------------------------
def test_warmup_callback_sets_keras3_rate_and_corrects_momentum(report):
    report.check("warmup_callback_sets_keras3_rate_and_corrects_momentum")


def test_schedule_callback_refuses_a_schedule_rate(report):
    report.check("schedule_callback_refuses_a_schedule_rate")
