"""`bpslaunch --local N`: a whole BytePS cluster on this machine, every process supervised.

The scheduler, the servers and N workers on 127.0.0.1 with free ports, a private socket directory
and shared-memory prefix per worker, no CPU pinning, and BytePS's compression thread pool. The
fork tags its shared-memory names with DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT and DMLC_WORKER_ID
(patch 0007), and ps-lite binds DMLC_NODE_PORT rather than a plain PORT (patch 0008).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
from typing import List, Mapping, Optional, Sequence, TextIO

from .. import env
from .cli import compression_env, liveness_env, trace_dirs
from .cluster_key import key_env
from .role import server_argv, with_package_path
from .supervisor import ProcSpec, Supervisor

SHM_PREFIX = "BytePS_ShM_"   # the fork's shared-memory names: BytePS_ShM_<uri>_<port>_...
LOCAL_HOST = "127.0.0.1"


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
    common = {k: v for k, v in base_env.items() if k not in env.CLUSTER_OWNED}
    if extra_env:
        common.update(extra_env)
    common.update({
        env.NUM_WORKER.name: str(num_workers),
        env.NUM_SERVER.name: str(num_servers),
        env.PS_ROOT_URI.name: LOCAL_HOST,
        env.PS_ROOT_PORT.name: str(ports[0]),
        env.NODE_HOST.name: LOCAL_HOST,
        env.FORCE_DISTRIBUTED.name: "1",   # servers even for --local 1: a real cluster always
        env.NUMA_ON.name: "0",             # no numactl pinning of processes sharing one host
        "PYTHONUNBUFFERED": "1",
    })
    common.setdefault(env.THREADPOOL_SIZE.name, str(env.threadpool_size(num_workers)))
    common = with_package_path(common)
    cpus = env.available_cpus()
    role_cmd = list(role_argv) if role_argv is not None else server_argv()

    def role_env(role: str, port: int, **more: str):
        return dict(common, **{env.ROLE.name: role, env.NODE_PORT.name: str(port)}, **more)

    specs = [ProcSpec("scheduler", "scheduler", role_cmd, role_env("scheduler", ports[0]))]
    for i in range(num_servers):
        specs.append(ProcSpec(f"server {i}", "server", role_cmd, role_env("server", ports[1 + i])))
    for i in range(num_workers):
        wenv = role_env("worker", ports[1 + num_servers + i], **{
            env.WORKER_ID.name: str(i),
            env.LOCAL_RANK.name: "0",
            env.LOCAL_SIZE.name: "1",
            env.SOCKET_PATH.name: os.path.join(run_dir, f"worker{i}"),
        })
        wenv.setdefault("OMP_NUM_THREADS", str(max(1, cpus // num_workers)))
        specs.append(ProcSpec(f"worker {i}", "worker", list(command), wenv))
    return specs


def shm_prefixes(specs: Sequence[ProcSpec]) -> List[str]:
    """The names the workers' shared memory in /dev/shm starts with."""
    uri, port = env.PS_ROOT_URI.name, env.PS_ROOT_PORT.name
    return sorted({f"{SHM_PREFIX}{s.env[uri]}_{s.env[port]}_"
                   for s in specs if s.role == "worker" and port in s.env})


def run_local(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None,
              out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    num_servers = ns.servers or 1
    err = err if err is not None else sys.stderr
    run_dir = tempfile.mkdtemp(prefix="bps")  # the supervisor removes it (--secure's key too)
    try:
        extra = dict(compression_env(ns, environ), **liveness_env(ns, environ),
                     **key_env(getattr(ns, "cluster_key", None), getattr(ns, "secure", False),
                               environ, run_dir))
        trace_dirs(environ, range(ns.local))  # worker i is BytePS's rank i
    except ValueError as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        err.write(f"bpslaunch: {e}\n")
        return 2
    specs = local_cluster_specs(ns.local, num_servers, ns.command, environ, run_dir,
                                extra_env=extra)
    for s in specs:
        if s.role == "worker":
            os.makedirs(s.env[env.SOCKET_PATH.name], exist_ok=True)
    desc = ns.compressor or env.COMPRESSOR.get(environ)
    key = extra.get(env.CLUSTER_KEY.name)
    err.write(f"bpslaunch: local cluster: scheduler {LOCAL_HOST}:"
              f"{specs[0].env[env.NODE_PORT.name]}, {num_servers} server(s), {ns.local} "
              f"worker(s), compressor {desc}{', cluster key ' + key if key else ''}\n")
    err.flush()
    # stop_all removes the socket directories and the workers' shared memory (the watchdog does
    # when this process is killed outright)
    sup = Supervisor(specs, out=out, err=err, prefix=not ns.no_prefix, grace=ns.grace,
                     timeout=ns.timeout, dirs=[run_dir], shm_prefixes=shm_prefixes(specs))
    try:
        return sup.run().code
    except RuntimeError as e:
        err.write(f"bpslaunch: {e}\n")
        return 1
