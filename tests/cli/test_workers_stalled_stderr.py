"""``run --workers N`` with a stderr nobody reads: the parent's log lines and the workers' status lines
are dropped, never waited on; a worker that dies is restarted, and SIGTERM ends them all."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, children, wait_for

pytestmark = pytest.mark.integration


def read_until(fd: int, count: int, text: bytes) -> bytes:
    """What ``fd`` gives until ``text`` was in it ``count`` times (each read waited for ``WAIT_S``)."""
    seen = b""
    deadline = time.monotonic() + WAIT_S
    while seen.count(text) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        assert chunk, f"no {count} x {text!r} within {WAIT_S} s: {seen!r}"
        seen += chunk
    return seen


def test_a_worker_dying_with_stderr_full_is_restarted_and_sigterm_ends_the_parent(tmp_path: Path) -> None:
    """The parent logged "worker N exited unexpectedly" straight to stderr: with the pipe full it
    stayed in that write, restarted no worker, and never went back to wait() after SIGTERM."""
    key = tmp_path / "agent-key.pem"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(SigningKey.generate().to_pem())
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), "signing": {"key": str(key)}}
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--config", str(config), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        env=env,
        start_new_session=True,  # its own group: SIGKILLed whole at the end, whatever is left
    )
    os.close(write_end)
    try:
        read_until(read_end, 2, b"listening on")
        # the pipe filled through a description of our own: O_NONBLOCK on the proxy's would change it
        filler = os.open(f"/proc/{proc.pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
        try:
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(filler, b"x" * 4096)
        finally:
            os.close(filler)
        first = children(proc.pid)
        assert len(first) == 2
        os.kill(min(first), signal.SIGKILL)
        wait_for(lambda: bool(children(proc.pid) - first), "the parent restarting the worker")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent still running {WAIT_S} s after SIGTERM, its stderr full")
    finally:
        os.close(read_end)  # a writer still waiting gets EPIPE
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)
