"""A peer's bad reply reaches a real ps-lite worker (harness/thc_client.cc, against
the real BytePS scheduler and server) as a failure that names the server, not as an abort:

- a pull reply larger than the worker's buffer (the server holds more bytes for the key than
  the worker expects, as when two builds or two models disagree on a tensor's size) ends the
  client with ps-lite's status 1 and the report, where it used to end in a CHECK and SIGABRT;
  a BytePS worker gets the same report through FailCluster, as its exception. The server
  stays up.
"""
from __future__ import annotations

import time

import pytest

from harness import pslite as tc

pytestmark = pytest.mark.needs_fork("server")


def test_oversized_pull_reply_fails_the_worker_naming_the_server(tmp_path, client_exe):
    c = tc.Cluster(2, tmp_path, client_exe, tc.server_argv())
    try:
        d = 4096  # float32 values: the server holds 4 * d bytes for the key
        key, cmd = 40 << 16, tc.command(tc.DEFAULT, tc.FLOAT32)
        data = tmp_path / "x.bin"
        data.write_bytes(bytes(4 * d))
        c.all([f"push {key} {cmd} {data}"] * 2)  # the init push
        c.all([f"push {key} {cmd} {data}"] * 2)  # one round
        small = 1024  # the worker's buffer: a quarter of the reply
        with pytest.raises(RuntimeError, match="client died"):
            c.clients[0].cmd(f"pull {key} {cmd} {small} {tmp_path / 'out.bin'}", timeout=60)
        proc = c.clients[0].proc
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        log = c.clients[0].tail()
        assert proc.returncode == 1, (proc.returncode, log)  # not -6 (SIGABRT)
        assert "Check failed" not in log, log
        assert "server rank 0 (ps-lite node 8, 127.0.0.1:" in log, log
        assert (f"answered the pull of key {key} with {4 * d} bytes, more than the {small} "
                "bytes this worker expects") in log, log
        assert c.server_alive(), c.server_text()[-3000:]
    finally:
        c.close()
