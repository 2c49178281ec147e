"""The Supervisor's watchdog: stops the process groups of a supervisor that died outright.

Run as `python -I -S watchdog.py KILL_S` by byteps_thc.launch.supervisor, in a session of its own,
with a pipe on stdin. The supervisor writes one line per thing to look after:

    PGID          a process group it started
    rmtree DIR    a directory the run leaves on disk (the workers' socket directories)
    shm PREFIX    names in /dev/shm the run leaves (the workers' shared memory)

and "done" once it has stopped every group itself: the watchdog then leaves without doing anything.
A pipe that ends without "done" means the supervisor was killed (SIGKILL, the OOM killer): the
watchdog SIGTERMs every group, SIGKILLs what is left after KILL_S seconds, then removes the
directories and the shared memory.

It runs isolated (-I -S) so that nothing of the environment it watches can break it, and for the
same reason it imports nothing of byteps_thc: the few lines below restate supervisor.kill_groups
and supervisor.remove_shm for process groups known only by number.
"""
import os
import shutil
import signal
import sys
import time

SHM_DIR = "/dev/shm"


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def _signal(pgids, sig) -> None:
    for g in pgids:
        try:
            os.killpg(g, sig)
        except OSError:
            pass


def main(argv) -> int:
    kill_s = float(argv[1]) if len(argv) > 1 else 3.0
    groups, dirs, shm = [], [], []
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line == "done":
            return 0
        if line.startswith("rmtree "):
            dirs.append(line[len("rmtree "):])
        elif line.startswith("shm "):
            shm.append(line[len("shm "):])
        elif line.strip():
            groups.append(int(line))
    _signal(groups, signal.SIGTERM)
    deadline = time.monotonic() + kill_s
    while any(_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal(groups, signal.SIGKILL)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    if shm and os.path.isdir(SHM_DIR):
        for entry in os.listdir(SHM_DIR):
            if any(entry.startswith(p) for p in shm):
                try:
                    os.unlink(os.path.join(SHM_DIR, entry))
                except OSError:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
