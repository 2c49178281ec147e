"""Dead nodes and stalled rounds in role mode: one `bpslaunch` per role, configured by DMLC_* as
on separate machines, with the real BytePS scheduler, server and workers on 127.0.0.1.

- a server or a worker SIGKILLed mid-training: every other process exits non-zero, the workers
  naming the dead node (role, id, address), found by ps-lite's heartbeats; a server whose
  heartbeats never reach the scheduler (here: turned off on it, as when it dies before its first
  one arrives) is found all the same, counted from the moment the cluster formed; a worker
  killed while its pull waits: the server drops the reply it cannot route, and lives on to end
  with the others;
- a worker that sleeps inside training: the server names the missing worker, fails the round
  after BYTEPS_THC_STALL_TIMEOUT, and every process exits non-zero; nothing is left behind;
- a worker whose script ends early (it returned, or raised): the others end at once, naming it;
- a cluster that never forms (a worker, or the scheduler, never started): after
  BYTEPS_THC_STARTUP_TIMEOUT every node that was started says what it waited for (the scheduler
  names who registered and who is missing) and exits non-zero.

Timeouts: BYTEPS_THC_DEAD_NODE_TIMEOUT=8, so heartbeats every second; a live node would have to
miss eight in a row (8 s without one scheduled on this host) to be declared dead.
"""
import io
import os
import re
import signal
import sys
import textwrap
import time

import pytest

from byteps_thc.launch import free_ports
from byteps_thc.launch.supervisor import ProcSpec, Supervisor, child_pids
from test_launch_local import (
    ROOT,
    pytestmark,  # noqa: F401  (this module's marks)
    shm_of_cluster,
    survivors,
)

_fork_dir = os.environ.get("BYTEPS_THC_FORK_DIR", "")
FORK_DIR = os.path.abspath(_fork_dir) if _fork_dir else ""
DEAD_NODE_TIMEOUT = 8
# a worker's grace after the report is the same timeout (thc_liveness.h); detection, the
# scheduler's notices and the grace together stay far below this bound for every wait below
EXIT_BOUND = 120


def _is_watchdog(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"watchdog.py" in f.read()
    except OSError:
        return True  # gone: nothing to kill


def train_script(tmp_path, body):
    """A worker that trains a model with one THC-sized layer, running `body` at each step."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import os, sys, time
        import torch
        import byteps.torch as bps
        bps.init()
        rank = bps.rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Linear(300, 10))
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        x, y = torch.randn(16, 300), torch.randint(0, 10, (16,))
        for step in range(100000):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
    """) + textwrap.indent(textwrap.dedent(body) + textwrap.dedent("""
        opt.step()
        if step % 5 == 0:
            print("step", step, flush=True)
    """), "    "))
    return str(path)


class RoleCluster:
    """Scheduler, one server and two workers (but those named in `absent`), each its own
    `bpslaunch` (the workers `python SCRIPT` alone with `direct_workers`, with the DMLC_*
    variables and none of ps-lite's, as upstream's tests start them), started under the
    Supervisor: each in its own process group, its output read as
    it comes (no pipe can fill up and block it) and copied to a log file, every group stopped by
    `stop` (or by the Supervisor's watchdog, should the test process be killed). The Supervisor
    only starts and stops them; when each has ended and why is what the tests check."""

    def __init__(self, tmp_path, script, worker_flags=(), server_flags=(), extra_env=None,
                 server_env=None, absent=(), scheduler_env=None, direct_workers=False):
        self.port, self.sport, w0, w1 = free_ports(4)
        paths = [FORK_DIR, ROOT, os.environ.get("PYTHONPATH", "")]
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DMLC_", "BYTEPS_", "PS_"))}
        base.update(DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1", DMLC_PS_ROOT_URI="127.0.0.1",
                    DMLC_PS_ROOT_PORT=str(self.port), DMLC_NODE_HOST="127.0.0.1",
                    BYTEPS_THC_DEAD_NODE_TIMEOUT=str(DEAD_NODE_TIMEOUT), OMP_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join(p for p in paths if p), **(extra_env or {}))
        self.wports = (w0, w1)
        launch = [sys.executable, "-m", "byteps_thc.launch"]
        self.roles = [
            ("scheduler", dict(scheduler_env or {}), launch),
            ("server", dict(server_env or {}, DMLC_NODE_PORT=str(self.sport)),
             launch + list(server_flags)),
        ] + [(f"worker {i}", {"DMLC_WORKER_ID": str(i), "DMLC_NODE_PORT": str(p),
                              "BYTEPS_SOCKET_PATH": str(tmp_path / f"w{i}"),
                              # `direct_workers`: what bpslaunch would add for one local worker
                              **({"BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "1"}
                                 if direct_workers else {})},
              [sys.executable, script] if direct_workers
              else launch + list(worker_flags) + ["--", sys.executable, script])
             for i, p in enumerate(self.wports)]
        specs = []
        for name, extra, argv in self.roles:
            if name in absent:  # never started, as a machine that never came up
                continue
            if name.startswith("worker"):
                (tmp_path / f"w{name[-1]}").mkdir()
            env = dict(base, DMLC_ROLE=name.split()[0], **extra)
            log = str(tmp_path / f"{name.replace(' ', '')}.log")
            specs.append(ProcSpec(name, name.split()[0], argv, env, ROOT, log=log))
        self.sup = Supervisor(specs, err=io.StringIO(), echo=False, keep_lines=True,
                              kill_timeout=10.0, tag="role cluster")
        self.sup.start()
        self.procs = self.sup.procs

    def text(self, name):
        """What `name` printed so far; all of it once it has ended."""
        log = self.sup.logs[name]
        if self.procs[name].poll() is not None:
            log.ended.wait(timeout=10)
        return log.text()

    def all_text(self):
        return "\n".join(f"---- {n}\n{self.text(n)[-4000:]}" for n in self.procs)

    def wait_for(self, names, needle, timeout):
        """Until every log of `names` holds `needle`; AssertionError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(needle in self.text(n) for n in names):
                return
            if any(self.procs[n].poll() is not None for n in names):
                break
            time.sleep(0.2)
        raise AssertionError(f"no {needle!r} in {names} after {timeout} s\n{self.all_text()}")

    def kill_role(self, name):
        """SIGKILL the BytePS process a launcher runs (its child), as a machine dies."""
        kids = [pid for pid in child_pids(self.procs[name].pid) if not _is_watchdog(pid)]
        assert kids, f"{name} runs no process\n{self.all_text()}"
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def wait_all(self, names, timeout, since=None):
        """Exit codes of `names` once they all ended; AssertionError past `timeout` s. With
        `since` (a monotonic time), prints how long after it each one ended (pytest -s)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        ended = {}
        while len(ended) < len(names):
            for n in names:
                if n not in ended and self.procs[n].poll() is not None:
                    ended[n] = time.monotonic()
            if time.monotonic() > deadline:
                late = [n for n in names if n not in ended]
                raise AssertionError(f"{late} still run {timeout} s later\n{self.all_text()}")
            time.sleep(0.1)
        if since is not None:
            print("exited after: " + ", ".join(f"{n} {ended[n] - since:.1f} s (code "
                                                f"{self.procs[n].returncode})" for n in names))
        return {n: self.procs[n].returncode for n in names}

    def stop(self):
        self.sup.stop_all()
        return survivors(self.port)


@pytest.fixture
def role_cluster(tmp_path):
    made = []

    def start(*args, **kwargs):
        made.append(RoleCluster(tmp_path, *args, **kwargs))
        return made[-1]
    yield start
    for c in made:
        c.stop()


def _address(port):
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("beats", ["heartbeats", "silent"])
def test_server_killed_fails_every_worker_naming_it(tmp_path, role_cluster, beats):
    # "silent": the server sends no heartbeat at all (PS_HEARTBEAT_INTERVAL=0 on it alone), as
    # one killed before its first heartbeat reached the scheduler; the scheduler watches it from
    # the moment the cluster formed all the same
    server_env = {"PS_HEARTBEAT_INTERVAL": "0"} if beats == "silent" else {}
    c = role_cluster(train_script(tmp_path, ""), server_env=server_env)
    # "silent": step 0, since the scheduler declares that server dead DEAD_NODE_TIMEOUT after
    # the cluster formed, killed or not
    c.wait_for(["worker 0", "worker 1"], "step 5" if beats == "heartbeats" else "step 0",
               timeout=240)
    killed = c.kill_role("server")
    codes = c.wait_all(["worker 0", "worker 1", "scheduler"], EXIT_BOUND, since=killed)
    assert all(code != 0 for code in codes.values()), (codes, c.all_text())
    why = ("is gone: no heartbeat for " if beats == "heartbeats"
           else "is gone: no heartbeat in the ")
    for w in ("worker 0", "worker 1"):
        text = c.text(w)
        # the report names the role, the id and the address of the dead server
        assert "server rank 0 (ps-lite node 8, " + _address(c.sport) + ")" in text, text[-3000:]
        assert why in text, text[-3000:]
        assert "RuntimeError" in text, text[-3000:]  # the script's push_pull raised it
    assert "server rank 0" in c.text("scheduler")
    assert c.stop() == [] and shm_of_cluster(c.port) == []


def _last_step(text):
    steps = [int(m) for m in re.findall(r"^step (\d+)$", text, re.M)]
    return max(steps) if steps else -1


def test_workers_started_without_bpslaunch_outlive_the_dead_node_timeout(tmp_path, role_cluster):
    """Workers run as `python train.py` (no PS_HEARTBEAT_* in their environment) beside a
    scheduler and server from bpslaunch (dead-node timeout 8 s): they heartbeat by ps-lite's
    default, so they train on for three times that timeout and nobody is declared gone."""
    c = role_cluster(train_script(tmp_path, ""), direct_workers=True)
    c.wait_for(["worker 0", "worker 1"], "step 0", timeout=240)
    time.sleep(3 * DEAD_NODE_TIMEOUT)
    assert all(p.poll() is None for p in c.procs.values()), c.all_text()
    assert "is gone" not in c.text("scheduler"), c.all_text()
    steps = {w: _last_step(c.text(w)) for w in ("worker 0", "worker 1")}
    c.wait_for(["worker 0", "worker 1"], f"step {max(steps.values()) + 5}", timeout=60)
    assert c.stop() == [] and shm_of_cluster(c.port) == []


def test_worker_started_without_bpslaunch_fails_when_its_scheduler_is_gone(tmp_path,
                                                                           role_cluster):
    """Such a worker watches the scheduler's answers to its heartbeats with ps-lite's default
    timeout (30 s): the scheduler killed, it fails by itself, naming it, instead of waiting."""
    c = role_cluster(train_script(tmp_path, ""), direct_workers=True)
    c.wait_for(["worker 0", "worker 1"], "step 5", timeout=240)
    killed = c.kill_role("scheduler")
    codes = c.wait_all(["worker 0", "worker 1"], EXIT_BOUND, since=killed)
    assert all(code != 0 for code in codes.values()), (codes, c.all_text())
    for w in ("worker 0", "worker 1"):
        assert "ps-lite: lost the scheduler" in c.text(w), c.text(w)[-3000:]
    assert c.stop() == [] and shm_of_cluster(c.port) == []


def test_worker_killed_fails_the_other_worker_and_the_server(tmp_path, role_cluster):
    c = role_cluster(train_script(tmp_path, ""))
    c.wait_for(["worker 0", "worker 1"], "step 5", timeout=240)
    killed = c.kill_role("worker 1")
    codes = c.wait_all(["worker 0", "server", "scheduler"], EXIT_BOUND, since=killed)
    assert all(code != 0 for code in codes.values()), (codes, c.all_text())
    dead = "worker 1 (ps-lite node "
    for n in ("worker 0", "server", "scheduler"):
        text = c.text(n)
        assert dead in text and _address(c.wports[1]) in text, (n, text[-3000:])
    assert "RuntimeError" in c.text("worker 0")
    assert c.stop() == [] and shm_of_cluster(c.port) == []


def test_server_replying_to_a_dead_worker_drops_the_reply(tmp_path, role_cluster):
    """Worker 1 dies while its pull waits on the server for worker 0's push; then worker 0
    pushes and the server replies to both. The reply to worker 1 cannot be routed (ZeroMQ:
    EHOSTUNREACH), which aborted the server (status 134) before the heartbeats named the dead
    worker (seen in CI). The server now drops that reply, says so, and ends as for any dead
    worker. The flag file orders the steps: worker 0 pushes only once worker 1 is gone."""
    flag = tmp_path / "go"
    c = role_cluster(train_script(tmp_path, f"""
        if rank == 0 and step == 10:
            print("worker 0 waits", flush=True)
            while not os.path.exists({str(flag)!r}):
                time.sleep(0.05)
    """))
    # worker 1 printed step 10 (worker 0's step-10 pushes were out), then pushed step 11 and
    # asked for its sum, which waits for worker 0
    c.wait_for(["worker 0"], "worker 0 waits", timeout=240)
    c.wait_for(["worker 1"], "step 10", timeout=60)
    time.sleep(2)
    killed = c.kill_role("worker 1")
    time.sleep(1)  # the server's ZeroMQ sees the connection close
    flag.write_text("")
    codes = c.wait_all(["worker 0", "server", "scheduler"], EXIT_BOUND, since=killed)
    server = c.text("server")
    assert "a reply to worker 1 (ps-lite node " in server and "was dropped" in server, \
        server[-3000:]
    assert codes["server"] == 1 and codes["worker 0"] != 0 and codes["scheduler"] != 0, \
        (codes, c.all_text())
    for n in ("worker 0", "server", "scheduler"):
        assert "worker 1 (ps-lite node " in c.text(n), (n, c.text(n)[-3000:])
    assert c.stop() == [] and shm_of_cluster(c.port) == []


@pytest.mark.parametrize("how", ["sys.exit(0)", "raise ValueError('data ran out')"])
def test_worker_that_leaves_early_ends_the_others_at_once(tmp_path, role_cluster, how):
    """Worker 1's script ends after step 3 while worker 0 trains on. BytePS's atexit shutdown
    puts worker 1 into ps-lite's final barrier, where it heartbeats: no dead-node timeout can
    find it, and worker 0 waited for its pushes forever. The server now sees worker 0 push a
    round that worker 1 will never join, and every other node ends, naming worker 1."""
    c = role_cluster(train_script(tmp_path, f"""
        if rank == 1 and step == 3:
            print("worker 1 leaves", flush=True)
            {how}
    """))
    c.wait_for(["worker 1"], "worker 1 leaves", timeout=240)
    codes = c.wait_all(["worker 0", "worker 1", "server", "scheduler"], EXIT_BOUND)
    assert all(codes[n] != 0 for n in ("worker 0", "server", "scheduler")), (codes, c.all_text())
    for n in ("worker 0", "server", "scheduler"):
        text = c.text(n)
        assert "worker 1 (ps-lite node " in text and "left the cluster early: it shut down" \
            in text, (n, text[-3000:])
    assert "RuntimeError" in c.text("worker 0")  # its push_pull raised the report
    assert c.stop() == [] and shm_of_cluster(c.port) == []


def test_stalled_worker_is_named_and_every_process_exits(tmp_path, role_cluster):
    # worker 1 stops calling step() after step 3, as in a data-loader deadlock
    c = role_cluster(train_script(tmp_path, """
        if rank == 1 and step == 3:
            print("worker 1 sleeps", flush=True)
            time.sleep(600)
    """), worker_flags=["--compressor", "thc"], server_flags=["--stall-timeout", "10"],
        extra_env={"BYTEPS_THC_STALL_WARN": "4"})
    c.wait_for(["worker 1"], "worker 1 sleeps", timeout=240)
    names = ["scheduler", "server", "worker 0", "worker 1"]
    codes = c.wait_all(names, EXIT_BOUND, since=time.monotonic())
    assert all(code != 0 for code in codes.values()), (codes, c.all_text())
    server = c.text("server")
    # the warning, then the failure, name the missing worker by its DMLC_WORKER_ID and address
    missing = "for the push of worker 1 (ps-lite node "
    assert missing in server and _address(c.wports[1]) in server, server[-3000:]
    assert "BYTEPS_THC_STALL_WARN=4" in server, server[-3000:]
    assert "the round failed after BYTEPS_THC_STALL_TIMEOUT=10 s" in server, server[-3000:]
    w0 = c.text("worker 0")
    assert "RuntimeError" in w0 and "BYTEPS_THC_STALL_TIMEOUT=10" in w0, w0[-3000:]
    # the sleeping worker learns of the cluster's end and leaves after its grace period
    assert "still running" in c.text("worker 1"), c.text("worker 1")[-3000:]
    assert c.stop() == [] and shm_of_cluster(c.port) == []


STARTUP_TIMEOUT = 8
SCHEDULER_TIMEOUT = 60


@pytest.mark.parametrize("absent", ["worker 1", "scheduler"])
def test_cluster_that_never_forms_ends_every_node_naming_the_missing(tmp_path, role_cluster,
                                                                      absent):
    # the scheduler waits longer than the others, so that it names the worker that registered
    # however long that worker's imports took (its clock starts at its own start)
    c = role_cluster(train_script(tmp_path, ""), absent=(absent,),
                     extra_env={"BYTEPS_THC_STARTUP_TIMEOUT": str(STARTUP_TIMEOUT)},
                     scheduler_env={"BYTEPS_THC_STARTUP_TIMEOUT": str(SCHEDULER_TIMEOUT)})
    names = [n for n in ("scheduler", "server", "worker 0", "worker 1") if n != absent]
    # the clock starts in each node's ps-lite start, after its imports: the bound leaves room
    codes = c.wait_all(names, SCHEDULER_TIMEOUT + EXIT_BOUND, since=time.monotonic())
    assert all(code != 0 for code in codes.values()), (codes, c.all_text())
    head = f"the cluster did not form within BYTEPS_THC_STARTUP_TIMEOUT={STARTUP_TIMEOUT} s: "
    scheduler = _address(c.port)
    if absent == "worker 1":
        text = c.text("scheduler")
        want = (f"the cluster did not form within BYTEPS_THC_STARTUP_TIMEOUT={SCHEDULER_TIMEOUT} "
                "s: 1 of 2 workers and 1 of 1 server registered with this scheduler")
        assert want in text, text[-3000:]
        # who came (worker 0 by its DMLC_WORKER_ID, the server, at their addresses) and who not
        assert f"worker 0 at {_address(c.wports[0])}" in text, text[-3000:]
        assert f"server at {_address(c.sport)}" in text, text[-3000:]
        assert "missing: 1 worker (DMLC_WORKER_ID 1)" in text, text[-3000:]
    for n, me in (("server", f"server at {_address(c.sport)}"),
                  ("worker 0", f"worker 0 at {_address(c.wports[0])}"),
                  ("worker 1", f"worker 1 at {_address(c.wports[1])}")):
        if n in names:
            text = c.text(n)
            assert head + f"this {me} registered with the scheduler at {scheduler}" in text, \
                (n, text[-3000:])
            assert "2 workers and 1 server" in text, (n, text[-3000:])
    assert c.stop() == [] and shm_of_cluster(c.port) == []



def test_worker_that_leaves_before_the_cluster_formed_ends_the_scheduler(tmp_path, role_cluster):
    """Worker 0's script raises while its ps-lite still waits for worker 1, which never came.
    Its final barrier aborted the process (SIGABRT, the van was not ready), and the others
    waited for their startup timeout. Now it exits with a message, and the scheduler, told,
    ends at once naming it; the server ends at its startup timeout (the scheduler is gone)."""
    c = role_cluster(train_script(tmp_path, """
        if step == 0:
            print("worker 0 leaves", flush=True)
            raise ValueError("bad data")
    """), absent=("worker 1",), extra_env={"BYTEPS_THC_STARTUP_TIMEOUT": str(STARTUP_TIMEOUT)},
        scheduler_env={"BYTEPS_THC_STARTUP_TIMEOUT": str(SCHEDULER_TIMEOUT)})
    c.wait_for(["worker 0"], "worker 0 leaves", timeout=240)
    # the scheduler long before its own startup timeout
    codes = c.wait_all(["worker 0", "scheduler"], EXIT_BOUND)
    assert codes == {"worker 0": 1, "scheduler": 1}, (codes, c.all_text())
    w0 = c.text("worker 0")
    assert "ValueError: bad data" in w0 and "SIGABRT" not in w0, w0[-3000:]
    me = f"worker 0 at {_address(c.wports[0])}"
    assert f"this {me} leaves before the cluster formed" in w0, w0[-3000:]
    sched = c.text("scheduler")
    assert f"{me} left before the cluster formed" in sched, sched[-3000:]
    assert c.wait_all(["server"], STARTUP_TIMEOUT + EXIT_BOUND)["server"] != 0, c.all_text()
    assert c.stop() == [] and shm_of_cluster(c.port) == []
