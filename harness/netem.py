"""An emulated cluster network on one Linux host: network namespaces, a bridge, tbf rate limits.

Used by benchmarks/bench_network.py and benchmarks/bench_ddp.py (and the smoke tests of
tests/cluster/test_bench_network.py). Needs root and iproute2 (`ip`, `tc`).

Topology, every piece in a namespace this module creates (nothing is added to the host's own
namespace):

    <prefix>-hub:  bridge br0 with one port per node (p0, p1, ...)
    <prefix>-<node>: one per node, interface eth0, veth peer of its hub port

Each node's link is full duplex at the rate asked for: a `tbf` qdisc on the node's eth0 limits what
it sends (upload) and one on its hub port limits what it receives (download), like a switch port.
Optional added latency (netem) is one-way on each direction; kernels without sch_netem refuse it
with a clear message.

Addresses come only from the RFC 2544 benchmarking range 198.18.0.0/15 (default 198.18.0.0/24);
anything else is refused. Names carry a unique prefix (`thcb<pid>` by default) so that several runs
can coexist and `cleanup_stale()` can find the leftovers of a run that was killed with SIGKILL.

    with EmulatedNetwork(["server", "w0", "w1"]) as net:
        net.set_rate(1.0)                       # Gbit/s, every link
        net.popen("w0", ["python", "x.py"])     # runs inside the namespace of w0
        net.counters("w0")                      # {"rx_bytes": ..., "tx_bytes": ...}
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from byteps_thc.launch.supervisor import kill_group

BENCH_RANGE = ipaddress.ip_network("198.18.0.0/15")   # RFC 2544: network benchmarking
DEFAULT_SUBNET = "198.18.0.0/24"
NAME_PREFIX = "thcb"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


class NetemError(RuntimeError):
    """A step of building or changing the emulated network failed (message says which)."""


def available() -> Optional[str]:
    """None when this host can build the network, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def check_subnet(subnet: str) -> ipaddress.IPv4Network:
    """The subnet, if it lies inside 198.18.0.0/15; ValueError otherwise."""
    net = ipaddress.ip_network(subnet, strict=True)
    if net.version != 4 or not net.subnet_of(BENCH_RANGE):
        raise ValueError(f"subnet {subnet} is outside the benchmarking range {BENCH_RANGE} "
                         "(RFC 2544); only addresses from that range may be used")
    return net


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise NetemError(f"`{' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def list_namespaces() -> List[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = NAME_PREFIX) -> List[str]:
    """Remove namespaces `<prefix><pid>-*` whose creating process is gone (a killed run)."""
    removed = []
    pat = re.compile(rf"^{re.escape(prefix)}(\d+)-")
    for ns in list_namespaces():
        m = pat.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_processes(ns)
            if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
                removed.append(ns)
    return removed


def _kill_namespace_processes(ns: str) -> None:
    p = _run(["ip", "netns", "pids", ns], check=False)
    for tok in p.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def parse_rates(text: str) -> List[float]:
    """Link rates in Gbit/s, comma-separated ("1,10,25"), as argparse's type=: at least one, each
    positive (what set_rate takes), so that a bad list stops the run before any namespace exists."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: positive Gbit/s, comma-separated")
    return rates


def tbf_args(rate_gbit: float) -> List[str]:
    """tbf parameters for a link of `rate_gbit`: bucket of about 1 ms of traffic (at least 2 GSO
    segments of 64 KiB, or TCP stalls), queue bounded at 20 ms."""
    rate_bps = rate_gbit * 1e9
    burst = max(2 * 65536 + 4096, int(rate_bps / 8 * 1e-3))
    return ["rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "20ms"]


class EmulatedNetwork:
    """Namespaces for `nodes` joined by a bridge; see the module docstring."""

    def __init__(self, nodes: Sequence[str], prefix: Optional[str] = None,
                 subnet: str = DEFAULT_SUBNET, mtu: int = 1500):
        err = available()
        if err:
            raise NetemError(err)
        self.subnet = check_subnet(subnet)
        nodes = list(nodes)
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"node names must be distinct: {nodes}")
        for n in nodes:
            if not _NAME_RE.match(n) or n == "hub":
                raise ValueError(f"node name {n!r}: 1-8 lowercase letters/digits, not 'hub'")
        hosts = list(self.subnet.hosts())
        if len(nodes) > len(hosts):
            raise ValueError(f"{len(nodes)} nodes do not fit in {self.subnet}")
        self.prefix = prefix or f"{NAME_PREFIX}{os.getpid()}"
        self.nodes = nodes
        self.mtu = mtu
        self.addr: Dict[str, str] = {n: str(hosts[i]) for i, n in enumerate(nodes)}
        self.hub = f"{self.prefix}-hub"
        self.created: List[str] = []
        self.rate_gbit: Optional[float] = None
        self.latency_ms = 0.0
        self._procs: List[subprocess.Popen] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def port(self, node: str) -> str:
        return f"p{self.nodes.index(node)}"

    # -- lifecycle ------------------------------------------------------------------------------
    def create(self) -> "EmulatedNetwork":
        try:
            self._add_ns(self.hub)
            _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
            for node in self.nodes:
                ns = self.ns(node)
                self._add_ns(ns)
                # both ends are created directly in their namespaces: no name ever exists on
                # the host
                _run(["ip", "link", "add", "eth0", "netns", ns, "mtu", str(self.mtu),
                      "type", "veth",
                      "peer", "name", self.port(node), "netns", self.hub, "mtu", str(self.mtu)])
                _run(["ip", "-n", self.hub, "link", "set", self.port(node), "master", "br0", "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.addr[node]}/{self.subnet.prefixlen}",
                      "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self.created.append(ns)

    def destroy(self) -> None:
        """Stop every process started here, then remove every namespace created (idempotent)."""
        for p in self._procs:
            kill_group(p)
        self._procs = []
        for ns in reversed(self.created):
            _kill_namespace_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)
        self.created = []

    def __enter__(self) -> "EmulatedNetwork":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # -- shaping --------------------------------------------------------------------------------
    def set_rate(self, rate_gbit: float, latency_ms: float = 0.0) -> None:
        """Every link full duplex at `rate_gbit`, with `latency_ms` added each way (netem)."""
        if rate_gbit <= 0:
            raise ValueError(f"rate {rate_gbit} Gbit/s must be positive")
        for node in self.nodes:
            for ns, dev in ((self.ns(node), "eth0"), (self.hub, self.port(node))):
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
                if latency_ms > 0:
                    p = _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                              "netem", "delay", f"{latency_ms}ms"], check=False)
                    if p.returncode != 0:
                        raise NetemError("added latency needs the netem qdisc, which this kernel "
                                         f"lacks (sch_netem): {p.stderr.strip()}")
                    _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle",
                          "10:", "tbf"] + tbf_args(rate_gbit))
                else:
                    _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf"]
                         + tbf_args(rate_gbit))
        self.rate_gbit = rate_gbit
        self.latency_ms = latency_ms

    # -- processes and counters -----------------------------------------------------------------
    def kill_all(self) -> None:
        """SIGKILL every process still inside any of the namespaces (after a run)."""
        for p in self._procs:
            kill_group(p, timeout=1.0)
        self._procs = [p for p in self._procs if p.poll() is None]
        for ns in self.created:
            _kill_namespace_processes(ns)

    def argv(self, node: str, argv: Sequence[str]) -> List[str]:
        return ["ip", "netns", "exec", self.ns(node)] + list(argv)

    def popen(self, node: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start `argv` inside `node`'s namespace, in its own process group (stopped on destroy)."""
        kw.setdefault("start_new_session", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.argv(node, argv), **kw)
        self._procs.append(p)
        return p

    def counters(self, node: str) -> Dict[str, int]:
        """Bytes and packets eth0 of `node` received and sent (the kernel's interface counters)."""
        p = _run(["ip", "-n", self.ns(node), "-j", "-s", "link", "show", "dev", "eth0"])
        st = json.loads(p.stdout)[0]["stats64"]
        return {"rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"],
                "rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"],
                "tx_dropped": st["tx"]["dropped"]}


class CleanupOnSignal:
    """Turns SIGTERM/SIGHUP into KeyboardInterrupt while active, so `finally` blocks run and the
    namespaces go away when a run is interrupted (SIGINT already raises it)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self._old = {}
        for s in self.SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    @staticmethod
    def _handler(signum, frame):
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


# ------------------------------------------------------------------------------------------------
# Self-test: how fast does a tbf-limited link really carry TCP?
# ------------------------------------------------------------------------------------------------
_SINK = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None; buf = bytearray(1 << 20)
while True:
    k = c.recv_into(buf)
    if not k: break
    if t0 is None: t0 = time.monotonic()
    n += k
print(n, time.monotonic() - t0, flush=True)
"""
_SOURCE = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = b"\0" * (4 << 20); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end: c.sendall(buf)
c.close()
"""


def measure_tcp(net: EmulatedNetwork, src: str, dst: str, seconds: float = 2.0,
                port: int = 5201) -> float:
    """Gbit/s one TCP stream carries from `src` to `dst` (payload bytes over receive time)."""
    sink = net.popen(dst, [sys.executable, "-c", _SINK, net.addr[dst], str(port)],
                     stdout=subprocess.PIPE, text=True)
    try:
        if sink.stdout.readline().strip() != "ready":
            raise NetemError("TCP sink did not start")
        src_p = net.popen(src, [sys.executable, "-c", _SOURCE, net.addr[dst], str(port),
                                str(seconds)])
        src_p.wait(timeout=seconds + 30)
        out = sink.communicate(timeout=30)[0].split()
        nbytes, secs = int(out[0]), float(out[1])
        return nbytes * 8 / secs / 1e9
    finally:
        kill_group(sink)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.netem",
                                 description="Check the emulated network: TCP rate under tbf.")
    ap.add_argument("--rates", type=parse_rates, default="1,10,25",
                    help="Gbit/s, comma-separated (1,10,25)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--cleanup-stale", action="store_true",
                    help="only remove namespaces left by killed runs")
    a = ap.parse_args(argv)
    if a.cleanup_stale:
        print("removed:", " ".join(cleanup_stale()) or "nothing")
        return 0
    try:
        with CleanupOnSignal(), EmulatedNetwork(["a", "b"]) as net:
            for r in a.rates:
                net.set_rate(r)
                got = measure_tcp(net, "a", "b", a.seconds)
                print(f"tbf {r:g} Gbit/s: TCP carried {got:.2f} Gbit/s ({got / r:.0%})",
                      flush=True)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e or 'SIGINT'}); namespaces removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
