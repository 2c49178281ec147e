"""bpslaunch: BytePS's launcher with compression flags and a one-command local cluster.

Two ways to use it:

1. As upstream: one role per call, chosen by DMLC_ROLE and the other DMLC_*/BYTEPS_* variables
   (one machine of a real cluster). A worker runs CMD once per local GPU; a server or the
   scheduler runs BytePS's server loop. Flags such as `--compressor thc` only add environment.

       DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch --compressor thc python train.py

2. A whole cluster on this machine, every process supervised:

       bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py

   starts the scheduler, the servers (--servers, default 1) and N workers on 127.0.0.1. Each line
   a process prints is prefixed with its name ("[worker 1] ..."). When any process fails (non-zero
   exit, a signal, a server or the scheduler leaving early, workers that finished while another
   hangs) the launcher stops every process group it started and exits non-zero, naming the process.

Modules: cli (flags -> environment), cluster_key (key files: --new-cluster-key, --cluster-key,
--secure), role (one role from DMLC_*), local (--local N; uses role's server command), supervisor
(process groups; knows nothing about BytePS) and watchdog (a program the supervisor runs).
Imports go one way: local -> role -> cli, both -> cluster_key and supervisor.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from .cli import COMPRESSORS, build_parser, compression_env, liveness_env, parse_args, thc_config
from .cluster_key import check_key, key_env, new_key
from .local import SHM_PREFIX, free_ports, local_cluster_specs, run_local, shm_prefixes
from .role import fork_missing, role_specs, run_role, server_argv, with_package_path
from .supervisor import Outcome, ProcSpec, Supervisor

__all__ = ["main", "COMPRESSORS", "build_parser", "compression_env", "liveness_env", "parse_args",
           "thc_config", "check_key", "key_env", "new_key",
           "SHM_PREFIX", "free_ports", "local_cluster_specs", "run_local", "shm_prefixes",
           "fork_missing", "role_specs", "run_role", "server_argv", "with_package_path",
           "Outcome", "ProcSpec", "Supervisor"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """bpslaunch: `--local N` runs a whole cluster here, otherwise the one role DMLC_ROLE names."""
    ns = parse_args(argv)
    if ns.new_cluster_key is not None:
        try:
            path = new_key(ns.new_cluster_key)
        except ValueError as e:
            print(f"bpslaunch: {e}", file=sys.stderr)
            return 2
        print(f"bpslaunch: wrote a new cluster key to {path} (mode 0600); give every node of the "
              f"cluster a copy, kept secret, and launch each with --cluster-key {path}",
              file=sys.stderr)
        return 0
    if ns.local is not None:
        return run_local(ns)
    return run_role(ns)
