"""bpslaunch: BytePS's launcher with compression flags and a one-command local cluster.

Two ways to use it:

1. As upstream: one role per call, chosen by DMLC_ROLE and the other DMLC_*/BYTEPS_* variables
   (one machine of a real cluster). A worker runs CMD once per local GPU; a server or the
   scheduler runs BytePS's server loop. Flags such as `--compressor thc` only add environment.

       DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch --compressor thc python train.py

2. A whole cluster on this machine, every process supervised:

       bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py

   starts the scheduler, the servers (--servers, default 1) and N workers on 127.0.0.1 with free
   ports, a private socket directory and shared-memory prefix per worker, no CPU pinning, and
   BytePS's compression thread pool. Each line a process prints is prefixed with its name
   ("[worker 1] ..."). When any process fails (non-zero exit, a signal, a server or the scheduler
   leaving early, workers that finished while another hangs) the launcher stops every process
   group it started and exits non-zero, naming the process.

The process supervision (`Supervisor`) knows nothing about BytePS: it runs `ProcSpec`s.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

COMPRESSORS = ("none", "thc", "fp16", "onebit", "topk", "randomk", "dithering")

# Environment the flags write (the workers' side reads them: byteps_thc.config / byteps_thc.torch).
ENV_COMPRESSOR = "BYTEPS_COMPRESSOR"
ENV_COMPRESSOR_K = "BYTEPS_COMPRESSOR_K"        # topk / randomk / dithering hyper-parameter
ENV_COMPRESSOR_EF = "BYTEPS_COMPRESSOR_EF"      # error feedback for BytePS's own compressors
ENV_THC = {
    "bits": "BYTEPS_THC_BITS",
    "granularity": "BYTEPS_THC_GRANULARITY",
    "overflow_prob": "BYTEPS_THC_OVERFLOW_PROB",
    "seed": "BYTEPS_THC_SEED",
    "rotation_block": "BYTEPS_THC_ROTATION_BLOCK",
    "error_feedback": "BYTEPS_THC_ERROR_FEEDBACK",
}
try:  # one spelling of each name: the configuration module's, once it is there
    from .config import ENV as _CFG_ENV
    ENV_COMPRESSOR = _CFG_ENV.get("compressor", ENV_COMPRESSOR)
    ENV_THC.update({k: v for k, v in _CFG_ENV.items() if k in ENV_THC})
except ImportError:  # pragma: no cover - only before the configuration module exists
    pass

# Per-worker isolation on one host: BytePS's UNIX socket directory. The fork tags its
# shared-memory names with DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT and DMLC_WORKER_ID
# (patch 0007), and ps-lite binds DMLC_NODE_PORT rather than a plain PORT (patch 0008).
ENV_SOCKET_PATH = "BYTEPS_SOCKET_PATH"
ENV_NODE_PORT = "DMLC_NODE_PORT"
SHM_PREFIX = "BytePS_ShM_"

LOCAL_HOST = "127.0.0.1"

HELP_EPILOG = """\
compression (reaches every worker as environment; byteps.torch.DistributedOptimizer uses it when
no `compression=` argument is given):
  --compressor thc      BYTEPS_COMPRESSOR=thc and the BYTEPS_THC_* variables below
  --thc-bits B          BYTEPS_THC_BITS            bits per coordinate on the way up (1..8, 4)
  --thc-granularity G   BYTEPS_THC_GRANULARITY     table values in [0, G], G >= 2^B - 1 (30)
  --thc-overflow-prob P BYTEPS_THC_OVERFLOW_PROB   clipped probability mass, e.g. 1/32 (1/32)
  --thc-seed S          BYTEPS_THC_SEED            rotation seed, same on every worker (42)
  --thc-rotation-block  BYTEPS_THC_ROTATION_BLOCK  Hadamard block, power of two (0 = partition)
  --thc-no-error-feedback  BYTEPS_THC_ERROR_FEEDBACK=0
  --compressor-k K      BYTEPS_COMPRESSOR_K        k of topk/randomk (count or fraction), dithering levels
  --compressor-ef vanilla  BYTEPS_COMPRESSOR_EF    error feedback for onebit/topk/randomk/dithering
  Tensors smaller than BYTEPS_MIN_COMPRESS_BYTES (default 65536) are sent uncompressed.

environment read by BytePS and this launcher (set them for a real multi-machine cluster):
  DMLC_ROLE              worker | server | scheduler (required without --local)
  DMLC_NUM_WORKER        number of worker machines
  DMLC_NUM_SERVER        number of servers
  DMLC_PS_ROOT_URI       IP address of the scheduler
  DMLC_PS_ROOT_PORT      port of the scheduler
  DMLC_WORKER_ID         this worker's index, 0..DMLC_NUM_WORKER-1 (workers)
  DMLC_NODE_HOST         address this process announces (else DMLC_INTERFACE's / the first one)
  DMLC_INTERFACE         network interface to use
  DMLC_NODE_PORT         port this server/worker binds (our ps-lite; unset = any free one)
  NVIDIA_VISIBLE_DEVICES GPUs of this machine: one worker process each (default 1 process)
  BYTEPS_LOCAL_SIZE      worker processes on this machine (default: one per GPU, else 1)
  BYTEPS_LOCAL_RANK      set by the launcher for each worker process
  BYTEPS_FORCE_DISTRIBUTED=1   use the servers even with one worker
  BYTEPS_PARTITION_BYTES       tensor partition size (default 4096000)
  BYTEPS_MIN_COMPRESS_BYTES    smallest tensor that is compressed (default 65536)
  BYTEPS_THREADPOOL_SIZE       compression threads per worker (compression needs it; the
                               launcher sets it when a compressor is chosen or with --local)
  BYTEPS_SERVER_ENGINE_THREAD  server summation threads (default 4)
  BYTEPS_SOCKET_PATH           directory of BytePS's local UNIX sockets
  BYTEPS_NUMA_ON=1             pin each local worker to CPUs with numactl (off by default)
  BYTEPS_VISIBLE_CPU_CORES     explicit CPU lists per local worker, e.g. 0-3:4-7
  BYTEPS_LOG_LEVEL             TRACE | DEBUG | INFO | WARNING (default) | ERROR | FATAL
  BYTEPS_ENABLE_GDB=1          run each worker under gdb
  BYTEPS_ENABLE_ASYNC=1        asynchronous training
  BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR, BYTEPS_TRACE_START_STEP, BYTEPS_TRACE_END_STEP  profiling

examples:
  bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py
  bpslaunch --local 4 --servers 2 --compressor thc --thc-bits 3 --thc-granularity 16 -- python train.py
  DMLC_ROLE=server DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=10.0.0.1 \\
      DMLC_PS_ROOT_PORT=9000 bpslaunch
"""


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return v


def _probability(text: str) -> float:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            v = float(num) / float(den)
        else:
            v = float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability (e.g. 0.03125 or 1/32)") \
            from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must lie strictly between 0 and 1")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bpslaunch",
        usage="bpslaunch [--local N [--servers M]] [--compressor NAME [...]] [--] CMD [ARG ...]",
        description="Launch a BytePS role (from DMLC_* environment) or, with --local N, a whole "
                    "cluster on this machine; optionally with gradient compression (THC).",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c = p.add_argument_group("compression")
    c.add_argument("--compressor", choices=COMPRESSORS, default=None,
                   help="gradient compressor for every tensor large enough (default: none, or "
                        "$BYTEPS_COMPRESSOR)")
    c.add_argument("--thc-bits", type=int, metavar="B", help="THC bits per coordinate (4)")
    c.add_argument("--thc-granularity", type=int, metavar="G", help="THC table range [0, G] (30)")
    c.add_argument("--thc-overflow-prob", type=_probability, metavar="P",
                   help="THC clipped probability mass, e.g. 1/32")
    c.add_argument("--thc-seed", type=int, metavar="S", help="THC rotation seed (42)")
    c.add_argument("--thc-rotation-block", type=int, metavar="N",
                   help="THC Hadamard block, a power of two (default: whole partition)")
    c.add_argument("--thc-no-error-feedback", action="store_true",
                   help="turn THC's error feedback off")
    c.add_argument("--compressor-k", metavar="K",
                   help="k for topk/randomk (count or fraction) and dithering (levels)")
    c.add_argument("--compressor-ef", choices=("none", "vanilla"), default=None,
                   help="error feedback for BytePS's own compressors")

    lc = p.add_argument_group("local cluster")
    lc.add_argument("--local", type=_positive_int, metavar="N",
                    help="start scheduler, servers and N workers on 127.0.0.1 and run CMD in each "
                         "worker")
    lc.add_argument("--servers", type=_positive_int, metavar="M", default=None,
                    help="number of servers with --local (default 1)")
    lc.add_argument("--timeout", type=_seconds, metavar="SEC", default=None,
                    help="stop the cluster and fail after SEC seconds")
    lc.add_argument("--grace", type=_seconds, metavar="SEC", default=60.0,
                    help="how long the other workers may run on after one worker finished "
                         "before the cluster counts as hung (default 60)")
    lc.add_argument("--no-prefix", action="store_true",
                    help="do not prefix output lines with the process name")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the training command, run in every worker")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse flags; the command is everything after `--` (or after the first non-flag word)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" in argv:
        i = argv.index("--")
        ns = parser.parse_args(argv[:i])
        if ns.command:
            parser.error(f"unexpected words before '--': {' '.join(ns.command)}")
        ns.command = argv[i + 1:]
    else:
        ns = parser.parse_args(argv)
        ns.command = list(ns.command)
    thc_flags = [f for f in ("thc_bits", "thc_granularity", "thc_overflow_prob", "thc_seed",
                             "thc_rotation_block") if getattr(ns, f) is not None]
    if ns.thc_no_error_feedback:
        thc_flags.append("thc_no_error_feedback")
    if thc_flags:
        if ns.compressor is None:
            ns.compressor = "thc"
        elif ns.compressor != "thc":
            parser.error(f"--{thc_flags[0].replace('_', '-')} needs --compressor thc, "
                         f"not {ns.compressor}")
    if ns.compressor_k is not None and ns.compressor not in ("topk", "randomk", "dithering"):
        parser.error("--compressor-k applies to --compressor topk, randomk or dithering")
    if ns.compressor in ("topk", "randomk", "dithering") and ns.compressor_k is None:
        parser.error(f"--compressor {ns.compressor} needs --compressor-k")
    if ns.servers is not None and ns.local is None:
        parser.error("--servers needs --local N")
    if ns.local is not None and not ns.command:
        parser.error("--local needs a command: bpslaunch --local N [...] -- CMD ...")
    if ns.compressor == "thc":
        try:
            thc_config(ns)  # validates the combination (table exists, lanes fit) before launch
        except ValueError as e:
            parser.error(f"invalid THC configuration: {e}")
    return ns


def thc_config(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None):
    """The ThcConfig the flags describe, on top of any BYTEPS_THC_* already in the environment."""
    from .config import ThcConfig
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k in ENV_THC.values()}
    for field in ("bits", "granularity", "overflow_prob", "seed"):
        v = getattr(ns, "thc_" + field)
        if v is not None:
            env[ENV_THC[field]] = repr(v)
    if ns.thc_rotation_block is not None:
        env[ENV_THC["rotation_block"]] = str(ns.thc_rotation_block)
    if ns.thc_no_error_feedback:
        env[ENV_THC["error_feedback"]] = "0"
    cfg = ThcConfig.from_env(env)
    if ns.local is not None:
        cfg.lane_bits(ns.local)  # the server's sums of N workers must fit a lane
    return cfg


def compression_env(ns: argparse.Namespace,
                    environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables the compression flags add to every worker's environment (nothing if unset)."""
    env: Dict[str, str] = {}
    if ns.compressor is None:
        return env
    env[ENV_COMPRESSOR] = ns.compressor
    if ns.compressor == "thc":
        cfg = thc_config(ns, environ)
        env.update({
            ENV_THC["bits"]: str(cfg.bits),
            ENV_THC["granularity"]: str(cfg.granularity),
            ENV_THC["overflow_prob"]: repr(cfg.overflow_prob),
            ENV_THC["seed"]: str(cfg.seed),
            ENV_THC["rotation_block"]: str(cfg.rotation_block or 0),
            ENV_THC["error_feedback"]: "1" if cfg.error_feedback else "0",
        })
    if ns.compressor_k is not None:
        env[ENV_COMPRESSOR_K] = str(ns.compressor_k)
    if ns.compressor_ef is not None:
        env[ENV_COMPRESSOR_EF] = ns.compressor_ef
    return env


def _threadpool_size(num_local_workers: int) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return str(max(1, min(4, cpus // max(1, num_local_workers))))


# ------------------------------------------------------------------------------------------------
# Process supervision (BytePS-agnostic)
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ProcSpec:
    """One process of a cluster: `name` appears in prefixes and messages."""
    name: str
    role: str                 # "scheduler", "server" or "worker"
    argv: List[str]
    env: Dict[str, str]
    cwd: Optional[str] = None


@dataclasses.dataclass
class Outcome:
    code: int                 # the launcher's exit status
    message: str              # empty on success
    failed: Optional[str] = None   # name of the process that failed first


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# A launcher killed outright (SIGKILL, the OOM killer) cannot stop its children, and they run in
# process groups of their own: they would live on as orphans. So a small watchdog process, in its
# own session, reads the pid of each group the launcher starts from a pipe; the launcher writes
# "done" once it has stopped them itself. A pipe that ends without "done" means the launcher died:
# the watchdog stops every group (SIGTERM, then SIGKILL what is left after KILL_S seconds), then
# removes what the run leaves on disk: lines "rmtree DIR" (the socket directories) and "shm PREFIX"
# (the workers' shared memory in /dev/shm), told to it up front.
_WATCHDOG = r"""
import os, shutil, signal, sys, time
KILL_S = %s
groups, dirs, shm = [], [], []
for line in sys.stdin:
    line = line.rstrip("\n")
    if line == "done":
        sys.exit(0)
    if line.startswith("rmtree "):
        dirs.append(line[7:])
    elif line.startswith("shm "):
        shm.append(line[4:])
    else:
        groups.append(int(line))
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
for g in groups:
    try:
        os.killpg(g, signal.SIGTERM)
    except OSError:
        pass
deadline = time.monotonic() + KILL_S
while any(alive(g) for g in groups) and time.monotonic() < deadline:
    time.sleep(0.05)
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
if shm and os.path.isdir("/dev/shm"):
    for e in os.listdir("/dev/shm"):
        if any(e.startswith(p) for p in shm):
            try:
                os.unlink(os.path.join("/dev/shm", e))
            except OSError:
                pass
"""


class Supervisor:
    """Runs processes, each in its own process group, and stops them all on the first failure.

    Success: every worker exits 0, then the other roles leave by themselves (they are stopped
    after `shutdown_timeout` seconds if not). Failure, reported by name:
    - any process exits non-zero or by a signal (at once);
    - a process (worker, server or scheduler) exited 0 but a worker still runs `grace` seconds
      later (at shutdown the roles leave a moment apart; longer means a hang);
    - `timeout` seconds passed.
    Should the launcher itself be killed outright, a watchdog process stops the groups (no
    orphans, ever; see _WATCHDOG).
    """

    def __init__(self, specs: Sequence[ProcSpec], out: Optional[TextIO] = None,
                 err: Optional[TextIO] = None, prefix: bool = True, grace: float = 60.0,
                 timeout: Optional[float] = None, shutdown_timeout: float = 20.0,
                 kill_timeout: float = 3.0, poll_interval: float = 0.05,
                 leftovers: Sequence[str] = ()):
        self.specs = list(specs)
        self.leftovers = list(leftovers)  # watchdog lines ("rmtree DIR", "shm PREFIX")
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.prefix = prefix
        self.grace = grace
        self.timeout = timeout
        self.shutdown_timeout = shutdown_timeout
        self.kill_timeout = kill_timeout
        self.poll_interval = poll_interval
        self.procs: Dict[str, subprocess.Popen] = {}
        self._pumps: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._stop_signal: Optional[int] = None
        self._watchdog: Optional[subprocess.Popen] = None

    # -- output ---------------------------------------------------------------------------------
    def _pump(self, name: str, stream) -> None:
        tag = f"[{name}] " if self.prefix else ""
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):
                    line += "\n"
                with self._lock:
                    self.out.write(tag + line)
                    self.out.flush()
        except (OSError, ValueError):
            pass
        finally:
            stream.close()

    def _say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"bpslaunch: {text}\n")
            self.err.flush()

    # -- lifecycle ------------------------------------------------------------------------------
    def _start_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG % repr(self.kill_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True)  # close_fds: no child holds the pipe open
        for line in self.leftovers:
            self._tell_watchdog(line)

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog is None:
            return
        try:
            self._watchdog.stdin.write(line + "\n")
            self._watchdog.stdin.flush()
        except (OSError, ValueError):  # pragma: no cover - the watchdog died: carry on without
            pass

    def _release_watchdog(self) -> None:
        """Every group has been stopped: the watchdog may leave without doing anything."""
        w, self._watchdog = self._watchdog, None
        if w is None:
            return
        try:
            w.stdin.write("done\n")
            w.stdin.close()
        except (OSError, ValueError):  # pragma: no cover
            pass
        try:
            w.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            w.kill()

    def start(self) -> None:
        self._start_watchdog()
        for spec in self.specs:
            try:
                proc = subprocess.Popen(
                    spec.argv, env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                self.stop_all()
                raise RuntimeError(f"cannot start {spec.name} ({shlex.join(spec.argv)}): {e}") \
                    from None
            self.procs[spec.name] = proc
            self._tell_watchdog(str(proc.pid))  # its process group: pgid == pid
            t = threading.Thread(target=self._pump, args=(spec.name, proc.stdout), daemon=True)
            t.start()
            self._pumps.append(t)

    def _signal_groups(self, sig: int) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, sig)  # the group exists while any member lives
            except (ProcessLookupError, PermissionError):
                pass

    def stop_all(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after `kill_timeout` seconds."""
        self._signal_groups(signal.SIGTERM)
        deadline = time.monotonic() + self.kill_timeout
        for proc in self.procs.values():
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(0.0, left))
            except subprocess.TimeoutExpired:
                pass
        # Kill the groups even when the leaders are gone: grandchildren may still hold on.
        self._signal_groups(signal.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=self.kill_timeout)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass
        self._release_watchdog()

    def _finish(self) -> None:
        for t in self._pumps:
            t.join(timeout=2.0)

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def run(self) -> Outcome:
        old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[s] = signal.signal(s, self._on_signal)
        try:
            self.start()
            outcome = self._watch()
        finally:
            self.stop_all()
            self._finish()
            for s, h in old.items():
                signal.signal(s, h)
        if outcome.message:
            self._say(outcome.message)
        return outcome

    def _watch(self) -> Outcome:
        roles = {s.name: s.role for s in self.specs}
        workers = [s.name for s in self.specs if s.role == "worker"]
        start = time.monotonic()
        first_done: Optional[Tuple[str, float]] = None
        all_done_at: Optional[float] = None
        while True:
            now = time.monotonic()
            if self._stop_signal is not None:
                name = signal.Signals(self._stop_signal).name
                return Outcome(128 + self._stop_signal,
                               f"received {name}: stopped all {len(self.procs)} processes")
            codes = {n: p.poll() for n, p in self.procs.items()}
            # 1. any failure ends everything
            for n, code in codes.items():
                if code is not None and code != 0:
                    rest = sum(1 for m, c in codes.items() if m != n and c is None)
                    status = code if 0 < code < 256 else (128 - code if code < 0 else 1)
                    return Outcome(status, f"{n} (pid {self.procs[n].pid}) {_describe_exit(code)}; "
                                   f"stopping the other {rest} running process"
                                   f"{'es' if rest != 1 else ''}", failed=n)
            if not workers:
                # a server or scheduler launched alone (one role from DMLC_*): it runs until it
                # exits by itself; only its failure or the timeout ends it early
                if all(c is not None for c in codes.values()):
                    return Outcome(0, "")
                if self.timeout is not None and now - start > self.timeout:
                    return Outcome(124, f"timeout after {self.timeout:.0f}s; stopping "
                                   f"{', '.join(n for n, c in codes.items() if c is None)}")
                time.sleep(self.poll_interval)
                continue
            running_workers = [w for w in workers if codes[w] is None]
            # 2./3. a process that left cleanly while workers still run: a server or the
            # scheduler at shutdown, a worker that finished first. Normal for a moment; after
            # `grace` seconds the workers that still run count as hung.
            if first_done is None:
                done = [n for n, c in codes.items() if c == 0]
                if done:
                    first_done = (done[0], now)
            if running_workers and first_done is not None and now - first_done[1] > self.grace:
                n = first_done[0]
                what = "finished" if roles[n] == "worker" else "exited"
                return Outcome(1, f"{n} {what} {self.grace:.0f}s ago but "
                               f"{', '.join(running_workers)} still running; "
                               "stopping them (hung?)", failed=running_workers[0])
            # 4. all workers done: give the other roles time to leave
            if not running_workers:
                if all_done_at is None:
                    all_done_at = now
                if all(c is not None for c in codes.values()):
                    return Outcome(0, "")
                if now - all_done_at > self.shutdown_timeout:
                    stuck = [n for n, c in codes.items() if c is None]
                    self._say(f"all workers finished; {', '.join(stuck)} did not exit within "
                              f"{self.shutdown_timeout:.0f}s and will be stopped")
                    return Outcome(0, "")
            # 5. the overall limit
            if self.timeout is not None and now - start > self.timeout:
                alive = [n for n, c in codes.items() if c is None]
                return Outcome(124, f"timeout after {self.timeout:.0f}s; stopping "
                               f"{', '.join(alive)}", failed=alive[0] if alive else None)
            time.sleep(self.poll_interval)


# ------------------------------------------------------------------------------------------------
# The local cluster
# ------------------------------------------------------------------------------------------------
def free_ports(count: int, host: str = LOCAL_HOST) -> List[int]:
    """`count` distinct free TCP ports (all held open together while choosing)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Variables a local cluster decides itself; whatever the caller's environment says is dropped.
_CLUSTER_OWNED = ("DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                  "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST", "DMLC_INTERFACE",
                  ENV_NODE_PORT, "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_GLOBAL_RANK",
                  ENV_SOCKET_PATH, "NVIDIA_VISIBLE_DEVICES", "BYTEPS_VISIBLE_CPU_CORES")


def with_package_path(env: Dict[str, str]) -> Dict[str, str]:
    """`env` with this package's parent directory on PYTHONPATH, so that the children (the
    patched byteps.torch imports byteps_thc.torch) find byteps_thc even when it is not installed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env = dict(env, PYTHONPATH=os.pathsep.join([root] + parts))
    return env


def server_argv(python: Optional[str] = None) -> List[str]:
    """BytePS's server and scheduler loop (the same module serves both roles)."""
    return [python or sys.executable, "-c", "import byteps.server"]


def local_cluster_specs(num_workers: int, num_servers: int, command: Sequence[str],
                        base_env: Mapping[str, str], run_dir: str,
                        ports: Optional[Sequence[int]] = None,
                        extra_env: Optional[Mapping[str, str]] = None,
                        role_argv: Optional[List[str]] = None) -> List[ProcSpec]:
    """The scheduler, `num_servers` servers and `num_workers` workers of a 127.0.0.1 cluster.

    `run_dir` holds each worker's socket directory; `ports` are 1 + servers + workers free ports
    (scheduler first); `role_argv` replaces the server/scheduler command (tests).
    """
    total = 1 + num_servers + num_workers
    ports = list(ports) if ports is not None else free_ports(total)
    if len(ports) != total:
        raise ValueError(f"need {total} ports, got {len(ports)}")
    common = {k: v for k, v in base_env.items() if k not in _CLUSTER_OWNED}
    if extra_env:
        common.update(extra_env)
    common.update({
        "DMLC_NUM_WORKER": str(num_workers),
        "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_PS_ROOT_URI": LOCAL_HOST,
        "DMLC_PS_ROOT_PORT": str(ports[0]),
        "DMLC_NODE_HOST": LOCAL_HOST,
        "BYTEPS_FORCE_DISTRIBUTED": "1",   # servers even for --local 1: a real cluster always
        "BYTEPS_NUMA_ON": "0",             # no numactl pinning of processes sharing one host
        "PYTHONUNBUFFERED": "1",
    })
    common.setdefault("BYTEPS_THREADPOOL_SIZE", _threadpool_size(num_workers))
    common = with_package_path(common)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    role_cmd = list(role_argv) if role_argv is not None else server_argv()
    specs = [ProcSpec("scheduler", "scheduler", role_cmd,
                      dict(common, DMLC_ROLE="scheduler", **{ENV_NODE_PORT: str(ports[0])}))]
    for i in range(num_servers):
        specs.append(ProcSpec(f"server {i}", "server", role_cmd,
                              dict(common, DMLC_ROLE="server",
                                   **{ENV_NODE_PORT: str(ports[1 + i])})))
    for i in range(num_workers):
        sock_dir = os.path.join(run_dir, f"worker{i}")
        env = dict(common)
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // num_workers)))
        env.update({
            "DMLC_ROLE": "worker",
            "DMLC_WORKER_ID": str(i),
            ENV_NODE_PORT: str(ports[1 + num_servers + i]),
            "BYTEPS_LOCAL_RANK": "0",
            "BYTEPS_LOCAL_SIZE": "1",
            ENV_SOCKET_PATH: sock_dir,
        })
        specs.append(ProcSpec(f"worker {i}", "worker", list(command), env))
    return specs


def shm_prefixes(specs: Sequence[ProcSpec]) -> List[str]:
    """The names the workers' shared memory in /dev/shm starts with."""
    return sorted({f"{SHM_PREFIX}{s.env['DMLC_PS_ROOT_URI']}_{s.env['DMLC_PS_ROOT_PORT']}_"
                   for s in specs if s.role == "worker" and "DMLC_PS_ROOT_PORT" in s.env})


def cleanup_run(run_dir: str, specs: Sequence[ProcSpec]) -> None:
    """Remove the socket directories and any shared memory the workers left behind (the
    watchdog does the same when the launcher is killed outright)."""
    prefixes = shm_prefixes(specs)
    shm = "/dev/shm"
    if prefixes and os.path.isdir(shm):
        for entry in os.listdir(shm):
            if any(entry.startswith(p) for p in prefixes):
                try:
                    os.unlink(os.path.join(shm, entry))
                except OSError:
                    pass
    shutil.rmtree(run_dir, ignore_errors=True)


def run_local(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None,
              out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    num_servers = ns.servers or 1
    run_dir = tempfile.mkdtemp(prefix="bps")
    specs = local_cluster_specs(ns.local, num_servers, ns.command, environ, run_dir,
                                extra_env=compression_env(ns, environ))
    for s in specs:
        if s.role == "worker":
            os.makedirs(s.env[ENV_SOCKET_PATH], exist_ok=True)
    err = err if err is not None else sys.stderr
    desc = ns.compressor or environ.get(ENV_COMPRESSOR) or "none"
    err.write(f"bpslaunch: local cluster: scheduler 127.0.0.1:{specs[0].env[ENV_NODE_PORT]}, "
              f"{num_servers} server(s), {ns.local} worker(s), compressor {desc}\n")
    err.flush()
    sup = Supervisor(specs, out=out, err=err, prefix=not ns.no_prefix, grace=ns.grace,
                     timeout=ns.timeout,
                     leftovers=[f"rmtree {run_dir}"] + [f"shm {p}" for p in shm_prefixes(specs)])
    try:
        outcome = sup.run()
    except RuntimeError as e:
        err.write(f"bpslaunch: {e}\n")
        return 1
    finally:
        cleanup_run(run_dir, specs)
    return outcome.code


# ------------------------------------------------------------------------------------------------
# One role from the environment (upstream's behaviour)
# ------------------------------------------------------------------------------------------------
def _cpu_allocation(local_size: int, environ: Mapping[str, str]) -> Optional[List[str]]:
    """numactl CPU lists per local worker, or None when pinning is off or impossible."""
    if environ.get("BYTEPS_NUMA_ON", "0") != "1" or shutil.which("numactl") is None:
        return None
    override = environ.get("BYTEPS_VISIBLE_CPU_CORES", "").strip()
    if override:
        lists = override.split(":")
        return lists if len(lists) >= local_size else None
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    per = len(cpus) // local_size
    if per < 1:
        return None
    return [",".join(str(c) for c in cpus[i * per:(i + 1) * per]) for i in range(local_size)]


def role_specs(environ: Mapping[str, str], command: Sequence[str]) -> List[ProcSpec]:
    """The processes one `bpslaunch` runs for DMLC_ROLE (empty: nothing to run)."""
    role = environ.get("DMLC_ROLE", "").lower()
    if role not in ("worker", "server", "scheduler"):
        raise ValueError("DMLC_ROLE must be worker, server or scheduler (or use --local N)")
    required = ["DMLC_NUM_WORKER"] if role == "worker" else [
        "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"]
    if role == "worker" and int(environ.get("DMLC_NUM_WORKER", "1") or 1) > 1:
        required += ["DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_WORKER_ID"]
    missing = [k for k in required if k not in environ]
    if missing:
        raise ValueError(f"DMLC_ROLE={role} needs {', '.join(missing)} in the environment")
    env = with_package_path(dict(environ))
    env["PYTHONUNBUFFERED"] = "1"
    if role != "worker":
        distributed = (env.get("BYTEPS_FORCE_DISTRIBUTED", "") == "1"
                       or int(env.get("DMLC_NUM_WORKER", "1")) > 1)
        if not distributed:
            return []
        return [ProcSpec(role, role, server_argv(), env)]
    if not command:
        raise ValueError("a worker needs a command: bpslaunch [flags] CMD ...")
    gpus = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if env.get("BYTEPS_LOCAL_SIZE", "").strip():
        local_size = int(env["BYTEPS_LOCAL_SIZE"])
    else:
        local_size = len(gpus.split(",")) if gpus else 1
    alloc = _cpu_allocation(local_size, env)
    specs = []
    for i in range(local_size):
        wenv = dict(env, BYTEPS_LOCAL_RANK=str(i), BYTEPS_LOCAL_SIZE=str(local_size))
        argv = list(command)
        if len(argv) == 1 and " " in argv[0]:
            argv = ["/bin/sh", "-c", argv[0]]  # upstream accepted one quoted shell string
        if env.get("BYTEPS_ENABLE_GDB", "0") not in ("", "0"):
            argv = ["gdb", "-ex", "run", "-ex", "bt", "-batch", "--args"] + argv
        if alloc:
            argv = ["numactl", "--physcpubind", alloc[i]] + argv
        specs.append(ProcSpec(f"worker {env.get('DMLC_WORKER_ID', '0')}.{i}"
                              if local_size > 1 else "worker", "worker", argv, wenv))
    return specs


def run_role(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None,
             out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    environ.update(compression_env(ns, environ))
    if environ.get(ENV_COMPRESSOR, "none") != "none":
        environ.setdefault("BYTEPS_THREADPOOL_SIZE", _threadpool_size(1))
    # the server loop runs under this interpreter; keep its directory first on PATH for CMD too
    bindir = os.path.dirname(sys.executable)
    environ["PATH"] = bindir + os.pathsep + environ.get("PATH", "")
    err = err if err is not None else sys.stderr
    try:
        specs = role_specs(environ, ns.command)
    except ValueError as e:
        err.write(f"bpslaunch: {e}\n")
        return 2
    if not specs:
        err.write("bpslaunch: not distributed (DMLC_NUM_WORKER=1): nothing to run for "
                  f"{environ['DMLC_ROLE']}; set BYTEPS_FORCE_DISTRIBUTED=1 to run it anyway\n")
        return 0
    err.write(f"BytePS launching {environ['DMLC_ROLE']}\n")
    err.flush()
    # One process: no prefix and no grace period needed; several local workers: supervised.
    sup = Supervisor(specs, out=out, err=err, prefix=len(specs) > 1, grace=ns.grace,
                     timeout=ns.timeout)
    try:
        return sup.run().code
    except RuntimeError as e:
        err.write(f"bpslaunch: {e}\n")
        return 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    ns = parse_args(argv)
    if ns.local is not None:
        return run_local(ns)
    return run_role(ns)


if __name__ == "__main__":
    sys.exit(main())
