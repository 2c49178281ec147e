"""One BytePS role from the DMLC_* environment, as upstream's bpslaunch runs it.

A worker runs CMD once per local GPU (BYTEPS_LOCAL_SIZE); a server or the scheduler runs BytePS's
server loop. Several local workers are supervised together (one fails: all stop).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from typing import Dict, List, Mapping, Optional, Sequence, TextIO

from .. import env
from .cli import compression_env, liveness_env, trace_dirs
from .cluster_key import key_env
from .supervisor import ProcSpec, Supervisor


def with_package_path(environ: Dict[str, str]) -> Dict[str, str]:
    """`environ` with this package's parent directory on PYTHONPATH, so that the children (the
    patched byteps.torch imports byteps_thc.torch) find byteps_thc even when it is not installed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        environ = dict(environ, PYTHONPATH=os.pathsep.join([root] + parts))
    return environ


def server_argv(python: Optional[str] = None) -> List[str]:
    """BytePS's server and scheduler loop (the same module serves both roles)."""
    return [python or sys.executable, "-c", "import byteps.server"]


def fork_missing(parts: Sequence[str] = ("server", "torch")) -> Optional[str]:
    """None when the BytePS fork's compiled `parts` are installed for this interpreter, else
    why not. The package is found, not imported: importing byteps.server starts a server."""
    spec = importlib.util.find_spec("byteps")
    if spec is None or not spec.submodule_search_locations:
        return "the BytePS fork is not installed (make byteps)"
    pkg = list(spec.submodule_search_locations)[0]
    for sub in parts:
        d = os.path.join(pkg, sub)
        if not (os.path.isdir(d) and any(f.startswith("c_lib") and f.endswith(".so")
                                         for f in os.listdir(d))):
            return f"the BytePS fork's {sub} library is missing (make byteps)"
    return None


def _cpu_allocation(local_size: int, environ: Mapping[str, str]) -> Optional[List[str]]:
    """numactl CPU lists per local worker, or None when pinning is off or impossible."""
    if not env.NUMA_ON.get(environ) or shutil.which("numactl") is None:
        return None
    override = env.VISIBLE_CPU_CORES.get(environ) or ""
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
    role = env.ROLE.get(environ) or ""
    if role not in ("worker", "server", "scheduler"):
        raise ValueError(f"{env.ROLE.name} must be worker, server or scheduler "
                         "(or use --local N)")
    cluster = [env.NUM_SERVER, env.PS_ROOT_URI, env.PS_ROOT_PORT]
    required = [env.NUM_WORKER] if role == "worker" else [env.NUM_WORKER] + cluster
    if role == "worker" and env.NUM_WORKER.get(environ) > 1:
        required += cluster + [env.WORKER_ID]
    missing = [s.name for s in required if s.name not in environ]
    if missing:
        raise ValueError(f"{env.ROLE.name}={role} needs {', '.join(missing)} in the environment")
    penv = with_package_path(dict(environ))
    penv["PYTHONUNBUFFERED"] = "1"
    if role != "worker":
        distributed = env.FORCE_DISTRIBUTED.get(penv) or env.NUM_WORKER.get(penv) > 1
        if not distributed:
            return []
        return [ProcSpec(role, role, server_argv(), penv)]
    if not command:
        raise ValueError("a worker needs a command: bpslaunch [flags] CMD ...")
    gpus = env.VISIBLE_DEVICES.get(penv)
    local_size = env.LOCAL_SIZE.get(penv) or (len(gpus.split(",")) if gpus else 1)
    alloc = _cpu_allocation(local_size, penv)
    specs = []
    for i in range(local_size):
        wenv = dict(penv, **{env.LOCAL_RANK.name: str(i), env.LOCAL_SIZE.name: str(local_size)})
        argv = list(command)
        if len(argv) == 1 and " " in argv[0]:
            argv = ["/bin/sh", "-c", argv[0]]  # upstream accepted one quoted shell string
        if env.ENABLE_GDB.get(penv):
            argv = ["gdb", "-ex", "run", "-ex", "bt", "-batch", "--args"] + argv
        if alloc:
            argv = ["numactl", "--physcpubind", alloc[i]] + argv
        specs.append(ProcSpec(f"worker {env.WORKER_ID.get(penv)}.{i}"
                              if local_size > 1 else "worker", "worker", argv, wenv))
    return specs


def run_role(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None,
             out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    environ.update(compression_env(ns, environ))
    err = err if err is not None else sys.stderr
    try:
        environ.update(liveness_env(ns, environ))
        environ.update(key_env(getattr(ns, "cluster_key", None), False, environ))
    except ValueError as e:
        err.write(f"bpslaunch: {e}\n")
        return 2
    if env.COMPRESSOR.get(environ) != "none":
        environ.setdefault(env.THREADPOOL_SIZE.name, str(env.threadpool_size(1)))
    # the server loop runs under this interpreter; keep its directory first on PATH for CMD too
    bindir = os.path.dirname(sys.executable)
    environ["PATH"] = bindir + os.pathsep + environ.get("PATH", "")
    try:
        specs = role_specs(environ, ns.command)
    except ValueError as e:
        err.write(f"bpslaunch: {e}\n")
        return 2
    role = env.ROLE.get(environ)
    workers = [s for s in specs if s.role == "worker"]
    try:  # BytePS's rank of a worker: DMLC_WORKER_ID * BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK
        trace_dirs(environ, [env.WORKER_ID.get(environ) * len(workers) +
                             env.LOCAL_RANK.get(s.env) for s in workers])
    except ValueError as e:
        err.write(f"bpslaunch: {e}\n")
        return 2
    if not specs:
        err.write(f"bpslaunch: not distributed ({env.NUM_WORKER.name}=1): nothing to run for "
                  f"{role}; set {env.FORCE_DISTRIBUTED.name}=1 to run it anyway\n")
        return 0
    key = env.CLUSTER_KEY.get(environ)
    err.write(f"BytePS launching {role}{f' (cluster key {key})' if key else ''}\n")
    err.flush()
    # One process: no prefix and no grace period needed; several local workers: supervised.
    sup = Supervisor(specs, out=out, err=err, prefix=len(specs) > 1, grace=ns.grace,
                     timeout=ns.timeout)
    try:
        return sup.run().code
    except RuntimeError as e:
        err.write(f"bpslaunch: {e}\n")
        return 1

