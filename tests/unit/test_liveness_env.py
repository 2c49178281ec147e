"""bpslaunch's liveness settings: BYTEPS_THC_DEAD_NODE_TIMEOUT -> ps-lite's heartbeat variables,
BYTEPS_THC_STARTUP_TIMEOUT (its default where unset), --stall-timeout -> BYTEPS_THC_STALL_TIMEOUT,
and the messages for bad values."""
import io
import os
import sys

import pytest

from byteps_thc import env, launch

PY = sys.executable
_BASE = {"DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
         "DMLC_PS_ROOT_PORT": "9000"}


STARTUP = {"BYTEPS_THC_STARTUP_TIMEOUT": "300"}  # what bpslaunch adds where it is unset
# detection off, said to ps-lite, whose defaults (for nodes started without bpslaunch) are on
OFF = {"PS_HEARTBEAT_TIMEOUT": "0", "PS_HEARTBEAT_INTERVAL": "0"}


def _env(argv, environ):
    return launch.liveness_env(launch.parse_args(argv + ["--", "true"]), environ)


def test_default_turns_heartbeats_on():
    out = _env([], {})
    assert out == {"PS_HEARTBEAT_TIMEOUT": "30", "PS_HEARTBEAT_INTERVAL": "3", **STARTUP}
    assert env.DEAD_NODE_TIMEOUT.default == 30


@pytest.mark.parametrize("timeout, interval", [("3", "1"), ("8", "1"), ("25", "2"), ("120", "12")])
def test_interval_is_a_tenth_of_the_timeout_and_at_least_one_second(timeout, interval):
    out = _env([], {"BYTEPS_THC_DEAD_NODE_TIMEOUT": timeout})
    assert out == {"PS_HEARTBEAT_TIMEOUT": timeout, "PS_HEARTBEAT_INTERVAL": interval, **STARTUP}


def test_zero_turns_detection_off():
    assert _env([], {"BYTEPS_THC_DEAD_NODE_TIMEOUT": "0"}) == {**OFF, **STARTUP}
    assert _env([], {"PS_HEARTBEAT_TIMEOUT": "0"}) == {"PS_HEARTBEAT_INTERVAL": "0", **STARTUP}


def test_the_users_ps_heartbeat_variables_win():
    assert _env([], {"PS_HEARTBEAT_TIMEOUT": "50", "PS_HEARTBEAT_INTERVAL": "7"}) == STARTUP
    assert _env([], {"PS_HEARTBEAT_TIMEOUT": "50"}) == {"PS_HEARTBEAT_INTERVAL": "5", **STARTUP}
    assert _env([], {"PS_HEARTBEAT_INTERVAL": "2"}) == {"PS_HEARTBEAT_TIMEOUT": "30", **STARTUP}


def test_stall_timeout_flag():
    out = _env(["--stall-timeout", "15"], {"BYTEPS_THC_DEAD_NODE_TIMEOUT": "0"})
    assert out == {"BYTEPS_THC_STALL_TIMEOUT": "15", **OFF, **STARTUP}
    assert env.STALL_TIMEOUT.default == 0 and env.STALL_WARN.default == 60


def test_startup_timeout_default_and_the_users_value():
    assert env.STARTUP_TIMEOUT.default == 300
    assert _env([], {"BYTEPS_THC_DEAD_NODE_TIMEOUT": "0"}) == {**OFF, **STARTUP}
    # the user's value is in the environment already; ps-lite reads it there
    assert _env([], {"BYTEPS_THC_DEAD_NODE_TIMEOUT": "0", "BYTEPS_THC_STARTUP_TIMEOUT": "7"}) == OFF


@pytest.mark.parametrize("name, value", [("BYTEPS_THC_DEAD_NODE_TIMEOUT", "2"),
                                         ("BYTEPS_THC_STARTUP_TIMEOUT", "-1"),
                                         ("BYTEPS_THC_STARTUP_TIMEOUT", "86401"),
                                         ("BYTEPS_THC_DEAD_NODE_TIMEOUT", "soon"),
                                         ("BYTEPS_THC_STALL_WARN", "-1"),
                                         ("BYTEPS_THC_STALL_TIMEOUT", "x")])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        _env([], {name: value})


def test_bad_stall_timeout_flag_fails_parsing(capsys):
    with pytest.raises(SystemExit):
        launch.parse_args(["--stall-timeout", "0", "--", "true"])
    assert "--stall-timeout" in capsys.readouterr().err


def test_role_mode_passes_them_to_the_process_and_rejects_bad_ones(tmp_path):
    out = tmp_path / "env.txt"
    ns = launch.parse_args(["--stall-timeout", "12", "--", PY, "-c",
                            f"import os; open({str(out)!r}, 'w').write(repr(dict(os.environ)))"])
    base = dict(os.environ, **_BASE, DMLC_ROLE="worker", BYTEPS_THC_DEAD_NODE_TIMEOUT="20")
    for k in ("PS_HEARTBEAT_TIMEOUT", "PS_HEARTBEAT_INTERVAL"):
        base.pop(k, None)
    assert launch.run_role(ns, base, out=io.StringIO(), err=io.StringIO()) == 0
    seen = eval(out.read_text())
    assert (seen["PS_HEARTBEAT_TIMEOUT"], seen["PS_HEARTBEAT_INTERVAL"]) == ("20", "2")
    assert seen["BYTEPS_THC_STALL_TIMEOUT"] == "12"
    err = io.StringIO()
    bad = dict(base, BYTEPS_THC_DEAD_NODE_TIMEOUT="1")
    assert launch.run_role(ns, bad, out=io.StringIO(), err=err) == 2
    assert "BYTEPS_THC_DEAD_NODE_TIMEOUT='1'" in err.getvalue()


def test_role_mode_propagates_the_exit_status():
    ns = launch.parse_args(["--", PY, "-c", "import sys; sys.exit(3)"])
    env_ = dict(os.environ, **_BASE, DMLC_ROLE="worker")
    assert launch.run_role(ns, env_, out=io.StringIO(), err=io.StringIO()) == 3
