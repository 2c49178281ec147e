"""`bpslaunch --local N` with the real BytePS scheduler, servers and workers on 127.0.0.1.

Skipped when the BytePS fork is not installed (`make byteps`).
"""
import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from byteps_thc.launch import free_ports
from byteps_thc.launch.supervisor import ProcSpec, Supervisor, kill_groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORK_DIR = os.path.abspath(os.environ["BYTEPS_THC_FORK_DIR"]) \
    if os.environ.get("BYTEPS_THC_FORK_DIR") else ""


pytestmark = pytest.mark.needs_fork


def bpslaunch(args, timeout=240, env=None, cwd=ROOT, prefix=()):
    """Run our launcher (behind the command `prefix`, if any); returns (exit code, stdout, stderr,
    seconds). Past `timeout` seconds it gets SIGTERM (it stops its cluster), then its group
    SIGKILL, and the test fails."""
    e = dict(os.environ if env is None else env)
    paths = [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]
    # BYTEPS_THC_FORK_DIR (tests/conftest.py): every process imports byteps from that build
    e["PYTHONPATH"] = os.pathsep.join([p for p in (FORK_DIR, ROOT) if p] + paths)
    e.pop("BYTEPS_COMPRESSOR", None)
    t0 = time.monotonic()
    p = subprocess.Popen(list(prefix) + [sys.executable, "-m", "byteps_thc.launch"] + list(args),
                         cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_launchers([p])
        out, err = p.communicate()
        raise AssertionError(f"bpslaunch ran past {timeout} s\n{out[-3000:]}\n{err[-3000:]}")
    return p.returncode, out, err, time.monotonic() - t0


def stop_launchers(procs, wait=10.0):
    """SIGTERM to each launcher still running (it stops its processes), then SIGKILL to its
    group. A launcher killed outright leaves nothing either: its watchdog stops its groups."""
    kill_groups(procs, timeout=wait)


def survivors(port, wait=10.0):
    """The cluster's processes still alive `wait` seconds after its launchers ended (should be
    none); any found are killed, so that a failing test leaves no orphans either."""
    deadline = time.monotonic() + wait
    while processes_of_cluster(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_of_cluster(port)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def worker_script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent("""
        import os, sys, time
        import torch
        import byteps.torch as bps
        bps.init()
        rank, size = bps.rank(), bps.size()
    """) + textwrap.dedent(body) + "\nbps.shutdown()\n")
    return str(path)


def scheduler_port(stderr):
    m = re.search(r"scheduler 127\.0\.0\.1:(\d+)", stderr)
    assert m, stderr
    return m.group(1)


def processes_of_cluster(port):
    """PIDs of live processes whose environment names this cluster's scheduler port."""
    pids = []
    needle = f"DMLC_PS_ROOT_PORT={port}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                envs = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in envs and state != "Z":
            pids.append(int(pid))
    return pids


def shm_of_cluster(port):
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"BytePS_ShM_127.0.0.1_{port}_")] \
        if os.path.isdir("/dev/shm") else []


def test_push_pull_sums_across_two_workers(tmp_path):
    script = worker_script(tmp_path, """
        for n in (1000, 300000):                       # small (one partition) and larger
            t = torch.full((n,), float(rank + 1))
            out = bps.push_pull(t, average=False, name=f"sum.{n}")
            assert torch.equal(out, torch.full((n,), 3.0)), out[:4]
            avg = bps.push_pull(t, average=True, name=f"avg.{n}")
            assert torch.allclose(avg, torch.full((n,), 1.5)), avg[:4]
        print("push_pull ok", rank, size, flush=True)
    """)
    code, out, err, took = bpslaunch(["--local", "2", "--timeout", "180", "--",
                                      sys.executable, script])
    assert code == 0, out + err
    assert "[worker 0] push_pull ok 0 2" in out and "[worker 1] push_pull ok 1 2" in out
    port = scheduler_port(err)
    assert processes_of_cluster(port) == [] and shm_of_cluster(port) == []


def test_worker_exiting_early_ends_the_cluster_in_seconds(tmp_path):
    script = worker_script(tmp_path, """
        t = torch.ones(1000)
        bps.push_pull(t, name="first")                 # the cluster is up and working
        if rank == 1:
            print("worker 1 leaves at %.3f" % time.time(), flush=True)
            os._exit(3)                                # no shutdown: the others would wait forever
        for i in range(100000):
            bps.push_pull(t, name="again")
    """)
    code, out, err, took = bpslaunch(["--local", "2", "--timeout", "200", "--",
                                      sys.executable, script])
    ended = time.time()
    assert code == 3, out + err
    assert "worker 1" in err and "exited with code 3" in err, err
    left = re.search(r"\[worker 1\] worker 1 leaves at ([0-9.]+)", out)
    assert left, out
    # seconds after the exit, not the timeout (200 s) nor the grace period (60 s): the launcher
    # sees the exit within its poll interval and stops the rest within its kill timeout (3 s);
    # the bound leaves room for a loaded machine
    assert ended - float(left.group(1)) < 20, ended - float(left.group(1))
    port = scheduler_port(err)
    time.sleep(0.5)
    assert processes_of_cluster(port) == [], "orphans left behind"
    assert shm_of_cluster(port) == []


def test_env_only_launch_as_upstream(tmp_path):
    """One `bpslaunch` per role from DMLC_* variables alone, as BytePS users run it."""
    script = worker_script(tmp_path, """
        out = bps.push_pull(torch.full((10,), float(rank)), average=False, name="x")
        assert torch.equal(out, torch.full((10,), 1.0))
        print("env-only ok", rank, flush=True)
    """)
    port, sport, w0, w1 = free_ports(4)
    timeout = 300
    base = dict(os.environ, DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1",
                DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                DMLC_NODE_HOST="127.0.0.1",
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    base.pop("BYTEPS_COMPRESSOR", None)
    roles = [("scheduler", {}), ("server", {"DMLC_NODE_PORT": str(sport)}),
             ("worker", {"DMLC_WORKER_ID": "0", "DMLC_NODE_PORT": str(w0),
                         "BYTEPS_SOCKET_PATH": str(tmp_path)}),
             ("worker", {"DMLC_WORKER_ID": "1", "DMLC_NODE_PORT": str(w1),
                         "BYTEPS_SOCKET_PATH": str(tmp_path / "w1")})]
    (tmp_path / "w1").mkdir()
    specs = []
    for i, (role, extra) in enumerate(roles):
        argv = [sys.executable, "-m", "byteps_thc.launch"]
        if role == "worker":
            argv += [sys.executable, script]
        specs.append(ProcSpec(f"{i} {role}", role, argv, dict(base, DMLC_ROLE=role, **extra),
                              ROOT, log=str(tmp_path / f"{i}-{role}.log")))
    # each launcher in its own process group under the Supervisor, which only starts them and,
    # once they have ended or `timeout` passed, stops what still runs; the asserts say the rest
    sup = Supervisor(specs, err=io.StringIO(), echo=False, keep_lines=True, kill_timeout=10.0,
                     tag="env-only")
    try:
        sup.start()
        deadline = time.monotonic() + timeout
        for p in sup.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        sup.stop_all()
        left = survivors(port)
    procs = [sup.procs[s.name] for s in specs]
    outs = [sup.logs[s.name].text()[-3000:] for s in specs]
    assert left == [], f"processes outlived their launchers: {left}\n{outs}"
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert "env-only ok 0" in outs[2] and "env-only ok 1" in outs[3]
