"""A real local BytePS cluster for tests and benchmarks: scheduler + one server from the fork build
(`python -c 'import byteps.server'`, DMLC_ROLE=scheduler/server) on 127.0.0.1, and N ps-lite clients
(harness/thc_client.cc) that push and pull exactly what BytePS workers send.

Every process runs in its own process group and is killed (group-wide) on close; every client
command has a timeout, so nothing here can hang a test run.
"""
from __future__ import annotations

import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from byteps_thc.launch.supervisor import kill_groups

ROOT = Path(__file__).resolve().parents[1]
CLIENT_SRC = ROOT / "harness" / "thc_client.cc"
THC_WIRE_SRC = (ROOT / "csrc" / "byteps" / "src" / "byteps" / "common" / "compressor" / "impl"
                / "thc_wire.cc")

# BytePS request types (the ps-lite command pairs them with the dtype) and dtypes.
DEFAULT, COMPRESSED, THC_NORM = 0, 2, 3
FLOAT32, FLOAT64 = 0, 1
PUSH_MAGIC, PULL_MAGIC, WIRE_VERSION = 0x31434854, 0x52434854, 2
# magic, status, lane_bits, num_workers, round, payload_bytes
PULL_HEADER = struct.Struct("<IiIIQQ")


def command(request_type: int, dtype: int) -> int:
    """BytePS's GetCommandType: Cantor pairing of (request type, dtype)."""
    m = request_type + dtype
    return m * (m + 1) // 2 + dtype


def serialise_kwargs(kwargs: Dict[str, str]) -> str:
    """BytePS's compressor::Serialize: "N k1 v1 k2 v2 ..."."""
    return " ".join([str(len(kwargs))] + [f"{k} {v}" for k, v in kwargs.items()])


def parse_reply(data: bytes):
    """A THC pull reply -> (header dict, body bytes)."""
    magic, status, lane_bits, n, rnd, nbytes = PULL_HEADER.unpack_from(data)
    assert magic == PULL_MAGIC, f"not a THC reply: magic {magic:#x}, {len(data)} bytes"
    body = data[PULL_HEADER.size:]
    assert len(body) == nbytes, (len(body), nbytes)
    return dict(status=status, lane_bits=lane_bits, num_workers=n, round=rnd), body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the pieces from the fork build ------------------------------------------------------------
def server_argv() -> List[str]:
    """How to start BytePS's server/scheduler (tests check that the fork is installed: the
    `needs_fork` marker of tests/conftest.py). BYTEPS_THC_SERVER_LIB may point at a server library
    to load instead (development); BYTEPS_THC_FORK_DIR at a build that `scripts/build_byteps.sh
    --target DIR` installed (the server prints where its `byteps` comes from)."""
    lib = os.environ.get("BYTEPS_THC_SERVER_LIB")
    if lib:
        code = f"import ctypes; ctypes.CDLL({lib!r}, ctypes.RTLD_GLOBAL).byteps_server()"
        return [sys.executable, "-c", code]
    if os.environ.get("BYTEPS_THC_FORK_DIR"):  # first on the PYTHONPATH of Cluster's processes
        code = ("import byteps; print('byteps from', byteps.__file__, flush=True); "
                "import byteps.server")
        return [sys.executable, "-c", code]
    return [sys.executable, "-c", "import byteps.server"]


def pslite_dir() -> Optional[Path]:
    """The ps-lite the fork build compiled (headers, build/libps.a, deps/lib/libzmq.a)."""
    cands = []
    if os.environ.get("BYTEPS_THC_PSLITE"):
        cands.append(Path(os.environ["BYTEPS_THC_PSLITE"]))
    # scripts/build_byteps.sh keeps its newest build tree in .cache/byteps/build/<key>/
    trees = sorted((ROOT / ".cache" / "byteps" / "build").glob("*/3rdparty/ps-lite"),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    cands += trees
    for c in cands:
        if (c / "build" / "libps.a").is_file() and (c / "deps" / "lib" / "libzmq.a").is_file():
            return c
    return None


def build_client(out_dir: Path) -> Optional[Path]:
    """Compiles the test client against the fork build's ps-lite and the codec core (cached)."""
    if os.environ.get("THC_TEST_CLIENT"):
        return Path(os.environ["THC_TEST_CLIENT"])
    ps = pslite_dir()
    if ps is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / "thc_client"
    # the codec's build description: the core's sources and flags, as every build of it uses them
    import importlib.util
    spec = importlib.util.spec_from_file_location("build_facts", ROOT / "csrc" / "build_facts.py")
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    core = [Path(p) for p in facts.core_sources(ROOT / "csrc", cores=("thc",))]
    sources = [CLIENT_SRC, THC_WIRE_SRC] + core
    # the headers they include: the core's and the ones it shares with LHC (csrc/common)
    headers = sorted((ROOT / "csrc" / "thc").glob("*.h")) + sorted(
        (ROOT / "csrc" / "common").glob("*.h"))
    inputs = sources + headers + [ps / "build" / "libps.a", ROOT / "csrc" / "build_facts.py"]
    if exe.is_file() and exe.stat().st_mtime > max(p.stat().st_mtime for p in inputs):
        return exe
    objs = []
    for src in core:  # the codec core, each file with its flags (its ISA's included)
        obj = out_dir / f"core_{src.stem}.o"
        subprocess.run(["nice", "g++", *facts.core_flags(src), "-fPIC", f"-I{ROOT / 'csrc'}",
                        "-c", str(src), "-o", str(obj)], check=True)
        objs.append(str(obj))
    subprocess.run(["nice", "g++", *facts.CODEC, f"-I{ROOT / 'csrc' / 'byteps' / 'src'}",
                    f"-I{ROOT / 'csrc'}", f"-I{ps / 'include'}", str(CLIENT_SRC),
                    str(THC_WIRE_SRC), *objs, str(ps / "build" / "libps.a"),
                    # libsodium: ZeroMQ's CURVE and ps-lite's cluster key (patch 0022)
                    str(ps / "deps" / "lib" / "libzmq.a"), "-lsodium", "-lpthread", "-lrt",
                    "-o", str(exe)],
                   check=True)
    return exe


# ---- processes ---------------------------------------------------------------------------------
class Client:
    """One ps-lite worker process driven line by line."""

    def __init__(self, exe: Path, env: Dict[str, str], log: Path):
        self.log = log
        self.proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log, "wb"),
                                     text=True, bufsize=1, start_new_session=True)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def cmd(self, line: str, timeout: float = 60.0) -> str:
        if self.proc.poll() is not None:
            raise RuntimeError(f"client exited ({self.proc.returncode}); log:\n{self.tail()}")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        try:
            out = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"client gave no answer to {line[:80]!r} in {timeout}s; "
                               f"log:\n{self.tail()}") from None
        if out is None:
            raise RuntimeError(f"client died on {line[:80]!r}; log:\n{self.tail()}")
        if not out.startswith("ok"):
            raise RuntimeError(f"client: {out}")
        return out[2:].strip()

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""


class Cluster:
    """scheduler + 1 server + n clients on 127.0.0.1."""

    def __init__(self, num_workers: int, workdir: Path, client_exe: Path, argv: Sequence[str],
                 extra_env: Optional[Dict[str, str]] = None, startup_timeout: float = 60.0):
        self.n = num_workers
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DMLC_", "BYTEPS_", "PS_"))}
        base.update({
            "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": "1",
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NODE_HOST": "127.0.0.1", "BYTEPS_SERVER_ENGINE_THREAD": "2",
            "BYTEPS_LOG_LEVEL": "INFO", "PS_VERBOSE": "0",
        })
        if os.environ.get("BYTEPS_THC_SERVER_LIB"):
            base["BYTEPS_THC_SERVER_LIB"] = os.environ["BYTEPS_THC_SERVER_LIB"]
        fork_dir = os.environ.get("BYTEPS_THC_FORK_DIR")  # server_argv: byteps from that build
        if fork_dir:
            base["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.abspath(fork_dir), base.get("PYTHONPATH")) if p)
        base.update(extra_env or {})
        self.procs: List[subprocess.Popen] = []
        self.server_log = self.dir / "server.log"
        for role, log in (("scheduler", self.dir / "scheduler.log"), ("server", self.server_log)):
            env = dict(base, DMLC_ROLE=role)
            self.procs.append(subprocess.Popen(list(argv), env=env, stdout=open(log, "wb"),
                                               stderr=subprocess.STDOUT, start_new_session=True))
        self.server = self.procs[1]
        self.clients = [Client(client_exe, dict(base, DMLC_ROLE="worker"),
                               self.dir / f"client{i}.log")
                        for i in range(num_workers)]
        try:
            hello = self.all(["hello"] * num_workers, timeout=startup_timeout)
        except Exception as e:
            logs = "".join(f"\n--- {p.name}:\n" + p.read_bytes()[-2000:].decode(errors="replace")
                           for p in (self.dir / "scheduler.log", self.server_log))
            self.close()
            raise RuntimeError(f"the cluster did not start: {e}{logs}") from None
        by_rank = sorted(zip((int(h.split()[0]) for h in hello), self.clients), key=lambda t: t[0])
        self.clients = [c for _, c in by_rank]  # clients[i] has ps-lite rank i

    def all(self, lines: Sequence[str], timeout: float = 60.0) -> List[str]:
        """Runs lines[i] on client i, all at once (BytePS pushes are barriers); returns answers."""
        results: List[object] = [None] * len(lines)

        def run(i):
            try:
                results[i] = self.clients[i].cmd(lines[i], timeout)
            except BaseException as e:  # re-raised below
                results[i] = e

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(lines))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 5)
        for r in results:
            if isinstance(r, BaseException):
                raise r
            if r is None:
                raise TimeoutError("a client thread did not finish")
        return results

    def server_text(self) -> str:
        return self.server_log.read_bytes().decode(errors="replace")

    def server_alive(self) -> bool:
        return self.server.poll() is None

    def close(self):
        for c in self.clients:
            try:
                if c.proc.poll() is None:
                    c.cmd("quit", timeout=5)
            except Exception:  # it is killed below anyway
                pass
        deadline = time.time() + 5
        for p in [c.proc for c in self.clients] + self.procs:
            while p.poll() is None and time.time() < deadline:
                time.sleep(0.05)
        kill_groups([c.proc for c in self.clients] + self.procs, timeout=2.0)


def have_tools() -> bool:
    return shutil.which("g++") is not None
