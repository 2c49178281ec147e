"""The cluster key: one secret that every node of a cluster holds, and nobody else.

ps-lite (cluster_key.cc, patch 0022) reads the file that BYTEPS_THC_CLUSTER_KEY names and puts
every ZeroMQ connection of the node under CURVE: a peer without the file can neither join, push,
pull nor read. This module makes key files and checks them before anything is launched, with the
same rules as ps-lite (which checks again, for nodes started without bpslaunch):

- the file holds '#' comment lines and one line of 64 hex digits, the 32-byte Curve25519 secret
  key (the public key follows from it);
- it is a regular file that only its owner may read or write (mode 0600 or stricter).
"""
from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from typing import Dict, Mapping

from .. import env

KEY_BYTES = 32
HEADER = ("# byteps-thc cluster key (ZeroMQ CURVE secret key, hex). Every node of the\n"
          "# cluster needs a copy (bpslaunch --cluster-key FILE); whoever has it can join.\n")
_KEY_LINE = re.compile(r"^[0-9a-fA-F]{%d}$" % (2 * KEY_BYTES))


def new_key(path: str) -> str:
    """Write a fresh key to `path` (created with mode 0600; never over an existing file) and
    return its absolute path. ValueError says why not."""
    path = os.path.abspath(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ValueError(f"{path} exists: a new key would lock out the nodes that hold it; "
                         "remove it first or choose another name") from None
    except OSError as e:
        raise ValueError(f"cannot create {path}: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(HEADER + secrets.token_hex(KEY_BYTES) + "\n")
    return path


def check_key(path: str) -> str:
    """The absolute path of a usable key file; ValueError names the problem and the fix."""
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"cluster key {path}: cannot read it ({e.strerror}); make one with "
                         "`bpslaunch --new-cluster-key FILE` and give every node a copy") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"cluster key {path}: not a regular file")
    if st.st_mode & 0o077:
        raise ValueError(f"cluster key {path}: mode {stat.S_IMODE(st.st_mode):04o} lets others "
                         f"read or change the key; `chmod 600 {path}` and try again")
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.strip().startswith("#")]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cluster key {path}: cannot read it ({e})") from None
    if len(lines) != 1 or not _KEY_LINE.match(lines[0]):
        raise ValueError(f"cluster key {path}: not a cluster key file (one line of "
                         f"{2 * KEY_BYTES} hex digits is expected); make one with "
                         "`bpslaunch --new-cluster-key FILE`")
    return path


def key_env(key_file: str | None, secure: bool, environ: Mapping[str, str],
            run_dir: str | None = None) -> Dict[str, str]:
    """BYTEPS_THC_CLUSTER_KEY for every process bpslaunch starts: `key_file` (--cluster-key),
    else the environment's, checked; with `secure` (--local N --secure) and neither, a fresh key
    in `run_dir` (the local cluster's private folder). Nothing when no key is asked for."""
    path = key_file or env.CLUSTER_KEY.get(environ)
    if not path and secure:
        path = new_key(os.path.join(run_dir or tempfile.mkdtemp(prefix="bps"), "cluster.key"))
    if not path:
        return {}
    return {env.CLUSTER_KEY.name: check_key(path)}
