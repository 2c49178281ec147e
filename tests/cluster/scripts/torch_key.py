"""A short training run for the cluster-key tests (tests/cluster/test_cluster_key.py).

Every rank trains a small MLP on fixed data and pushes a MARKER tensor (one float32 constant)
each step, then prints its parameters' digest. Run inside the cluster's own network namespace
(as root), worker 0 can also:
- --capture: record every frame on the loopback interface while it trains (AF_PACKET) and print
  whether the MARKER's bytes were seen in the clear;
- --attack: after the first step, while the other worker waits in its push_pull, attack every
  listening port of the namespace (they are all the cluster's): raw bytes to each, and nodes
  without the key, or with another key, that try to join as a worker and as a server (with a
  startup timeout of 120 s, which such a node must not need). Each attempt prints one ATTACK line
  with its exit status, its seconds and the last lines of its output, and the attack ends with
  one giving its seconds in all (the nodes' refusal lines are rate-limited per minute).
"""
import argparse
import hashlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch

import byteps.torch as bps

MARKER_VALUE = 1234.5678  # float32 bytes 2b 52 9a 44
MARKER_FLOATS = 4096      # 16 KiB: under BYTEPS_MIN_COMPRESS_BYTES, so pushed as it is
PATTERN = torch.full((64,), MARKER_VALUE).numpy().tobytes()  # 256 bytes that must not leak
CAPTURE_LIMIT = 256 << 20

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--capture", action="store_true")
parser.add_argument("--attack", action="store_true")
args = parser.parse_args()


def capture(stop, frames):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
    s.bind(("lo", 0))
    s.settimeout(0.2)
    size = 0
    while not stop.is_set() and size < CAPTURE_LIMIT:
        try:
            data = s.recv(1 << 17)
        except socket.timeout:
            continue
        frames.append(data)
        size += len(data)
    s.close()


def listening_ports():
    """Every TCP port in LISTEN state in this network namespace."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def raw_bytes(port):
    """Random bytes to `port` until the node closes the connection (or 16 KiB went out)."""
    rng = random.Random(port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            for _ in range(4):
                c.sendall(bytes(rng.randrange(256) for _ in range(4096)))
    except OSError:
        pass  # reset by the node: what a refusal looks like from here


def intruder(role, key):
    """A node of `role` that tries to join this cluster with `key` (None: without one)."""
    # this worker's environment, less its key and its port (ps-lite picks a free one)
    env = {k: v for k, v in os.environ.items()
           if k not in ("BYTEPS_THC_CLUSTER_KEY", "DMLC_NODE_PORT")}
    env.update(DMLC_ROLE=role, DMLC_WORKER_ID="7", BYTEPS_SOCKET_PATH=tempfile.mkdtemp(),
               BYTEPS_THC_STARTUP_TIMEOUT="120")
    if key:
        env["BYTEPS_THC_CLUSTER_KEY"] = key
    # a worker's ps-lite starts with its first push_pull (BytePS's lazy init)
    code = ("import torch, byteps.torch as b; b.init(); b.push_pull(torch.zeros(4), name='x')"
            if role == "worker" else "import byteps.server")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=150)
    seconds = time.monotonic() - t0
    lines = [ln for ln in (p.stdout + p.stderr).strip().splitlines()
             if not ln.startswith(("[bt]", "Stack trace"))]
    tail = " | ".join(lines[-3:])
    return p.returncode, seconds, tail


def attack():
    t0 = time.monotonic()
    for port in listening_ports():
        raw_bytes(port)
        print(f"ATTACK raw port={port} sent", flush=True)
    other = os.path.join(tempfile.mkdtemp(), "other.key")
    subprocess.run([sys.executable, "-m", "byteps_thc.launch", "--new-cluster-key", other],
                   check=True, capture_output=True)
    for role in ("worker", "server"):
        for name, key in (("nokey", None), ("otherkey", other)):
            rc, seconds, tail = intruder(role, key)
            print(f"ATTACK {role} {name} rc={rc} s={seconds:.1f} :: {tail}", flush=True)
    print(f"ATTACK done s={time.monotonic() - t0:.1f}", flush=True)


bps.init()
torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
bps.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(99)
data, target = torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)
marker = torch.full((MARKER_FLOATS,), MARKER_VALUE)

stop, frames, watcher = threading.Event(), [], None
if args.capture and bps.rank() == 0:
    watcher = threading.Thread(target=capture, args=(stop, frames), daemon=True)
    watcher.start()
for step in range(args.steps):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    opt.step()
    bps.push_pull(marker.clone(), average=True, name="marker")
    if step == 0 and args.attack and bps.rank() == 0:
        attack()
if watcher is not None:
    stop.set()
    watcher.join()
    seen = sum(len(f) for f in frames)
    print(f"CAPTURE frames={len(frames)} bytes={seen} "
          f"marker_seen={any(PATTERN in f for f in frames)}", flush=True)
blob = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
print(f"rank {bps.rank()} digest {hashlib.sha256(blob).hexdigest()[:16]}", flush=True)
bps.shutdown()
