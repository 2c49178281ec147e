"""harness.supervised: one command under the Supervisor, as the cluster tests run bpslaunch and
the benchmarks, with plain Python children."""
import os
import sys
import textwrap

import pytest

from harness import supervised

PY = sys.executable

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_exit_status_and_both_streams_in_order():
    code = "import sys; print('one', flush=True); print('two', file=sys.stderr, flush=True); " \
           "print('three', flush=True); sys.exit(3)"
    run = supervised.run([PY, "-c", code], timeout=60)
    assert (run.code, run.timed_out, run.outcome.kind) == (3, False, "failed")
    assert run.output == "one\ntwo\nthree\n"


def test_past_the_timeout_the_whole_group_is_stopped(tmp_path):
    pidfile = tmp_path / "grandchild"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        print("started", flush=True)
        time.sleep(300)
    """)
    run = supervised.run([PY, "-c", code], timeout=10, kill_timeout=2)  # ample for the start
    assert run.timed_out and run.outcome.kind == "timeout", run.outcome
    assert run.code < 0 and run.output == "started\n", (run.code, run.output)
    assert not _alive(run.pid) and not _alive(int(pidfile.read_text()))
