"""Shared helpers for the cluster tests: real BytePS scheduler, servers and workers on 127.0.0.1.

`byteps_cluster(...)` starts the processes from environment variables (no launcher) under the
launcher's Supervisor, each in its own process group, and always stops every group when it returns,
raises or times out: a cluster test can fail but never hang and never leave processes behind.
`client_exe` is the ps-lite test client of harness/pslite.py, compiled once per session.

BYTEPS_THC_FORK_DIR=DIR runs the cluster on another build of the fork, one that
`scripts/build_byteps.sh --target DIR` installed there (e.g. the series without one fix, see
`make test-upstream-bugs`): every process imports `byteps` from DIR first. Unset: the .venv's.
"""
import io
import os
import socket
import sys

import pytest

from byteps_thc.launch.supervisor import ProcSpec, Supervisor
from harness import pslite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_fork_dir = os.environ.get("BYTEPS_THC_FORK_DIR", "")
FORK_DIR = os.path.abspath(_fork_dir) if _fork_dir else ""  # another build of the fork (above)


# Every process a cluster test starts inherits this: a worker or server that dies of a signal
# (SIGSEGV, SIGABRT, ...) prints every thread's Python stack, so that a crash seen once in CI
# says where it was.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")


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

    worker_env(i) -> dict adds per-worker variables. The processes run under the launcher's
    Supervisor: each in its own process group, its output read as it comes (no pipe can fill up
    and block it), every group stopped when this returns or raises. The cluster is done once
    every worker has exited, or one worker failed (the others would wait for it forever); the
    scheduler and the servers are then stopped. On a timeout, or when the scheduler or a server
    fails, an AssertionError carries all the logs.
    """
    port = free_port()
    common = base_env(num_workers, num_servers, port, env)
    serve = [sys.executable, "-c", "import byteps.server"]
    run_cwd = cwd or ROOT
    specs = [ProcSpec("scheduler", "scheduler", serve, dict(common, DMLC_ROLE="scheduler"),
                      run_cwd)]
    specs += [ProcSpec(f"server {i}", "server", serve, dict(common, DMLC_ROLE="server"), run_cwd)
              for i in range(num_servers)]
    specs += [ProcSpec(f"worker {i}", "worker", worker_argv,
                       dict(common, DMLC_ROLE="worker", DMLC_WORKER_ID=str(i),
                            BYTEPS_LOCAL_RANK="0", BYTEPS_LOCAL_SIZE="1",
                            **(worker_env(i) if worker_env else {})), run_cwd)
              for i in range(num_workers)]
    # No grace: a server leaving early fails the cluster only through the timeout; once every
    # worker is done the scheduler and the servers are stopped at once (shutdown_timeout 0).
    sup = Supervisor(specs, err=io.StringIO(), echo=False, keep_lines=True, grace=float("inf"),
                     timeout=timeout, shutdown_timeout=0, kill_timeout=5.0, poll_interval=0.2,
                     tag="cluster")
    workers = [s.name for s in specs if s.role == "worker"]
    with sup:
        outcome = sup.wait()
        # a scheduler or server that failed while workers still run: they would have hung
        stranded = outcome.kind == "failed" and outcome.failed not in workers and any(
            sup.procs[w].poll() is None for w in workers)
    if outcome.kind in ("timeout", "hung") or stranded:
        logs = "\n".join("---- %s (pid %d)\n%s" % (n, pid, sup.logs[n].text()[-3000:])
                          for n, pid in sup.pids.items())
        what = ("cluster timed out after %d s" % timeout if outcome.kind == "timeout"
                else "cluster failed: " + outcome.message)
        raise AssertionError("%s\n%s" % (what, logs))
    return [(sup.procs[w].returncode, sup.logs[w].text()) for w in workers]


@pytest.fixture(scope="session")
def client_exe():
    """The ps-lite test client (harness/thc_client.cc), built against the fork build's ps-lite;
    skips where g++ or that ps-lite is missing."""
    if not pslite.have_tools():
        pytest.skip("g++ not found")
    exe = pslite.build_client(pslite.ROOT / "build" / "thc_client")
    if exe is None:
        pytest.skip("the fork build's ps-lite (libps.a, libzmq.a) was not found")
    return exe


@pytest.fixture
def cluster(fork):
    """The `byteps_cluster` function, for tests that run a real cluster."""
    return byteps_cluster
