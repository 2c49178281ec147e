"""Shared helpers for the cluster tests: real BytePS scheduler, servers and workers on 127.0.0.1.

`byteps_cluster(...)` starts the processes by hand (environment variables, no launcher), each in its
own process group, and always kills every group when it returns, raises or times out: a cluster
test can fail but never hang and never leave processes behind.

BYTEPS_THC_FORK_DIR=DIR runs the cluster on another build of the fork, one that
`scripts/build_byteps.sh --target DIR` installed there (e.g. the series without one fix, see
`make test-upstream-bugs`): every process imports `byteps` from DIR first. Unset: the .venv's.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_fork_dir = os.environ.get("BYTEPS_THC_FORK_DIR", "")
FORK_DIR = os.path.abspath(_fork_dir) if _fork_dir else ""  # another build of the fork (above)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(num_workers, num_servers, port, extra=None):
    """Environment of one job; variables that would leak into ps-lite or BytePS are dropped."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "BYTEPS_", "PS_")) and k != "PORT"}
    env.update({
        "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NODE_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (FORK_DIR, ROOT, env.get("PYTHONPATH")) if p),
        "BYTEPS_SERVER_ENGINE_THREAD": "2", "OMP_NUM_THREADS": "1",
    })
    env.update(extra or {})
    return env


def byteps_cluster(worker_argv, num_workers=2, num_servers=1, timeout=120, env=None,
                   worker_env=None, cwd=None):
    """Run scheduler + servers + workers; return [(returncode, output)] of the workers.

    worker_env(i) -> dict adds per-worker variables. Every process logs to a file (no pipe can
    fill up and block it). On a timeout every process group is killed and an AssertionError
    carries all the logs.
    """
    port = free_port()
    common = base_env(num_workers, num_servers, port, env)
    serve = [sys.executable, "-c", "import byteps.server"]
    logdir = tempfile.mkdtemp(prefix="bps-cluster-")
    procs = []

    def start(role, argv, extra):
        log = open(os.path.join(logdir, "%s-%d.log" % (role, len(procs))), "wb")
        p = subprocess.Popen(argv, env=dict(common, DMLC_ROLE=role, **extra), cwd=cwd or ROOT,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        procs.append((role, p, log.name))
        return p

    def read(path):
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")

    try:
        start("scheduler", serve, {})
        for _ in range(num_servers):
            start("server", serve, {})
        for i in range(num_workers):
            start("worker", worker_argv,
                  dict({"DMLC_WORKER_ID": str(i), "BYTEPS_LOCAL_RANK": "0",
                        "BYTEPS_LOCAL_SIZE": "1"}, **(worker_env(i) if worker_env else {})))
        workers = [(p, f) for r, p, f in procs if r == "worker"]
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p, _ in workers):
            if any(p.poll() not in (None, 0) for p, _ in workers):
                break  # one worker failed: the others would wait for it forever
            if time.monotonic() > deadline:
                _kill_all(procs)
                logs = "\n".join("---- %s (pid %d)\n%s" % (r, q.pid, read(f)[-3000:])
                                  for r, q, f in procs)
                raise AssertionError("cluster timed out after %d s\n%s" % (timeout, logs))
            time.sleep(0.2)
        _kill_all(procs)
        return [(p.returncode, read(f)) for p, f in workers]
    finally:
        _kill_all(procs)
        shutil.rmtree(logdir, ignore_errors=True)


def _kill_all(procs):
    for _, p, _ in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for _, p, _ in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def cluster(fork):
    """The `byteps_cluster` function, for tests that run a real cluster."""
    return byteps_cluster
