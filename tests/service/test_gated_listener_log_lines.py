"""What aiohttp logs of a request to our gated listeners (admin, publication, verify-origin) is one
line under ``signing_proxy.http``: the client and the exception's type, never its traceback or text.

aiohttp logged through its own ``aiohttp.server`` logger, which nobody configures: Python's
last-resort handler wrote a traceback quoting the malformed header line (``Authorization: Bearer
...``) to stderr, over many lines past ``log.format: json``, in a blocking write that a stderr nobody
reads held, the proxy's event loop with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from signing_proxy.service.gate import Gate, start_gated
from tests.gate_client import answer_head
from tests.harness import WAIT_S, ProxyProcess, stop_process

SECRET = "SECRET-XYZ"
MALFORMED = f"GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\x01\r\n\r\n".encode()
HTTP_LOGGER = "signing_proxy.http"  # gate.HTTP_LOGGER, spelled out: the name is what this file checks


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.http = asyncio.Event()  # a record under HTTP_LOGGER came

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.name == HTTP_LOGGER:
            self.http.set()


@contextlib.contextmanager
def recording(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records logged under ``name`` (at any level), the logger put back after."""
    with recorder(name) as handler:
        yield handler.records


@contextlib.contextmanager
def recorder(name: str) -> Iterator[Records]:
    """``recording``'s handler itself (its ``http`` event)."""
    logger = logging.getLogger(name)
    saved = logger.level
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


async def hello(_request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def broken(_request: web.Request) -> web.Response:
    raise KeyError(f"a value from the request: {SECRET}")


async def reads(request: web.Request) -> web.Response:
    return web.Response(text=str(len(await request.read())))


@contextlib.asynccontextmanager
async def gated_listener() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_get("/broken", broken)
    app.router.add_post("/reads", reads)
    runner = await start_gated(app, Gate(max_connections=8, idle_s=WAIT_S), "127.0.0.1", 0, reuse_port=False)
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        writer.write(request)
        return await answer_head(reader)  # aiohttp logs before it answers
    finally:
        writer.close()


async def test_a_malformed_request_is_one_info_line_naming_the_client_and_the_exception_type() -> None:
    with recording("signing_proxy") as ours, recording("aiohttp") as aiohttps:
        async with gated_listener() as port:
            head = await ask(port, MALFORMED)
    assert head.split(b" ", 2)[1] == b"400"
    assert aiohttps == []  # nothing left for aiohttp's own logger, hence for the last-resort handler
    assert [r.getMessage() for r in ours if r.name == HTTP_LOGGER] == [
        "Error handling request from 127.0.0.1: BadHttpMessage"
    ]
    [record] = [r for r in ours if r.name == HTTP_LOGGER]
    assert record.levelno == logging.INFO  # the client's doing, not ours
    assert record.exc_info is None
    assert record.exc_text is None


async def test_an_exception_in_a_handler_is_one_error_line_naming_where_without_its_text() -> None:
    with recording("signing_proxy") as ours:
        async with gated_listener() as port:
            head = await ask(port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"500"
    said = [r for r in ours if r.name == HTTP_LOGGER]
    assert len(said) == 1, [r.name for r in ours]
    [record] = said
    assert record.levelno == logging.ERROR
    assert record.exc_info is None
    message = record.getMessage()
    assert message.startswith("Error handling request from 127.0.0.1: KeyError at ")
    assert f"{Path(__file__).name}:" in message
    assert message.endswith(" in broken")
    assert SECRET not in message
    assert "\n" not in message


async def test_a_client_that_resets_mid_body_is_an_info_line_not_our_bug() -> None:
    """A stranger that sent part of a body and reset was logged at error with a location, as an
    exception of ours: anyone could write such lines into the log."""
    with recorder("signing_proxy") as handler:
        ours = handler.records
        async with gated_listener() as port:
            sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
            sock.sendall(b"POST /reads HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"b" * 10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset
            await asyncio.wait_for(handler.http.wait(), WAIT_S)
    said = [r for r in ours if r.name == HTTP_LOGGER]
    assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]
    assert " at " not in said[0].getMessage()


# --- the proxy's publication listener, a real process ---------------------------------------------------


def publishing(tmp_path: Path, log_format: str) -> ProxyProcess:
    return ProxyProcess(
        tmp_path,
        {
            "publish": {"listen": "127.0.0.1:0", "domain": "agent.example"},
            # publishing serves the key store's keys: no signing.key (ProxyProcess writes one otherwise)
            "signing": {"key": None, "signature_agent": "https://agent.example"},
            "log": {"level": "info", "format": log_format},
        },
    )


def read_until(fd: int, text: bytes) -> bytes:
    """What ``fd`` gives until ``text`` is in it (each read waited for ``WAIT_S``)."""
    seen = b""
    deadline = time.monotonic() + WAIT_S
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        assert chunk, f"no {text!r} within {WAIT_S} s: {seen!r}"
        seen += chunk
    return seen


def port_of(said: bytes, seen: bytes) -> int:
    """The port in the status line ``said on http://127.0.0.1:PORT``."""
    found = re.search(re.escape(said) + rb" http://127\.0\.0\.1:(\d+)", seen)
    assert found, seen
    return int(found[1])


def raw_answer(port: int, request: bytes) -> bytes:
    """The first bytes of the answer to ``request``."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        return sock.recv(65536)


@pytest.mark.integration
def test_publication_listener_json_log_keeps_one_object_a_line_and_no_token(tmp_path: Path) -> None:
    proxy = publishing(tmp_path, "json")
    with proxy:
        assert proxy.publish_port
        started = len(proxy.stderr_lines)
        answer = raw_answer(proxy.publish_port, MALFORMED)
        assert answer.split(b" ", 2)[1] == b"400"
    # stopped: its stderr read to the end
    everything = "\n".join(proxy.stderr_lines)
    assert SECRET not in everything
    after = [line for line in proxy.stderr_lines[started:] if line.strip()]
    objects = [json.loads(line) for line in after]  # every line one JSON object
    said = [o for o in objects if o.get("logger") == HTTP_LOGGER]
    assert [o["message"] for o in said] == ["Error handling request from 127.0.0.1: BadHttpMessage"]
    assert "exc" not in said[0]


@pytest.mark.integration
def test_a_stderr_nobody_reads_never_holds_the_publication_listener(tmp_path: Path) -> None:
    """With stderr full, the first traceback written to it blocked the proxy's event loop: neither
    listener answered again, and SIGTERM was not acted on."""
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path / "data"),
                "signing": {"signature_agent": "https://agent.example"},  # the key store's keys
                "publish": {"listen": "127.0.0.1:0", "domain": "agent.example"},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        env=env,
    )
    os.close(write_end)
    try:
        seen = read_until(read_end, b"listening on")
        publish_port, proxy_port = (port_of(said, seen) for said in (b"publishing on", b"listening on"))
        # the pipe filled through a description of our own: O_NONBLOCK on the proxy's would change it
        filler = os.open(f"/proc/{proc.pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
        try:
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(filler, b"x" * 4096)
        finally:
            os.close(filler)
        for _ in range(3):
            assert raw_answer(publish_port, MALFORMED).split(b" ", 2)[1] == b"400"
        healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert raw_answer(proxy_port, healthz).startswith(b"HTTP/1.1 200 ")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the proxy still running {WAIT_S} s after SIGTERM, its stderr full")
    finally:
        os.close(read_end)  # a writer still waiting gets EPIPE
        stop_process(proc)
