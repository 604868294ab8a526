"""SIGTERM stops ``signing-proxy run`` while another process holds its key store's lock.

The fault: the store's reload ran on ``asyncio.to_thread`` and waited in ``flock`` for as long as
the other process (a ``keys`` command stopped with Ctrl-Z) held the lock; ``asyncio.run`` waits
for that thread at exit, so the proxy outlived SIGTERM and its drain time by as much.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

from tests.harness import WAIT_S, ProxyProcess, wait_for

DRAIN_S = 1.0


def test_sigterm_stops_the_proxy_while_another_process_holds_the_store_lock(tmp_path: Path) -> None:
    config = {"signing": {"key": None}, "timeouts": {"drain_s": DRAIN_S}}  # the key store signs
    with ProxyProcess(tmp_path, config) as proxy:
        assert proxy.proc is not None
        fd = os.open(tmp_path / "data" / "keys" / "default" / ".lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # as another process would: a descriptor of its own
            proxy.proc.send_signal(signal.SIGHUP)  # a re-read of the store, now

            def met_the_lock() -> bool:
                return any("locked by another process" in line for line in proxy.stderr_lines)

            wait_for(met_the_lock, "the reload to meet the held lock")
            proxy.proc.send_signal(signal.SIGTERM)
            try:
                code = proxy.proc.wait(WAIT_S)  # the lock is still held
            except subprocess.TimeoutExpired:
                code = None
            assert code == 0, "\n".join(proxy.stderr_lines[-10:])
        finally:
            os.close(fd)
