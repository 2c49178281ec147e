"""The Supervisor's non-blocking API and the process helpers beside it (kill_groups, remove_shm,
the /proc readers), with plain Python children. The rules of a cluster's outcome are covered by
tests/unit/test_launch.py."""
import io
import json
import os
import sys
import textwrap
import time

import pytest

from byteps_thc.launch.supervisor import (
    ProcSpec,
    Supervisor,
    cpu_seconds,
    kill_group,
    kill_groups,
    proc_stat,
    process_table,
    remove_shm,
)

PY = sys.executable
LIMIT = 60  # bound on waits for stand-ins on a loaded machine (never reached when things work)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def _py(code):
    return [PY, "-c", textwrap.dedent(code)]


def _spec(name, code, role="worker", **kw):
    return ProcSpec(name, role, _py(code), dict(os.environ), **kw)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return st != "Z"


def _wait_for(path):
    deadline = time.monotonic() + LIMIT
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    time.sleep(0.05)  # the writer closes the file
    return open(path).read()


# A worker that starts a grandchild in its own process group, writes the grandchild's pid to
# PIDFILE and sleeps: only a kill of the whole group ends both.
SLEEPER_WITH_CHILD = """
    import os, subprocess, sys, time
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(os.environ["PIDFILE"] + ".tmp", "w").write(str(p.pid))
    os.rename(os.environ["PIDFILE"] + ".tmp", os.environ["PIDFILE"])
    time.sleep(300)
"""


def test_context_manager_stops_every_group_and_removes_leftovers(tmp_path):
    pidfile = tmp_path / "child.pid"
    leftover = tmp_path / "run"
    (leftover / "sock").mkdir(parents=True)
    spec = ProcSpec("worker 0", "worker", _py(SLEEPER_WITH_CHILD),
                    dict(os.environ, PIDFILE=str(pidfile)))
    with Supervisor([spec], echo=False, err=io.StringIO(), kill_timeout=1.0,
                    dirs=[str(leftover)]) as sup:
        grandchild = int(_wait_for(pidfile))
        leader = sup.pids["worker 0"]
        assert _alive(leader) and _alive(grandchild)
        assert sup.poll() is None  # still running: no outcome yet
    assert not _alive(leader) and not _alive(grandchild)
    assert not leftover.exists()
    assert sup.watchdog is None  # released: it will not act on a finished run


def test_context_manager_stops_the_groups_when_the_body_raises(tmp_path):
    pidfile = tmp_path / "child.pid"
    spec = ProcSpec("w", "worker", _py(SLEEPER_WITH_CHILD), dict(os.environ, PIDFILE=str(pidfile)))
    with pytest.raises(KeyError):
        with Supervisor([spec], echo=False, kill_timeout=1.0):
            grandchild = int(_wait_for(pidfile))
            raise KeyError("the caller failed")
    assert not _alive(grandchild)


def test_lines_are_kept_logged_and_called_back_with_times(tmp_path):
    log = tmp_path / "w.log"
    seen = []
    out = io.StringIO()
    t0 = time.time()
    spec = _spec("w", 'print("one"); print("two two", flush=True); print("three")', log=str(log))
    sup = Supervisor([spec], out=out, prefix=False, echo=False, keep_lines=True,
                     on_line=lambda name, t, line: seen.append((name, t, line)))
    outcome = sup.run()
    t1 = time.time()
    assert outcome.code == 0 and outcome.kind == "ok"
    kept = sup.logs["w"].lines
    assert [line for _, line in kept] == ["one", "two two", "three"]
    assert all(t0 <= t <= t1 for t, _ in kept)
    assert [t for t, _ in kept] == sorted(t for t, _ in kept)
    assert seen == [("w", t, line) for t, line in kept]
    assert log.read_text() == "one\ntwo two\nthree\n"
    assert sup.logs["w"].text() == "one\ntwo two\nthree\n"
    assert sup.logs["w"].tail(2) == "two two\nthree"
    assert out.getvalue() == ""  # echo=False


def test_echo_prefixes_and_lines_are_not_kept_by_default():
    out = io.StringIO()
    sup = Supervisor([_spec("worker 3", 'print("hi")')], out=out)
    assert sup.run().code == 0
    assert out.getvalue() == "[worker 3] hi\n"
    assert sup.logs["worker 3"].lines == []


def test_poll_reports_a_failure_by_kind_and_stop_all_is_idempotent():
    sup = Supervisor([_spec("a", "import sys; sys.exit(7)"),
                      _spec("b", "import time; time.sleep(300)")],
                     echo=False, err=io.StringIO(), kill_timeout=1.0)
    sup.start()
    try:
        deadline = time.monotonic() + LIMIT
        while (outcome := sup.poll()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert (outcome.code, outcome.failed, outcome.kind) == (7, "a", "failed")
        assert _alive(sup.pids["b"])  # poll decides; it stops nothing by itself
    finally:
        sup.stop_all()
        sup.stop_all()
    assert not _alive(sup.pids["b"])
    assert sup.procs["b"].returncode is not None


def test_poll_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        Supervisor([_spec("a", "pass")]).poll()


def test_timeout_and_hang_have_their_kinds():
    sup = Supervisor([_spec("w", "import time; time.sleep(300)")], echo=False,
                     err=io.StringIO(), timeout=0.3, kill_timeout=1.0)
    assert sup.run().kind == "timeout"
    sup = Supervisor([_spec("w0", "pass"), _spec("w1", "import time; time.sleep(300)")],
                     echo=False, err=io.StringIO(), grace=0.3, kill_timeout=1.0)
    outcome = sup.run()
    assert (outcome.kind, outcome.failed) == ("hung", "w1")


def test_kill_group_reaches_a_grandchild_and_survives_a_finished_leader(tmp_path):
    import subprocess
    pidfile = tmp_path / "child.pid"
    p = subprocess.Popen(_py(SLEEPER_WITH_CHILD), env=dict(os.environ, PIDFILE=str(pidfile)),
                         start_new_session=True)
    grandchild = int(_wait_for(pidfile))
    kill_group(p, timeout=1.0)
    assert p.returncode is not None
    # the grandchild has been sent SIGKILL; its exit is asynchronous (and a busy host may take a
    # moment to run it), so it must be gone within the limit, not at once
    deadline = time.monotonic() + LIMIT
    while _alive(grandchild):
        assert time.monotonic() < deadline, f"grandchild {grandchild} outlived kill_group"
        time.sleep(0.02)
    kill_groups([p], timeout=0.1)  # again, leader reaped: nothing to do, no error


def test_kill_group_without_term_is_sigkill(tmp_path):
    import signal
    import subprocess
    p = subprocess.Popen(_py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
    """), stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout.readline().strip() == b"ready"
    kill_group(p, timeout=LIMIT, term=False)
    assert p.returncode == -signal.SIGKILL


def test_remove_shm_removes_only_the_prefixes(tmp_path):
    (tmp_path / "BytePS_ShM_a_1_0").write_text("")
    (tmp_path / "BytePS_ShM_a_1_1").write_text("")
    (tmp_path / "BytePS_ShM_a_2_0").write_text("")
    removed = remove_shm(["BytePS_ShM_a_1_", ""], shm_dir=str(tmp_path))
    assert sorted(removed) == ["BytePS_ShM_a_1_0", "BytePS_ShM_a_1_1"]
    assert sorted(os.listdir(tmp_path)) == ["BytePS_ShM_a_2_0"]
    assert remove_shm([], shm_dir=str(tmp_path)) == []
    assert remove_shm(["x"], shm_dir=str(tmp_path / "missing")) == []


# A process that burns CPU in a child, then reports both processes' own CPU clocks (times(2),
# an independent source) and sleeps so that /proc still shows them.
BURNER = """
    import json, os, subprocess, sys, time
    burn = ("import os, time\\nt = time.process_time()\\n"
            "while time.process_time() - t < 0.3: pass\\n"
            "c = os.times(); print(c.user + c.system, flush=True); time.sleep(300)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    child_cpu = float(child.stdout.readline())
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    me = os.times()
    print(json.dumps({"child": child.pid, "child_cpu": child_cpu, "me": me.user + me.system}),
          flush=True)
    time.sleep(300)
"""


def test_cpu_seconds_and_process_table_agree_with_the_processes_own_clocks():
    import subprocess
    p = subprocess.Popen(_py(BURNER), stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        rep = json.loads(p.stdout.readline())
        tick = 1.0 / os.sysconf("SC_CLK_TCK")
        own = cpu_seconds(p.pid, children=False)
        both = cpu_seconds(p.pid)
        assert own >= rep["me"] - 2 * tick
        assert both >= own + rep["child_cpu"] - 2 * tick
        table = process_table()
        assert table[p.pid][0] == os.getpid()           # its parent: this test
        assert table[rep["child"]][0] == p.pid
        assert table[rep["child"]][1] >= rep["child_cpu"] - 2 * tick
        assert proc_stat(p.pid)[0] == os.getpid()
    finally:
        kill_group(p, timeout=1.0)
    assert proc_stat(p.pid) is None and cpu_seconds(p.pid) == 0
