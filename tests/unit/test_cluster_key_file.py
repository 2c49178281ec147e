"""bpslaunch's cluster key files: --new-cluster-key writes one, --cluster-key and
BYTEPS_THC_CLUSTER_KEY are checked before anything starts (ps-lite's own check of the same rules
runs in tests/cluster/test_cluster_key.py), and the flags that do not go together are refused."""
import io
import os
import re
import stat
import sys

import pytest

from byteps_thc import launch
from byteps_thc.launch import cluster_key


def test_new_key_is_owner_only_and_one_line_of_64_hex_digits(tmp_path):
    path = launch.new_key(str(tmp_path / "k"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lines = [ln for ln in open(path).read().splitlines() if not ln.startswith("#")]
    assert len(lines) == 1 and re.fullmatch(r"[0-9a-f]{64}", lines[0])
    other = launch.new_key(str(tmp_path / "k2"))
    assert open(other).read() != open(path).read()  # fresh randomness each time


def test_new_key_never_replaces_a_file(tmp_path):
    path = tmp_path / "k"
    path.write_text("precious")
    with pytest.raises(ValueError, match="exists: a new key would lock out"):
        launch.new_key(str(path))
    assert path.read_text() == "precious"


def test_the_command_writes_the_key_and_names_it(tmp_path, capsys):
    path = tmp_path / "cluster.key"
    assert launch.main(["--new-cluster-key", str(path)]) == 0
    assert f"--cluster-key {path}" in capsys.readouterr().err
    assert launch.check_key(str(path)) == str(path)
    assert launch.main(["--new-cluster-key", str(path)]) == 2
    assert "exists" in capsys.readouterr().err


def _key_file(tmp_path, text, mode=0o600):
    path = tmp_path / "key"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_others_can_read_or_change_is_refused_with_the_chmod(tmp_path, mode):
    path = _key_file(tmp_path, "a" * 64 + "\n", mode)
    with pytest.raises(ValueError, match=rf"mode {mode:04o} lets others .*`chmod 600 {path}`"):
        launch.check_key(path)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "a" * 63 + "\n", "a" * 65 + "\n",
                                  "g" * 64 + "\n", "a" * 64 + "\n" + "b" * 64 + "\n"])
def test_a_malformed_key_file_is_refused(tmp_path, text):
    with pytest.raises(ValueError, match="not a cluster key file .*--new-cluster-key"):
        launch.check_key(_key_file(tmp_path, text))


def test_a_missing_key_file_says_how_to_make_one(tmp_path):
    with pytest.raises(ValueError, match="cannot read it .*--new-cluster-key FILE"):
        launch.check_key(str(tmp_path / "nothing"))


def test_comments_and_blank_lines_are_allowed(tmp_path):
    path = _key_file(tmp_path, "# mine\n\n  " + "0F" * 32 + "  \n# end\n")
    assert launch.check_key(path) == path


def test_key_env_flag_environment_and_secure(tmp_path):
    flag = launch.new_key(str(tmp_path / "flag"))
    environ = {"BYTEPS_THC_CLUSTER_KEY": launch.new_key(str(tmp_path / "env"))}
    assert cluster_key.key_env(flag, False, environ) == {"BYTEPS_THC_CLUSTER_KEY": flag}
    assert cluster_key.key_env(None, False, environ) == environ
    assert cluster_key.key_env(None, False, {}) == {}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    made = cluster_key.key_env(None, True, {}, str(run_dir))["BYTEPS_THC_CLUSTER_KEY"]
    assert os.path.dirname(made) == str(run_dir) and launch.check_key(made) == made


def test_a_bad_key_in_the_environment_stops_a_role_before_it_starts(tmp_path):
    bad = _key_file(tmp_path, "a" * 64 + "\n", 0o644)
    err = io.StringIO()
    ns = launch.parse_args(["--", sys.executable, "-c", "raise SystemExit(3)"])
    environ = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
               "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
               "BYTEPS_THC_CLUSTER_KEY": bad}
    assert launch.run_role(ns, environ, err=err) == 2
    assert "chmod 600" in err.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["--new-cluster-key", "k", "--", "true"], "writes a key and exits"),
    (["--new-cluster-key", "k", "--cluster-key", "j"], "writes a key and exits"),
    (["--secure", "--", "true"], "--secure needs --local N"),
    (["--local", "2", "--secure", "--cluster-key", "k", "--", "true"],
     "give --cluster-key FILE or"),
])
def test_flags_that_do_not_go_together(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        launch.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
