"""The one supervisor of every process group byteps-thc starts (BytePS-agnostic).

bpslaunch, the benchmarks' clusters, the advisor's calibration and the cluster tests all run their
processes through `Supervisor`: each `ProcSpec` in a process group of its own, its output read by
a thread (no pipe can fill up and block it) and echoed with a name prefix, kept with arrival times
and/or copied to a log file. It stops every group on the first failure, on a timeout and whenever
it is left (`stop_all`, the context manager, `run`), and removes what the run leaves on disk. A
watchdog process (watchdog.py) does the same should the supervising process be killed outright.

Two ways to drive it:

    outcome = Supervisor(specs, ...).run()        # blocking; SIGINT/SIGTERM/SIGHUP stop it

    with Supervisor(specs, echo=False, keep_lines=True) as sup:    # non-blocking
        while (outcome := sup.poll()) is None:
            ...                                   # e.g. sample cpu_seconds(sup.procs[n].pid)
            time.sleep(0.2)
    sup.logs["worker 0"].lines                    # [(wall time, line), ...]

The module also holds the helpers that others need around process groups: `kill_groups` /
`kill_group`, `remove_shm` and the /proc readers `process_table` and `cpu_seconds`.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

SHM_DIR = "/dev/shm"
WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")


# ------------------------------------------------------------------------------------------------
# Process groups, shared memory and /proc
# ------------------------------------------------------------------------------------------------
def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)  # the group exists while any member lives, leader or not
    except (ProcessLookupError, PermissionError):
        pass


def kill_groups(procs: Sequence[subprocess.Popen], timeout: float = 3.0,
                term: bool = True) -> None:
    """Stop the process groups led by `procs` (each started with start_new_session=True):
    SIGTERM (unless `term` is False), up to `timeout` seconds for the leaders to exit, then SIGKILL
    to every group, exited leader or not (grandchildren may still hold on), and reap the leaders."""
    if term:
        for p in procs:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for p in procs:
        _signal_group(p.pid, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # unkillable (D state)
            pass


def kill_group(proc: subprocess.Popen, timeout: float = 3.0, term: bool = True) -> None:
    """kill_groups for one process group."""
    kill_groups([proc], timeout, term)


def remove_shm(prefixes: Iterable[str], shm_dir: str = SHM_DIR) -> List[str]:
    """Unlink the entries of `shm_dir` whose names start with any of `prefixes`; their names."""
    prefixes = tuple(p for p in prefixes if p)
    removed = []
    if not prefixes:
        return removed
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return removed
    for entry in entries:
        if entry.startswith(prefixes):
            try:
                os.unlink(os.path.join(shm_dir, entry))
                removed.append(entry)
            except OSError:
                pass
    return removed


def _clock_tick() -> int:
    return os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> Optional[Tuple[int, float]]:
    """(parent pid, user + system CPU seconds of every thread) of `pid`; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in (...) may hold spaces
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / _clock_tick()
    except (OSError, IndexError, ValueError):
        return None


def process_table() -> Dict[int, Tuple[int, float]]:
    """pid -> (parent pid, CPU seconds) of every process (proc_stat of each)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st is not None:
                out[int(d)] = st
    return out


def child_pids(pid: int) -> List[int]:
    """The direct children of `pid` (those of each of its threads)."""
    kids: List[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def cpu_seconds(pid: int, children: bool = True) -> float:
    """CPU seconds (user + system) of `pid`, plus its live direct children's with `children`;
    0 for a process that is gone."""
    pids = [pid] + (child_pids(pid) if children else [])
    return sum(st[1] for st in map(proc_stat, pids) if st is not None)


# ------------------------------------------------------------------------------------------------
# What is supervised and what comes out
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ProcSpec:
    """One process of a cluster: `name` appears in prefixes and messages."""
    name: str
    role: str                 # "scheduler", "server" or "worker" (see Supervisor's rules)
    argv: List[str]
    env: Dict[str, str]
    cwd: Optional[str] = None
    log: Optional[str] = None  # a file that receives a copy of every output line


@dataclasses.dataclass
class Outcome:
    code: int                 # the launcher's exit status
    message: str              # empty on success
    failed: Optional[str] = None   # name of the process that failed first
    kind: str = "ok"          # ok | failed (an exit != 0 or a signal) | hung | timeout | signal


@dataclasses.dataclass
class ProcLog:
    """The output a process printed (keep_lines): (wall-clock time, line) in arrival order."""
    name: str
    lines: List[Tuple[float, str]] = dataclasses.field(default_factory=list)
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)  # all lines in

    def text(self) -> str:
        return "".join(line + "\n" for _, line in self.lines)

    def tail(self, n: int = 12) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


LineCallback = Callable[[str, float, str], None]   # (process name, wall time, line)


class Supervisor:
    """Runs processes, each in its own process group, and stops them all on the first failure.

    Success: every worker exits 0, then the other roles leave by themselves (they are stopped
    after `shutdown_timeout` seconds if not). Failure, reported by name:
    - any process exits non-zero or by a signal (at once);
    - a process (worker, server or scheduler) exited 0 but a worker still runs `grace` seconds
      later (at shutdown the roles leave a moment apart; longer means a hang);
    - `timeout` seconds passed.
    Without workers (one role from DMLC_*) the processes run until they exit by themselves.

    Output: each line goes to `out` (prefixed "[name] " with `prefix`) unless `echo` is False,
    to `spec.log` when set, into `logs[name]` with `keep_lines`, and to `on_line(name, t, line)`.
    Messages go to `err` as "<tag>: ...". `dirs` and `shm_prefixes` are removed by stop_all (and
    by the watchdog should this process be killed outright: no orphans, ever).
    """

    def __init__(self, specs: Sequence[ProcSpec], out: Optional[TextIO] = None,
                 err: Optional[TextIO] = None, prefix: bool = True, grace: float = 60.0,
                 timeout: Optional[float] = None, shutdown_timeout: float = 5.0,
                 kill_timeout: float = 3.0, poll_interval: float = 0.05,
                 dirs: Sequence[str] = (), shm_prefixes: Sequence[str] = (),
                 echo: bool = True, keep_lines: bool = False,
                 on_line: Optional[LineCallback] = None, tag: str = "bpslaunch"):
        self.specs = list(specs)
        self.dirs = list(dirs)
        self.shm_prefixes = list(shm_prefixes)
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.prefix = prefix
        self.echo = echo
        self.keep_lines = keep_lines
        self.on_line = on_line
        self.tag = tag
        self.grace = grace
        self.timeout = timeout
        self.shutdown_timeout = shutdown_timeout
        self.kill_timeout = kill_timeout
        self.poll_interval = poll_interval
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: Dict[str, ProcLog] = {s.name: ProcLog(s.name) for s in self.specs}
        self.watchdog: Optional[subprocess.Popen] = None
        self._pumps: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._stop_signal: Optional[int] = None
        self._started_at: Optional[float] = None
        self._first_done: Optional[Tuple[str, float]] = None
        self._all_done_at: Optional[float] = None

    @property
    def pids(self) -> Dict[str, int]:
        """name -> pid (= process group id) of every process started."""
        return {n: p.pid for n, p in self.procs.items()}

    # -- output ---------------------------------------------------------------------------------
    def _pump(self, spec: ProcSpec, stream) -> None:
        tag = f"[{spec.name}] " if self.prefix else ""
        log = open(spec.log, "w") if spec.log else None
        kept = self.logs[spec.name].lines
        try:
            for raw in iter(stream.readline, b""):
                t = time.time()
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if self.keep_lines:
                    kept.append((t, line))
                if log is not None:
                    log.write(line + "\n")
                    log.flush()
                if self.echo:
                    with self._lock:
                        self.out.write(tag + line + "\n")
                        self.out.flush()
                if self.on_line is not None:
                    self.on_line(spec.name, t, line)
        except (OSError, ValueError):
            pass
        finally:
            stream.close()
            if log is not None:
                log.close()
            self.logs[spec.name].ended.set()

    def say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"{self.tag}: {text}\n")
            self.err.flush()

    # -- the watchdog ---------------------------------------------------------------------------
    def _start_watchdog(self) -> None:
        self.watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", WATCHDOG, repr(self.kill_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True)  # close_fds: no child holds the pipe open
        for d in self.dirs:
            self._tell_watchdog(f"rmtree {d}")
        for p in self.shm_prefixes:
            self._tell_watchdog(f"shm {p}")

    def _tell_watchdog(self, line: str) -> None:
        if self.watchdog is None:
            return
        try:
            self.watchdog.stdin.write(line + "\n")
            self.watchdog.stdin.flush()
        except (OSError, ValueError):  # the watchdog died: carry on without
            pass

    def _release_watchdog(self) -> None:
        """Every group has been stopped: the watchdog may leave without doing anything."""
        w, self.watchdog = self.watchdog, None
        if w is None:
            return
        try:
            w.stdin.write("done\n")
            w.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            w.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.kill()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watchdog and every process; RuntimeError (everything stopped) when one
        cannot be started."""
        self._start_watchdog()
        self._started_at = time.monotonic()
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
            t = threading.Thread(target=self._pump, args=(spec, proc.stdout), daemon=True)
            t.start()
            self._pumps.append(t)

    def stop_all(self) -> None:
        """Stop every process group (kill_groups: SIGTERM, SIGKILL after `kill_timeout` s), let
        the watchdog go, finish reading the output and remove `dirs` and `shm_prefixes`.
        Idempotent."""
        kill_groups(list(self.procs.values()), self.kill_timeout)
        self._release_watchdog()
        for t in self._pumps:
            t.join(timeout=2.0)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        remove_shm(self.shm_prefixes)

    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def run(self) -> Outcome:
        """start, wait for the outcome, stop_all; the outcome's message goes to `err`. In the main
        thread SIGINT, SIGTERM and SIGHUP stop the run (exit status 128 + signal)."""
        old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[s] = signal.signal(s, self._on_signal)
        try:
            self.start()
            outcome = self.wait()
        finally:
            self.stop_all()
            for s, h in old.items():
                signal.signal(s, h)
        if outcome.message:
            self.say(outcome.message)
        return outcome

    def wait(self) -> Outcome:
        """poll every `poll_interval` seconds until there is an outcome (processes keep running)."""
        while True:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            time.sleep(self.poll_interval)

    def poll(self) -> Optional[Outcome]:
        """The outcome once the rules above decide it, else None. Stops nothing by itself."""
        if self._started_at is None:
            raise RuntimeError("Supervisor.poll() before start()")
        now = time.monotonic()
        if self._stop_signal is not None:
            name = signal.Signals(self._stop_signal).name
            return Outcome(128 + self._stop_signal,
                           f"received {name}: stopped all {len(self.procs)} processes",
                           kind="signal")
        codes = {n: p.poll() for n, p in self.procs.items()}
        roles = {s.name: s.role for s in self.specs}
        workers = [s.name for s in self.specs if s.role == "worker"]
        # 1. any failure ends everything
        for n, code in codes.items():
            if code is not None and code != 0:
                rest = sum(1 for m, c in codes.items() if m != n and c is None)
                status = code if 0 < code < 256 else (128 - code if code < 0 else 1)
                return Outcome(status, f"{n} (pid {self.procs[n].pid}) {describe_exit(code)}; "
                               f"stopping the other {rest} running process"
                               f"{'es' if rest != 1 else ''}", failed=n, kind="failed")
        if not workers:
            # a server or scheduler launched alone (one role from DMLC_*): it runs until it
            # exits by itself; only its failure or the timeout ends it early
            if all(c is not None for c in codes.values()):
                return Outcome(0, "")
            if self.timeout is not None and now - self._started_at > self.timeout:
                return Outcome(124, f"timeout after {self.timeout:.0f}s; stopping "
                               f"{', '.join(n for n, c in codes.items() if c is None)}",
                               kind="timeout")
            return None
        running_workers = [w for w in workers if codes[w] is None]
        # 2./3. a process that left cleanly while workers still run: a server or the
        # scheduler at shutdown, a worker that finished first. Normal for a moment; after
        # `grace` seconds the workers that still run count as hung.
        if self._first_done is None:
            done = [n for n, c in codes.items() if c == 0]
            if done:
                self._first_done = (done[0], now)
        first = self._first_done
        if running_workers and first is not None and now - first[1] > self.grace:
            what = "finished" if roles[first[0]] == "worker" else "exited"
            return Outcome(1, f"{first[0]} {what} {self.grace:.0f}s ago but "
                           f"{', '.join(running_workers)} still running; "
                           "stopping them (hung?)", failed=running_workers[0], kind="hung")
        # 4. all workers done: give the other roles a moment to leave. Only a moment: they wait
        # for nothing but the workers' finalize barrier, which workers that left after a cluster
        # failure skip, and ps-lite's dead-node detection would then end them with status 1 the
        # dead-node timeout after those workers' last heartbeat, failing a run whose scripts
        # handled the failure and exited 0.
        if not running_workers:
            if self._all_done_at is None:
                self._all_done_at = now
            if all(c is not None for c in codes.values()):
                return Outcome(0, "")
            if now - self._all_done_at >= self.shutdown_timeout:
                stuck = [n for n, c in codes.items() if c is None]
                self.say(f"all workers finished; {', '.join(stuck)} did not exit within "
                         f"{self.shutdown_timeout:.0f}s and will be stopped")
                return Outcome(0, "")
        # 5. the overall limit
        if self.timeout is not None and now - self._started_at > self.timeout:
            alive = [n for n, c in codes.items() if c is None]
            return Outcome(124, f"timeout after {self.timeout:.0f}s; stopping "
                           f"{', '.join(alive)}", failed=alive[0] if alive else None,
                           kind="timeout")
        return None
