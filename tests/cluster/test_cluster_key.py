"""The cluster key (docs/SECURITY.md) on real `bpslaunch --local 2` clusters.

tests/cluster/scripts/torch_key.py trains a small MLP and pushes a known constant each step;
its ranks print their parameters' digests. Checked from outside the code under test:
- a keyed cluster's digests equal an unkeyed one's (THC and uncompressed);
- in the cluster's own network namespace (root): what the loopback interface carried holds the
  constant's bytes in an unkeyed run (the control) and not in a keyed one; nodes without the key
  or with another key, as a worker and as a server, cannot register and end at once with a
  message that names the key; raw bytes to every listening port change nothing;
- a node started without bpslaunch checks the key file itself (ps-lite's cluster_key.cc).
"""
import os
import re
import subprocess
import sys

import pytest

import test_compressor_flag as flag
import test_launch_local as launch_local
from byteps_thc import launch
from test_launch_local import FORK_DIR, ROOT, pytestmark  # noqa: F401

SCRIPT = os.path.join(ROOT, "tests", "cluster", "scripts", "torch_key.py")
KEY = "BYTEPS_THC_CLUSTER_KEY"
# what a node with another key is told, and one without a key
REFUSED = {"otherkey": "refused this node's cluster key (BYTEPS_THC_CLUSTER_KEY=",
           "nokey": "refused this node, which has no cluster key"}


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return launch.new_key(str(tmp_path_factory.mktemp("key") / "cluster.key"))


def _run(argv=(), key=None, compressor=None):
    return flag.bpslaunch([SCRIPT] + list(argv), compressor=compressor, timeout=360,
                          extra_env={KEY: key} if key else None)


def _digests(run):
    found = dict(re.findall(r"rank (\d) digest ([0-9a-f]{16})", run.output))
    assert sorted(found) == ["0", "1"], run.output[-3000:]
    return found


def test_a_keyed_cluster_trains_bit_identically_to_an_unkeyed_one(key):
    plain, keyed = _run(compressor="thc"), _run(key=key, compressor="thc")
    assert f"cluster key {key}" in keyed.output and "cluster key" not in plain.output
    assert _digests(keyed) == _digests(plain)
    assert len(set(_digests(plain).values())) == 1


@pytest.fixture(scope="module")
def attacked(key):
    if flag.NETNS is None or os.geteuid() != 0:
        pytest.skip("needs root and a private network namespace (capture on lo, port scan)")
    plain = _run(["--capture"])
    attacked = _run(["--capture", "--attack"], key=key)
    return plain, attacked


def _capture(run):
    m = re.search(r"CAPTURE frames=(\d+) bytes=(\d+) marker_seen=(True|False)", run.output)
    assert m, run.output[-3000:]
    return int(m.group(2)), m.group(3) == "True"


def test_the_wire_carries_no_plaintext_with_the_key(attacked):
    plain, keyed = attacked
    seen_bytes, seen = _capture(plain)
    assert seen and seen_bytes > 0  # the control: without the key the constant is in the clear
    seen_bytes, seen = _capture(keyed)
    assert not seen and seen_bytes > 100_000


def test_nothing_from_the_intruders_reaches_the_model(attacked):
    plain, keyed = attacked
    assert _digests(keyed) == _digests(plain)


@pytest.mark.parametrize("role", ["worker", "server"])
@pytest.mark.parametrize("who", ["nokey", "otherkey"])
def test_a_node_without_the_key_cannot_register_and_is_told_why(attacked, role, who):
    line = re.search(rf"^\[worker 0\] ATTACK {role} {who} rc=(-?\d+) s=([\d.]+) :: (.*)$",
                     attacked[1].output, re.M)
    assert line, attacked[1].output[-3000:]
    rc, seconds, tail = int(line.group(1)), float(line.group(2)), line.group(3)
    assert rc == 1 and REFUSED[who] in tail and "scheduler at 127.0.0.1:" in tail, line[0]
    assert seconds < 60, line[0]  # refused in the handshake, not at its startup timeout of 120 s


def test_raw_bytes_went_to_every_port_of_the_cluster(attacked):
    # what they changed: nothing (test_nothing_from_the_intruders_reaches_the_model)
    out = attacked[1].output
    ports = re.findall(r"^\[worker 0\] ATTACK raw port=(\d+) sent$", out, re.M)
    assert len(ports) >= 4, out[-3000:]  # the scheduler, the server and both workers listen


def test_local_secure_makes_a_key_for_its_cluster_and_removes_it():
    code, out, err, _ = launch_local.bpslaunch(
        ["--local", "2", "--secure", "--", sys.executable, SCRIPT, "--steps", "2"], timeout=300)
    assert code == 0, (out + err)[-3000:]
    m = re.search(r"cluster key (\S+/cluster\.key)", err)
    assert m, err[-2000:]
    assert not os.path.exists(m.group(1))
    assert len(set(re.findall(r"rank \d digest ([0-9a-f]{16})", out + err))) == 1


def test_a_node_started_without_bpslaunch_checks_the_key_file_itself(tmp_path):
    bad = tmp_path / "key"
    bad.write_text("ab" * 32 + "\n")
    os.chmod(bad, 0o644)
    env = dict(os.environ, DMLC_ROLE="scheduler", DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1",
               DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(launch.free_ports(1)[0]),
               BYTEPS_THC_STARTUP_TIMEOUT="30", **{KEY: str(bad)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (FORK_DIR, ROOT) if p)
    p = subprocess.run([sys.executable, "-c", "import byteps.server"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"BYTEPS_THC_CLUSTER_KEY={bad}: mode 0644 lets others read or change" in p.stderr
