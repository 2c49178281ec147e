"""The advisor's calibration cluster (byteps_thc.stackcost) on the real stack: bpslaunch --local 2.

Skipped when the BytePS fork or torch is not installed. A few seconds of a 2-core host.
"""
import pytest

from byteps_thc import advise, stackcost

pytestmark = pytest.mark.needs_fork


# CPU times come from /proc in clock ticks (10 ms): the runs are sized so that the server, the
# least busy role, spends several ticks (3 steps of two 4 MB top-k tensors once measured 0.0).


def test_a_calibration_run_measures_every_role():
    tensors = [1024000] * 4 + [16000]
    res = stackcost.measure("none", tensors, steps=8, warmup=1, timeout_s=180)
    elems = sum(tensors)
    assert (res.up_bytes, res.down_bytes) == (4 * elems, 4 * elems)
    assert res.payload_bytes == 2 * 8 * elems
    assert res.step_s > 0
    # every byte is copied and sent or received by someone: at least the workers' two copies
    # (advise's `copy`, a fraction of a nanosecond per float) and some CPU on the server
    assert res.worker_cpu_s > 0.1e-9 * res.payload_bytes
    assert res.server_cpu_s > 0
    assert 0 <= res.other_cpu_s < res.worker_cpu_s + res.server_cpu_s


def test_a_compressed_calibration_run():
    res = stackcost.measure("topk-0.01+ef", [1024000] * 4, steps=8, warmup=1, timeout_s=180)
    up, down = advise.wire_bytes(advise.parse_spec("topk-0.01+ef"), 1024000, True, 2)
    assert (res.up_bytes, res.down_bytes) == (4 * up, 4 * down)
    assert res.worker_cpu_s > 0 and res.server_cpu_s > 0
