"""A real ``redis-server`` on a loopback port for tests; stopped by PID.

Redis cannot bind port 0 and report it, so a free port is picked just before the start and the
start is retried on another one if that port was taken meanwhile. Ready means it answered PING.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.harness import WAIT_S, free_port, stop_process

ATTEMPTS = 5


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``redis-server`` with no persistence, bound to 127.0.0.1 on a free port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        for _attempt in range(ATTEMPTS):
            port = free_port()
            proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.tmp),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + WAIT_S
            while proc.poll() is None and time.monotonic() < deadline:
                if _ping(port):
                    self.port, self.proc = port, proc
                    return self
                time.sleep(0.02)
            proc.kill()  # the port was taken meanwhile, or it never answered: try another
            proc.wait(WAIT_S)
        raise RuntimeError("redis-server did not start")

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)
