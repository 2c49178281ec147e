"""The three upstream BytePS bugs our patch series fixes, one focused test each.

Each test passes on our build and fails on a build of the series without that one patch
(`make test-upstream-bugs` builds those three variants with `scripts/build_byteps.sh --without
NNNN --target DIR` and runs each test there through BYTEPS_THC_FORK_DIR):

- 0005 (torch plugin): `wait_and_clear` held the GIL while it waited; with torch 2.x a BytePS
  thread that drops the last C++ reference to a tensor Python has let go needs the GIL
  (TensorImpl::decref_pyobject), and every later push_pull waits on that thread: a deadlock,
  usually at the second push_pull. A watchdog that needs no GIL (faulthandler) dumps the stacks
  and ends the worker after HANG_S seconds instead of letting the cluster hang.
- 0006 (common): `ReadyTable::SetReadyCount` had no `return`; the COMPRESS stage calls it for
  every compressed partition. At -O3 gcc emits no `ret`: after unlocking, it runs on into the
  lock-failure path (std::system_error "Success") and the worker aborts at the first push_pull.
- 0012 (server): the first push of round k+1 was written into the buffer that still served
  round k's pulls. Two ps-lite clients (harness/pslite.py) drive the real server in the
  order real workers can: A pulls round k, A pushes round k+1, then B pulls round k.
"""
import os
import re
import sys
import time

import numpy as np
import pytest

from harness import pslite as tc

TIMEOUT = 300  # the whole cluster at most (a loaded 2-core machine starts torch slowly)
FORK_DIR = os.environ.get("BYTEPS_THC_FORK_DIR", "")  # another build under test (conftest.py)
HANG_S = 60    # one worker's push_pulls after bps.init(): a second or two when nothing is wrong
STEPS = 100    # 0005: rounds of two push_pulls, each a chance to hit the deadlock

WORKER = r'''
import faulthandler, os, sys
import torch
import byteps.torch as bps

faulthandler.enable()                     # a crash in a BytePS thread prints every stack
bps.init()
r = bps.rank()
print("rank %d byteps from %s" % (r, os.path.realpath(bps.__file__).rsplit("/byteps/", 1)[0]),
      flush=True)
faulthandler.dump_traceback_later(HANG_S, exit=True)  # needs no GIL: catches a GIL deadlock
if sys.argv[1] == "onebit":
    bps.declare("onebit", compressor_type="onebit", compressor_onebit_scaling="true")
    g = torch.arange(1, 4097, dtype=torch.float32) * (r + 1)
    want = torch.full_like(g, float(torch.arange(1, 4097, dtype=torch.float64).mean()) * 3)
    for step in range(3):
        out = bps.push_pull(g, average=False, name="onebit")
        assert torch.allclose(out, want, rtol=1e-5), (step, out[:4], want[:4])
        print("rank %d push_pull %d ok" % (r, step), flush=True)
else:
    # Python drops each input right away; the BytePS thread that ran the last stage drops its
    # reference a moment after the handle is done, then needs the GIL (torch 2.x). Before 0005
    # the main thread held it in wait_and_clear of the next push_pull: a deadlock whenever that
    # thread was a little late, which a loaded machine makes likely within a few steps.
    for step in range(STEPS):
        s = bps.push_pull(torch.full((1000,), float(r + 1 + step)), average=False, name="sum")
        a = bps.push_pull(torch.full((1000,), float(r + 1 + step)), average=True, name="avg")
        assert torch.equal(s, torch.full((1000,), 3.0 + 2 * step)), (step, s[:4])
        assert torch.equal(a, torch.full((1000,), 1.5 + step)), (step, a[:4])
        if step in (0, 1, 2, STEPS - 1):
            print("rank %d push_pull %d ok" % (r, step), flush=True)
    print("rank %d push_pull %d steps ok" % (r, STEPS), flush=True)
faulthandler.cancel_dump_traceback_later()
bps.shutdown()
print("rank %d done" % r, flush=True)
'''.replace("HANG_S", str(HANG_S)).replace("STEPS", str(STEPS))


def _run_workers(cluster, tmp_path, kind):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    results = cluster([sys.executable, str(script), kind], num_workers=2, timeout=TIMEOUT,
                      env={"BYTEPS_MIN_COMPRESS_BYTES": "1024"})
    report = "\n".join("---- worker %d exited %d:\n%s" % (i, code, out[-5000:])
                        for i, (code, out) in enumerate(results))
    for code, out in results:
        if FORK_DIR:  # the build under test is the one BYTEPS_THC_FORK_DIR names
            assert "byteps from " + os.path.realpath(FORK_DIR) in out, report
        assert code == 0 and re.search(r"rank \d done", out), report


def test_0005_second_push_pull_does_not_deadlock(cluster, tmp_path):
    """push_pull many times in a row, inputs dropped at once: the second or a later one used to
    hang, the main thread holding the GIL that a BytePS thread needed to drop a tensor."""
    _run_workers(cluster, tmp_path, "plain")


def test_0006_compressed_push_pull_does_not_crash(cluster, tmp_path):
    """A compressed tensor (onebit) goes through COMPRESS, which resets the ready table."""
    _run_workers(cluster, tmp_path, "onebit")


@pytest.fixture
def client_cluster(client_exe, tmp_path):
    c = tc.Cluster(2, tmp_path, client_exe, tc.server_argv())
    yield c
    c.close()


@pytest.mark.needs_fork("server")  # the server alone (a --server-only build will do)
def test_0012_next_rounds_push_does_not_overwrite_pulls(client_cluster, tmp_path):
    """Worker A pulls round 0 and pushes round 1 before worker B pulls round 0: B must still get
    round 0's sum (before the fix it got A's round-1 push)."""
    c, d, key = client_cluster, 1 << 16, 1
    if FORK_DIR:  # the server under test is the one BYTEPS_THC_FORK_DIR names
        assert f"byteps from {os.path.realpath(FORK_DIR)}/byteps/" in c.server_text()
    cmd = tc.command(tc.DEFAULT, tc.FLOAT32)
    a, b = c.clients

    def file(name, values=None):
        p = tmp_path / name
        if values is not None:
            p.write_bytes(np.asarray(values, dtype=np.float32).tobytes())
        return p

    def push(client, name, values):
        client.cmd(f"push {key} {cmd} {file(name, values)}")

    def pull(client, name):
        client.cmd(f"pull {key} {cmd} {4 * d} {file(name)}")
        return np.frombuffer(file(name).read_bytes(), dtype=np.float32)

    base = np.arange(d, dtype=np.float32)
    x = {(k, w): base + 1000.0 * (k + 1) * (w + 1) for k in (0, 1) for w in (0, 1)}
    c.all([f"push {key} {cmd} {file('init.bin', np.zeros(d))}"] * 2)  # BytePS's init push
    c.all([f"push {key} {cmd} {file(f'r0w{w}.bin', x[0, w])}" for w in (0, 1)])
    assert np.array_equal(pull(a, "a0.bin"), x[0, 0] + x[0, 1])
    push(a, "r1w0.bin", x[1, 0])              # round 1 starts while B has not pulled round 0
    time.sleep(0.5)                           # (the server's engine thread has copied it)
    got = pull(b, "b0.bin")
    want = x[0, 0] + x[0, 1]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"worker B pulled round 0 with {bad.size} of {d} values wrong: got[{bad[0]}] = "
        f"{got[bad[0]]}, round 0's sum {want[bad[0]]}, A's round-1 push {x[1, 0][bad[0]]}")
    push(b, "r1w1.bin", x[1, 1])
    outs = c.all([f"pull {key} {cmd} {4 * d} {file(f'p1w{w}.bin')}" for w in (0, 1)])
    assert len(outs) == 2
    for w in (0, 1):
        got = np.frombuffer(file(f"p1w{w}.bin").read_bytes(), dtype=np.float32)
        assert np.array_equal(got, x[1, 0] + x[1, 1]), f"worker {w}: round 1 wrong"
