"""One command run to its end under the launcher's Supervisor, for tests and benchmarks.

The command runs in a process group of its own, its output is read as it comes (no pipe can fill
up and block it), and the group is stopped (SIGTERM, SIGKILL `kill_timeout` s later) when the
command ends, past `timeout`, or when this process is interrupted; a watchdog does it should this
process be killed outright. stdout and stderr arrive as one stream, in order.
"""
from __future__ import annotations

import dataclasses
import io
from typing import Dict, Optional, Sequence

from byteps_thc.launch.supervisor import Outcome, ProcSpec, Supervisor


@dataclasses.dataclass
class Finished:
    code: int          # the exit status (negative: the signal that ended it)
    output: str        # stdout and stderr, interleaved as they came
    pid: int           # its pid, which is its process group's id
    timed_out: bool    # it ran past `timeout` and was stopped
    outcome: Outcome   # the Supervisor's verdict


def run(argv: Sequence[str], env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
        timeout: Optional[float] = None, kill_timeout: float = 3.0,
        name: str = "command") -> Finished:
    """Runs `argv` to its end (at most `timeout` seconds) and returns how it ended."""
    spec = ProcSpec(name, "worker", list(argv), env, cwd)
    sup = Supervisor([spec], err=io.StringIO(), echo=False, keep_lines=True, timeout=timeout,
                     kill_timeout=kill_timeout, poll_interval=0.1, tag=name)
    outcome = sup.run()
    proc = sup.procs[name]
    return Finished(proc.returncode, sup.logs[name].text(), proc.pid, outcome.kind == "timeout",
                    outcome)
