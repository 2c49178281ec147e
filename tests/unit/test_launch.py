"""bpslaunch: flag parsing, environment building and process supervision.

The supervision tests run plain Python children standing in for the BytePS roles; the real
scheduler/server/workers are exercised in tests/cluster/test_launch_local.py.
"""
import io
import os
import signal
import sys
import textwrap
import time

import pytest

from byteps_thc import launch
from byteps_thc.launch import local
from byteps_thc.thc.config import ThcConfig

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(launch.__file__))))
# Bound on how long a stopped cluster of stand-ins may take: far below the stand-ins' own 120 s,
# and generous for a loaded machine (a Python start can take seconds there).
LIMIT = 60


# -- flags ---------------------------------------------------------------------------------------
def test_command_after_double_dash_keeps_its_own_flags():
    ns = launch.parse_args(["--local", "2", "--", "python", "train.py", "--epochs", "3", "--"])
    assert ns.local == 2 and ns.servers is None
    assert ns.command == ["python", "train.py", "--epochs", "3", "--"]


def test_command_without_double_dash():
    ns = launch.parse_args(["--compressor", "fp16", "python", "train.py", "--lr", "0.1"])
    assert ns.compressor == "fp16"
    assert ns.command == ["python", "train.py", "--lr", "0.1"]


def test_defaults_leave_compression_unset():
    ns = launch.parse_args(["python", "x.py"])
    assert ns.compressor is None and ns.local is None
    assert launch.compression_env(ns, {}) == {}


@pytest.mark.parametrize("name", launch.COMPRESSORS)
def test_every_compressor_name_parses(name):
    extra = ["--compressor-k", "0.01"] if name in ("topk", "randomk", "dithering") else []
    ns = launch.parse_args(["--compressor", name] + extra + ["--", "true"])
    assert launch.compression_env(ns, {})["BYTEPS_COMPRESSOR"] == name


def test_thc_flags_reach_the_environment():
    ns = launch.parse_args(["--local", "2", "--compressor", "thc", "--thc-bits", "3",
                            "--thc-granularity", "16", "--thc-overflow-prob", "1/32",
                            "--thc-seed", "7", "--", "python", "t.py"])
    env = launch.compression_env(ns, {})
    assert env == {
        "BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3", "BYTEPS_THC_GRANULARITY": "16",
        "BYTEPS_THC_OVERFLOW_PROB": repr(1 / 32), "BYTEPS_THC_SEED": "7",
        "BYTEPS_THC_ROTATION_BLOCK": "0", "BYTEPS_THC_ERROR_FEEDBACK": "1",
        "BYTEPS_COMPRESSOR_SET_BY": "bpslaunch"}
    # what the workers read back is exactly what the flags said
    assert ThcConfig.from_env(env) == ThcConfig(bits=3, granularity=16, overflow_prob=1 / 32,
                                                seed=7)


def test_thc_defaults_are_the_config_defaults():
    ns = launch.parse_args(["--compressor", "thc", "--", "true"])
    assert ThcConfig.from_env(launch.compression_env(ns, {})) == ThcConfig()


def test_thc_flags_override_environment_but_keep_the_rest():
    ns = launch.parse_args(["--thc-bits", "3", "--thc-granularity", "14", "--", "true"])
    assert ns.compressor == "thc"  # a THC flag alone turns THC on
    env = launch.compression_env(ns, {"BYTEPS_THC_SEED": "9", "BYTEPS_THC_BITS": "5"})
    assert env["BYTEPS_THC_BITS"] == "3" and env["BYTEPS_THC_SEED"] == "9"


def test_thc_flags_and_options():
    ns = launch.parse_args(["--compressor", "thc", "--thc-rotation-block", "1024",
                            "--thc-no-error-feedback", "--", "true"])
    cfg = ThcConfig.from_env(launch.compression_env(ns, {}))
    assert cfg.rotation_block == 1024 and cfg.error_feedback is False


@pytest.mark.parametrize("argv, words", [
    (["--compressor", "zip", "--", "x"], "invalid choice"),
    (["--compressor", "fp16", "--thc-bits", "4", "--", "x"], "needs --compressor thc"),
    (["--thc-bits", "9", "--", "x"], "invalid THC configuration"),
    (["--thc-bits", "4", "--thc-granularity", "7", "--", "x"], "invalid THC configuration"),
    (["--thc-overflow-prob", "1.5", "--", "x"], "strictly between 0 and 1"),
    (["--thc-overflow-prob", "abc", "--", "x"], "not a probability"),
    (["--thc-rotation-block", "1000", "--", "x"], "invalid THC configuration"),
    (["--local", "0", "--", "x"], "at least 1"),
    (["--local", "2"], "needs a command"),
    (["--servers", "2", "--", "x"], "--servers needs --local"),
    (["--compressor", "topk", "--", "x"], "needs --compressor-k"),
    (["--compressor", "thc", "--compressor-k", "3", "--", "x"], "--compressor-k applies"),
    # the server's sums of 3 workers would overflow even a 32-bit lane
    (["--local", "3", "--thc-granularity", "2147483647", "--", "x"], "invalid THC configuration"),
])
def test_bad_flags_fail_with_a_message(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        launch.parse_args(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_help_documents_flags_and_environment(capsys):
    with pytest.raises(SystemExit) as e:
        launch.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for word in ("--compressor", "--thc-bits", "--thc-granularity", "--thc-overflow-prob",
                 "--thc-seed", "--local", "--servers", "DMLC_ROLE", "DMLC_NUM_WORKER",
                 "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_WORKER_ID",
                 "BYTEPS_THC_BITS", "BYTEPS_MIN_COMPRESS_BYTES", "BYTEPS_THREADPOOL_SIZE",
                 "BYTEPS_NUMA_ON", "BYTEPS_PARTITION_BYTES"):
        assert word in text, word


# -- local cluster environment -------------------------------------------------------------------
def _specs(n=2, m=1, base=None, extra=None, tmp="/tmp/bpsXYZ"):
    base = {"PATH": "/usr/bin", "DMLC_NODE_PORT": "8080", "DMLC_ROLE": "worker",
            "DMLC_WORKER_ID": "5", "HOME": "/root", "PORT": "8080"} if base is None else base
    ports = list(range(9000, 9000 + 1 + m + n))
    return launch.local_cluster_specs(n, m, ["python", "t.py"], base, tmp, ports=ports,
                                      extra_env=extra)


def test_local_cluster_roles_ports_and_isolation():
    specs = _specs(n=3, m=2)
    assert [s.name for s in specs] == ["scheduler", "server 0", "server 1",
                                       "worker 0", "worker 1", "worker 2"]
    assert [s.role for s in specs] == ["scheduler", "server", "server",
                                       "worker", "worker", "worker"]
    ports = [s.env["DMLC_NODE_PORT"] for s in specs]
    assert ports == [str(p) for p in range(9000, 9006)]  # every process its own port
    for s in specs:
        e = s.env
        assert e["DMLC_ROLE"] == s.role
        assert e["DMLC_NUM_WORKER"] == "3" and e["DMLC_NUM_SERVER"] == "2"
        assert e["DMLC_PS_ROOT_URI"] == "127.0.0.1" and e["DMLC_PS_ROOT_PORT"] == "9000"
        assert e["DMLC_NODE_HOST"] == "127.0.0.1"
        assert e["BYTEPS_NUMA_ON"] == "0" and e["BYTEPS_FORCE_DISTRIBUTED"] == "1"
        assert int(e["BYTEPS_THREADPOOL_SIZE"]) >= 1
        assert e["HOME"] == "/root" and e["PORT"] == "8080"  # the rest passes through
        # children import byteps_thc (the patched byteps.torch does) installed or not
        import byteps_thc
        root = os.path.dirname(os.path.dirname(os.path.abspath(byteps_thc.__file__)))
        assert e["PYTHONPATH"].split(os.pathsep)[0] == root
    workers = specs[3:]
    assert [w.env["DMLC_WORKER_ID"] for w in workers] == ["0", "1", "2"]
    assert all(w.argv == ["python", "t.py"] for w in workers)
    assert all(w.env["BYTEPS_LOCAL_RANK"] == "0" and w.env["BYTEPS_LOCAL_SIZE"] == "1"
               for w in workers)
    socks = {w.env["BYTEPS_SOCKET_PATH"] for w in workers}
    assert len(socks) == 3
    assert all(p.startswith("/tmp/bpsXYZ/") for p in socks)
    assert "DMLC_WORKER_ID" not in specs[0].env and "DMLC_WORKER_ID" not in specs[1].env
    assert specs[0].argv[1:] == ["-c", "import byteps.server"]


def test_local_cluster_keeps_user_choices_and_adds_compression():
    extra = {"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "4"}
    specs = _specs(base={"BYTEPS_THREADPOOL_SIZE": "3", "OMP_NUM_THREADS": "5",
                         "BYTEPS_COMPRESSOR": "none"}, extra=extra)
    for s in specs:
        assert s.env["BYTEPS_THREADPOOL_SIZE"] == "3"
        assert s.env["BYTEPS_COMPRESSOR"] == "thc" and s.env["BYTEPS_THC_BITS"] == "4"
    assert all(s.env["OMP_NUM_THREADS"] == "5" for s in specs if s.role == "worker")


def test_cleanup_removes_the_clusters_shared_memory_only(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    specs = _specs(tmp=str(run_dir))
    mine = "/dev/shm/BytePS_ShM_127.0.0.1_9000_1_65536"
    other = "/dev/shm/BytePS_ShM_127.0.0.1_9001_1_65536"
    for f in (mine, other):
        open(f, "w").close()
    try:
        sup = launch.Supervisor([], dirs=[str(run_dir)], shm_prefixes=launch.shm_prefixes(specs))
        sup.stop_all()  # what run_local's Supervisor removes when it stops
        assert not os.path.exists(mine) and os.path.exists(other)
        assert not run_dir.exists()
    finally:
        for f in (mine, other):
            if os.path.exists(f):
                os.unlink(f)


def test_free_ports_are_distinct():
    ports = launch.free_ports(8)
    assert len(set(ports)) == 8 and all(0 < p < 65536 for p in ports)


# -- one role from the environment (upstream's way) ----------------------------------------------
_BASE = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "10.0.0.1",
         "DMLC_PS_ROOT_PORT": "9000", "BYTEPS_NUMA_ON": "0"}


def test_role_server_and_scheduler_run_the_server_loop():
    for role in ("server", "scheduler"):
        (spec,) = launch.role_specs(dict(_BASE, DMLC_ROLE=role), [])
        assert spec.argv == [sys.executable, "-c", "import byteps.server"]
        assert spec.env["DMLC_ROLE"] == role


def test_role_server_not_needed_for_one_worker():
    env = dict(_BASE, DMLC_ROLE="server", DMLC_NUM_WORKER="1")
    assert launch.role_specs(env, []) == []
    assert len(launch.role_specs(dict(env, BYTEPS_FORCE_DISTRIBUTED="1"), [])) == 1


def test_role_worker_per_gpu_and_missing_variables():
    env = dict(_BASE, DMLC_ROLE="worker", DMLC_WORKER_ID="1", NVIDIA_VISIBLE_DEVICES="0,1")
    specs = launch.role_specs(env, ["python", "t.py"])
    assert [(s.env["BYTEPS_LOCAL_RANK"], s.env["BYTEPS_LOCAL_SIZE"]) for s in specs] == \
        [("0", "2"), ("1", "2")]
    assert specs[0].argv == ["python", "t.py"]
    with pytest.raises(ValueError, match="DMLC_WORKER_ID"):
        launch.role_specs(dict(_BASE, DMLC_ROLE="worker"), ["x"])
    with pytest.raises(ValueError, match="DMLC_ROLE"):
        launch.role_specs({}, ["x"])
    (one,) = launch.role_specs(dict(_BASE, DMLC_ROLE="worker", DMLC_WORKER_ID="0"),
                               ["python t.py > log"])
    assert one.argv == ["/bin/sh", "-c", "python t.py > log"]  # upstream took a shell string


def test_run_role_env_only_worker(tmp_path):
    out = tmp_path / "env.txt"
    ns = launch.parse_args(["--compressor", "thc", "--thc-bits", "3", "--", PY, "-c",
                            f"import os; open({str(out)!r}, 'w').write(repr(dict(os.environ)))"])
    env = dict(os.environ, **_BASE, DMLC_ROLE="worker", DMLC_WORKER_ID="0")
    code = launch.run_role(ns, env, out=io.StringIO(), err=io.StringIO())
    assert code == 0
    seen = eval(out.read_text())
    assert seen["BYTEPS_COMPRESSOR"] == "thc" and seen["BYTEPS_THC_BITS"] == "3"
    assert seen["BYTEPS_LOCAL_RANK"] == "0" and seen["BYTEPS_LOCAL_SIZE"] == "1"
    assert "BYTEPS_THREADPOOL_SIZE" in seen


def test_run_role_reports_a_missing_role():
    err = io.StringIO()
    ns = launch.parse_args(["--", "true"])
    assert launch.run_role(ns, {"PATH": os.environ["PATH"]}, err=err) == 2
    assert "DMLC_ROLE" in err.getvalue()


# -- supervision with stand-in processes ---------------------------------------------------------
def _py(code):
    return [PY, "-c", textwrap.dedent(code)]


SERVE = _py("""
    import os, signal, sys, time
    # a stand-in server: leaves when the file named by STOP appears, like BytePS's after shutdown
    stop = os.environ.get("STOP")
    for _ in range(2400):  # 120 s: far longer than any bound below
        if stop and os.path.exists(stop):
            sys.exit(0)
        time.sleep(0.05)
""")


def _spec(name, role, argv, **env):
    return launch.ProcSpec(name, role, argv, dict(os.environ, **env))


def _run(specs, **kw):
    out, err = io.StringIO(), io.StringIO()
    kw.setdefault("kill_timeout", 1.0)
    t0 = time.monotonic()
    outcome = launch.Supervisor(specs, out=out, err=err, **kw).run()
    return outcome, out.getvalue(), err.getvalue(), time.monotonic() - t0


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_success_prefixes_each_line_and_waits_for_servers(tmp_path):
    stop = str(tmp_path / "stop")
    specs = [_spec("scheduler", "scheduler", SERVE, STOP=stop),
             _spec("server 0", "server", SERVE, STOP=stop)]
    for i in range(2):
        specs.append(_spec(f"worker {i}", "worker", _py(f"""
            import time
            print("hello from", {i}); print("second line", flush=True)
            time.sleep(0.2)
            open({stop!r}, "a").close()
        """)))
    outcome, out, err, took = _run(specs)
    assert outcome.code == 0 and outcome.message == ""
    lines = out.splitlines()
    assert "[worker 0] hello from 0" in lines and "[worker 1] hello from 1" in lines
    assert "[worker 1] second line" in lines
    assert took < LIMIT


def test_failing_worker_stops_everything_quickly_and_is_named(tmp_path):
    marker = tmp_path / "grandchild.pid"
    specs = [_spec("scheduler", "scheduler", SERVE), _spec("server 0", "server", SERVE),
             # worker 0 runs a grandchild that would outlive it without process groups
             _spec("worker 0", "worker", _py(f"""
                 import subprocess, sys, time
                 p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
                 open({str(marker)!r}, "w").write(str(p.pid))
                 time.sleep(300)
             """)),
             _spec("worker 1", "worker", _py("""
                 import sys, time
                 time.sleep(0.5); print("giving up"); sys.exit(3)
             """))]
    outcome, out, err, took = _run(specs)
    assert outcome.code == 3 and outcome.failed == "worker 1"
    assert "worker 1" in err and "exited with code 3" in err
    assert "[worker 1] giving up" in out
    assert took < LIMIT
    pid = int(marker.read_text())
    time.sleep(0.2)
    assert not _alive(pid), "grandchild of worker 0 survived"


def test_worker_killed_by_a_signal_is_reported():
    specs = [_spec("scheduler", "scheduler", SERVE),
             _spec("worker 0", "worker",
                   _py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")),
             _spec("worker 1", "worker", SERVE)]
    outcome, out, err, took = _run(specs)
    assert outcome.code == 128 + signal.SIGKILL and outcome.failed == "worker 0"
    assert "killed by SIGKILL" in err and took < LIMIT


def test_server_leaving_early_fails_the_cluster():
    specs = [_spec("scheduler", "scheduler", SERVE), _spec("server 0", "server", _py("pass")),
             _spec("worker 0", "worker", SERVE)]
    outcome, out, err, took = _run(specs, grace=0.5)
    assert outcome.code == 1 and outcome.failed == "worker 0"
    assert "server 0 exited" in err and "worker 0 still running" in err and took < LIMIT


def test_server_crash_fails_the_cluster_at_once():
    specs = [_spec("scheduler", "scheduler", SERVE),
             _spec("server 0", "server", _py("import time, sys; time.sleep(0.3); sys.exit(1)")),
             _spec("worker 0", "worker", SERVE)]
    outcome, out, err, took = _run(specs)
    assert outcome.code == 1 and outcome.failed == "server 0"
    assert "server 0" in err and "exited with code 1" in err and took < LIMIT


def test_roles_leaving_a_moment_apart_is_success(tmp_path):
    stop = str(tmp_path / "stop")
    specs = [_spec("server 0", "server", SERVE, STOP=stop),
             _spec("worker 0", "worker", _py(f"import time; open({stop!r}, 'a').close(); "
                                              "time.sleep(0.5)"))]
    outcome, out, err, took = _run(specs)
    assert outcome.code == 0, err


def test_hung_worker_after_others_finished_fails_after_grace():
    specs = [_spec("worker 0", "worker", _py("pass")), _spec("worker 1", "worker", SERVE)]
    outcome, out, err, took = _run(specs, grace=0.5)
    assert outcome.code == 1 and outcome.failed == "worker 1"
    assert "still running" in err and took < LIMIT


def test_timeout_stops_everything():
    specs = [_spec("scheduler", "scheduler", SERVE), _spec("worker 0", "worker", SERVE)]
    outcome, out, err, took = _run(specs, timeout=0.5)
    assert outcome.code == 124 and "timeout" in err and took < LIMIT


def test_lingering_server_is_stopped_after_workers_finish():
    specs = [_spec("server 0", "server", _py("""
                 import signal, time
                 signal.signal(signal.SIGTERM, signal.SIG_IGN)  # needs SIGKILL
                 time.sleep(60)
             """)), _spec("worker 0", "worker", _py("pass"))]
    outcome, out, err, took = _run(specs, shutdown_timeout=0.5)
    assert outcome.code == 0 and "did not exit" in err and took < LIMIT


def test_a_role_alone_runs_until_it_exits(tmp_path):
    """One `bpslaunch` per role: a server without workers in the same launcher is not stopped."""
    specs = [_spec("server", "server", _py("import time; time.sleep(1.0)"))]
    outcome, out, err, took = _run(specs, shutdown_timeout=0.2, grace=0.2)
    assert outcome.code == 0 and took >= 1.0, err
    outcome, out, err, took = _run([_spec("server", "server", _py("import sys; sys.exit(4)"))])
    assert outcome.code == 4 and "server" in err


def _marked(mark):
    """Live processes whose environment carries `mark` (zombies count as gone)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if _alive(int(pid)):
            pids.append(int(pid))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_killed_launcher_leaves_no_process(tmp_path):
    """SIGKILL to bpslaunch's process group (what a test's timeout or the OOM killer does): its
    workers and their children, each in a process group of its own, must not live on."""
    mark = f"BPS_ORPHAN_TEST={os.getpid()}.{time.monotonic_ns()}"
    env = dict(os.environ, DMLC_ROLE="worker", DMLC_NUM_WORKER="1", BYTEPS_LOCAL_SIZE="2",
               PYTHONPATH=ROOT)
    env[mark.split("=")[0]] = mark.split("=")[1]
    worker = textwrap.dedent(f"""
        import os, subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        up = os.path.join({str(tmp_path)!r}, "up." + os.environ["BYTEPS_LOCAL_RANK"])
        with open(up, "w") as f:
            f.write(str(p.pid))
        time.sleep(300)
    """)
    import subprocess
    proc = subprocess.Popen([PY, "-m", "byteps_thc.launch", PY, "-c", worker], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + LIMIT
        while not all((tmp_path / f"up.{i}").exists() for i in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        assert len(_marked(mark)) >= 5  # launcher, 2 workers, 2 grandchildren
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked(mark) == [], "processes survived the launcher"
    finally:
        for pid in _marked(mark):  # never leave anything behind, even when failing
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_watchdog_removes_the_runs_leftovers_when_the_launcher_dies(tmp_path):
    """The launcher killed outright leaves its run directory (the workers' socket directories)
    and the workers' shared memory: the watchdog, told them up front, removes both once it has
    stopped the groups. The launcher's death is its end of the pipe closing without "done"."""
    run_dir = tmp_path / "bpsRUN"
    (run_dir / "worker0").mkdir(parents=True)
    (run_dir / "worker0" / "socket").write_text("")
    prefix = f"{launch.SHM_PREFIX}test_{os.getpid()}_{time.monotonic_ns()}_"
    shm = os.path.join("/dev/shm", prefix + "0")
    open(shm, "w").close()
    other = os.path.join("/dev/shm", "keep_" + prefix)  # another name: must stay
    open(other, "w").close()
    sup = launch.Supervisor([_spec("worker 0", "worker", _py("import time; time.sleep(300)"))],
                            out=io.StringIO(), err=io.StringIO(), kill_timeout=1.0,
                            dirs=[str(run_dir)], shm_prefixes=[prefix])
    try:
        sup.start()
        worker = sup.procs["worker 0"]
        assert run_dir.exists() and os.path.exists(shm)
        sup.watchdog.stdin.close()  # the launcher is gone: no "done" will come
        sup.watchdog.wait(timeout=LIMIT)
        worker.wait(timeout=LIMIT)
        assert not run_dir.exists(), "the run directory outlived the launcher"
        assert not os.path.exists(shm), "the workers' shared memory outlived the launcher"
        assert os.path.exists(other)
    finally:
        for path in (shm, other):
            if os.path.exists(path):
                os.unlink(path)
        for proc in sup.procs.values():
            if proc.poll() is None:
                proc.kill()


def test_missing_program_is_an_error():
    specs = [_spec("worker 0", "worker", ["/nonexistent/program"])]
    with pytest.raises(RuntimeError, match="cannot start worker 0"):
        launch.Supervisor(specs, out=io.StringIO(), err=io.StringIO()).run()


def test_main_local_with_stand_in_roles(tmp_path, monkeypatch, capfd):
    """The whole --local path (ports, directories, cleanup) with a stand-in server module."""
    stop = tmp_path / "stop"
    monkeypatch.setattr(local, "server_argv", lambda python=None: SERVE)
    monkeypatch.setenv("STOP", str(stop))
    code = launch.main(["--local", "2", "--compressor", "thc", "--", PY, "-c",
                        "import os, time; time.sleep(0.2); "
                        "assert os.path.isdir(os.environ['BYTEPS_SOCKET_PATH']); "
                        "print('id', os.environ['DMLC_WORKER_ID'], "
                        "os.environ['BYTEPS_COMPRESSOR']); "
                        f"open({str(stop)!r}, 'a').close()"])
    cap = capfd.readouterr()
    assert code == 0, cap.err
    assert "[worker 0] id 0 thc" in cap.out and "[worker 1] id 1 thc" in cap.out


def test_main_local_failing_worker(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(local, "server_argv", lambda python=None: SERVE)
    code = launch.main(["--local", "2", "--", PY, "-c",
                        "import os, sys, time\n"
                        "if os.environ['DMLC_WORKER_ID'] == '1': sys.exit(5)\n"
                        "time.sleep(60)"])
    assert code == 5
    assert "worker 1" in capfd.readouterr().err


@pytest.mark.needs_fork
def test_fork_missing_finds_the_installed_fork_and_names_a_missing_part():
    assert launch.fork_missing() is None  # tests/conftest.py's own probe found the fork
    assert launch.fork_missing(("nonexistent",)) == (
        "the BytePS fork's nonexistent library is missing (make byteps)")
