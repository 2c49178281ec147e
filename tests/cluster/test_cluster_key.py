"""The cluster key (docs/SECURITY.md) on real `bpslaunch --local 2` clusters.

tests/cluster/scripts/torch_key.py trains a small MLP and pushes a known constant each step;
its ranks print their parameters' digests. Checked from outside the code under test:
- a keyed cluster's digests equal an unkeyed one's (THC and uncompressed);
- in the cluster's own network namespace (root): what the loopback interface carried holds the
  constant's bytes in an unkeyed run (the control) and not in a keyed one; nodes without the key
  or with another key, as a worker and as a server, cannot register and end at once with a
  message that names the key; raw bytes to every listening port change nothing; the scheduler
  and the server log each refused peer's address and cause once a minute, and count them all;
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
# what a keyed node logs of a connection it refused in the handshake, and as it stops, in all
# (cluster_key.cc: OnRefused, LogRefusalSummary)
KINDS = ("not a ZeroMQ peer", "no cluster key", "another key")
REFUSAL = re.compile(r"^\[(?P<node>[a-z0-9 ]+)\] .*ps-lite: the (?:scheduler|server|worker) at "
                     r"(?P<at>\S+) refused a connection from (?P<peer>\S+): "
                     r"(?P<kind>" + "|".join(KINDS) + r") \(", re.M)
SUMMARY = re.compile(r"^\[(?P<node>[a-z0-9 ]+)\] .*ps-lite: the (?:scheduler|server|worker) at "
                     r"(?P<at>\S+) refused \d+ connections? in the handshake while it ran: "
                     r"(?P<kinds>[^;]+); from (?P<peers>.*)$", re.M)


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
    # its own nodes' connections are no refusals (nor is anything in an unkeyed cluster)
    assert "refused" not in keyed.output and "refused" not in plain.output, keyed.output[-3000:]
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


def _refusals(out, node):
    """What `node` ("scheduler", "server 0") logged of the connections it refused: a list of
    (kind, peer, its address) a line, and its summary's count of each kind (None: no summary)."""
    lines = [(m["kind"], m["peer"], m["at"]) for m in REFUSAL.finditer(out) if m["node"] == node]
    summaries = [m for m in SUMMARY.finditer(out) if m["node"] == node]
    assert len(summaries) <= 1, summaries
    counts = None
    if summaries:
        counts = {kind: int(n) for n, kind in
                  re.findall(r"(\d+) (" + "|".join(KINDS) + ")", summaries[0]["kinds"])}
        assert summaries[0]["peers"].startswith("1 address (127.0.0.1)"), summaries[0][0]
    return lines, counts


def _attack_lines_allowed(out):
    """How many lines one peer address and cause may get within the attack: one a minute."""
    done = re.search(r"^\[worker 0\] ATTACK done s=([\d.]+)$", out, re.M)
    assert done, out[-3000:]
    return 1 + int(float(done.group(1)) // 60)


def test_the_scheduler_logs_each_refused_peer_and_cause_once_and_counts_all(attacked):
    out = attacked[1].output
    port = re.search(r"local cluster: scheduler 127\.0\.0\.1:(\d+)", out)
    assert port, out[-3000:]
    lines, counts = _refusals(out, "scheduler")
    assert lines and {at for _, _, at in lines} == {f"127.0.0.1:{port[1]}"}, lines
    assert {peer for _, peer, _ in lines} == {"127.0.0.1"}, lines  # every intruder's address
    # raw bytes, the nodes without a key and those with another key: each cause named
    per_kind = {kind: sum(k == kind for k, _, _ in lines) for kind in KINDS}
    most = _attack_lines_allowed(out)
    assert all(1 <= n <= most for n in per_kind.values()), (per_kind, most)
    # all of them counted, far more than logged: each node with another key had at least the
    # 3 connections of its handshake check refused, each without a key one or more
    assert counts is not None, out[-3000:]
    assert counts["another key"] >= 6 and counts["no cluster key"] >= 2, counts
    # the raw bytes' one connection to this port; a node without a key is a ZeroMQ peer however
    # its greeting ended (it may close on reading CURVE before its own greeting is out)
    assert counts["not a ZeroMQ peer"] == 1, counts
    assert counts["another key"] > per_kind["another key"], (counts, per_kind)
    assert counts["no cluster key"] > per_kind["no cluster key"], (counts, per_kind)


def test_a_server_logs_the_raw_bytes_sent_to_its_port(attacked):
    # the intruding nodes never learn a server's address: only the raw bytes reach its port
    out = attacked[1].output
    lines, counts = _refusals(out, "server 0")
    assert [(kind, peer) for kind, peer, _ in lines] == [("not a ZeroMQ peer", "127.0.0.1")], lines
    assert re.fullmatch(r"127\.0\.0\.1:\d+", lines[0][2]), lines
    assert counts == {"not a ZeroMQ peer": 1}, out[-3000:]


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
