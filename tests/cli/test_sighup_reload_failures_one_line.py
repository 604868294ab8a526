"""Whatever a SIGHUP reload fails on is one log line, without the value that failed, and the running
configuration keeps serving; a FIFO at the configuration's path is refused, not waited on.

``pin: !!int SECRET`` raised ValueError out of the reload: asyncio printed a multi-line traceback
(past the log's format) holding the PIN, and the ``--workers`` parent logged one too. A FIFO put at
the path held the event loop in its read: no request was answered and SIGTERM did nothing until
someone wrote to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from signing_proxy.cli import run
from signing_proxy.config import Config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S, ProxyProcess, stop_process, wait_for

pytestmark = pytest.mark.integration

SECRET = "MYSECRETPIN4711"
REFUSED = "SIGHUP: new configuration refused, the running one keeps serving"
PARENT_FAILED = "SIGHUP: re-reading the configuration for restarted workers failed (ValueError)"
WORKERS = {"one loop": (), "two workers": ("--workers", "2")}


def said(lines: list[str], text: str) -> int:
    return sum(text in line for line in list(lines))


def status_line(port: int) -> bytes:
    """The status line of ``GET /healthz`` on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.settimeout(WAIT_S)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
        with sock.makefile("rb") as answer:
            return answer.readline().rstrip()


def no_traceback_nor_secret(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    assert SECRET not in text, text


@pytest.mark.parametrize("extra", list(WORKERS.values()), ids=list(WORKERS))
def test_a_tagged_value_on_sighup_is_refused_on_one_line(tmp_path: Path, extra: tuple[str, ...]) -> None:
    workers = 2 if extra else 1
    with ProxyProcess(tmp_path, extra_args=extra) as proxy:
        assert proxy.proc is not None
        wait_for(lambda: said(proxy.stderr_lines, "listening on") >= workers, "every loop listening")
        text = yaml.safe_dump(proxy.config) + f"upstream:\n  ca_file: !!int {SECRET}\n"
        where = f"line {len(text.splitlines())}, column 12"  # the tag, on the last line
        (tmp_path / "config.yaml").write_text(text)
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: said(proxy.stderr_lines, REFUSED) >= workers, "the refusal of each loop")
        assert status_line(proxy.port).startswith(b"HTTP/1.1 200")
    # stopped: the parent went through its SIGHUP before its SIGTERM, every line is in
    lines = proxy.stderr_lines
    no_traceback_nor_secret(lines)
    refusals = [line for line in lines if REFUSED in line]
    assert all("YAML tags" in line and where in line for line in refusals), refusals


FAILING_READ = """
import os, sys
from signing_proxy.cli import run
from signing_proxy.cli.main import main

real = run.config_from


def config_from(args):
    if os.path.exists(sys.argv[1]):  # a bug of ours, its text quoting the file
        raise ValueError("the file held pin: MYSECRETPIN4711")
    return real(args)


run.config_from = config_from
raise SystemExit(main(sys.argv[2:]))
"""


@contextlib.contextmanager
def serving(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], list[str]]]:
    """``run`` through ``FAILING_READ``, its stderr lines collected; stopped by PID after."""
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
    command = [
        sys.executable,
        "-c",
        FAILING_READ,
        str(tmp_path / "fail"),
        "run",
        "--config",
        str(config),
        *args,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace").rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield proc, lines
    finally:
        stop_process(proc)
        reader.join(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize("extra", list(WORKERS.values()), ids=list(WORKERS))
def test_an_exception_not_ours_on_sighup_is_one_line_naming_its_type(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    workers = 2 if extra else 1
    with serving(tmp_path, *extra) as (proc, lines):
        wait_for(lambda: said(lines, "listening on") >= workers, "every loop listening")
        (tmp_path / "fail").touch()
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: said(lines, f"{REFUSED}: it could not be read or applied (ValueError)") >= workers,
            "refusals",
        )
        if extra:
            wait_for(lambda: said(lines, PARENT_FAILED) == 1, "the parent's line")
        assert proc.poll() is None
    no_traceback_nor_secret(lines)


def test_a_fifo_at_the_config_path_on_sighup_is_refused_and_serving_goes_on(tmp_path: Path) -> None:
    with ProxyProcess(tmp_path) as proxy:
        assert proxy.proc is not None
        path = tmp_path / "config.yaml"
        path.unlink()
        os.mkfifo(path)
        try:
            proxy.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: said(proxy.stderr_lines, REFUSED) == 1, "the refusal")
            assert status_line(proxy.port).startswith(b"HTTP/1.1 200")
        finally:  # a proxy waiting in the FIFO's read (the old code) gets its end of file
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    (line,) = [line for line in proxy.stderr_lines if REFUSED in line]
    assert f"{path}: not a regular file (a pipe is read at start-up only)" in line


class NeverApplied:
    """An app the reload never reaches: the read fails first."""

    def reload(self, config: Config) -> list[str]:
        raise AssertionError("a configuration that was never read was applied")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_reload_logs_an_exception_not_ours_by_its_type_only() -> None:
    """In process: nothing escapes ``_reload_config`` (asyncio would print it with a traceback)."""

    def reread() -> Config:
        raise KeyError(f"pin: {SECRET}")

    handler = Lines()
    logger = logging.getLogger("signing_proxy")
    logger.addHandler(handler)
    try:
        run._reload_config(typing.cast(ProxyApp, NeverApplied()), reread)
    finally:
        logger.removeHandler(handler)
    (record,) = handler.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is None
    assert record.getMessage() == f"{REFUSED}: it could not be read or applied (KeyError)"
