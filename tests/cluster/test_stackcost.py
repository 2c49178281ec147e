"""The advisor's calibration cluster (byteps_thc.advisor.calibrate) on the real stack:
bpslaunch --local 2.

Skipped when the BytePS fork or torch is not installed. A few seconds of a 2-core host.
"""
import os

import pytest

from byteps_thc.advisor import calibrate

pytestmark = pytest.mark.needs_fork


# CPU times come from /proc in clock ticks (10 ms): the runs are sized so that the server, the
# least busy role, spends several ticks (3 steps of two 4 MB top-k tensors once measured 0.0).
TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_within_host_busy(res):
    """The cluster's CPU (the workers' own os.times, the server's and the others' /proc/<pid>
    samples) is part of the host's non-idle time (/proc/stat) over the same window, so it cannot
    exceed it, whatever else runs on the host. A units or double-counting error in either path
    (e.g. a process counted under two roles, ticks taken for seconds) breaks that. Slack: /proc/stat
    samples a tick's whole CPU state (10% of the busy time for its sampling error), every process's
    utime and stime are whole ticks (2 per process at each end, up to 8 processes), and both ends
    are interpolated between 0.2-0.3 s samples (at most a quarter interval of every core's time,
    0.1 s per core, at each end)."""
    cores = len(os.sched_getaffinity(0))
    slack = 2 * 8 * 2 * TICK + 2 * 0.1 * cores
    cluster, busy = res.cluster_cpu_s * res.steps, res.host_busy_s * res.steps
    assert 0 < cluster <= 1.1 * busy + slack, (cluster, busy, slack)


def _workers_own_cpu_matches_the_samples(res):
    """The workers' CPU two ways: their own os.times over their windows, and this process's
    /proc/<pid>/stat samples of the processes with DMLC_ROLE=worker, interpolated to the window
    (the path the server's and the others' figures take). They must agree: a process missed or
    counted twice, a role mixed up or ticks taken for seconds would part them. Bound: 10% (the
    ends interpolated between 0.2-0.3 s samples) plus 16 clock ticks (utime and stime of two
    workers, in whole ticks, at both ends, each way)."""
    own, sampled = res.worker_cpu_s * res.steps, res.worker_cpu_sampled_s * res.steps
    assert abs(sampled - own) <= 0.1 * own + 16 * TICK, (own, sampled)


def test_a_calibration_run_measures_every_role():
    tensors = [1024000] * 4 + [16000]
    res = calibrate.measure("none", tensors, steps=8, warmup=1, timeout_s=180)
    elems = sum(tensors)
    assert (res.up_bytes, res.down_bytes) == (4 * elems, 4 * elems)
    assert res.payload_bytes == 2 * 8 * elems
    assert res.step_s > 0
    # every byte is copied and sent or received by someone: at least the workers' two copies
    # (the advisor's `copy`, a fraction of a nanosecond per float) and some CPU on the server
    assert res.worker_cpu_s > 0.1e-9 * res.payload_bytes
    assert res.server_cpu_s > 0
    assert 0 <= res.other_cpu_s < res.worker_cpu_s + res.server_cpu_s
    _cpu_within_host_busy(res)
    _workers_own_cpu_matches_the_samples(res)


def test_a_compressed_calibration_run():
    res = calibrate.measure("topk-0.01+ef", [1024000] * 4, steps=8, warmup=1, timeout_s=180)
    # top-k at 1%: k = 10240 of each partition's 1024000 floats, (int32 index, float32 value)
    # pairs each way (the server sends the top-k of the sum), 4 partitions
    pairs = 4 * 1024000 // 100
    assert (res.up_bytes, res.down_bytes) == (8 * pairs, 8 * pairs)
    assert res.worker_cpu_s > 0 and res.server_cpu_s > 0
    _cpu_within_host_busy(res)
    _workers_own_cpu_matches_the_samples(res)
