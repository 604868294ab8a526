"""A request the engine refuses itself, before the handler sees it, is logged and counted too.

``net.server`` wrote the problem response for what it could not parse (or bound) and nothing else:
``414 uri-too-long``, ``431 too-many-header-fields``, ``400 malformed-request`` left no access-log
line and no ``signing_proxy_requests_total`` while a ``413`` in the same run had both. The README
promises one access-log line per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.proxy.accesslog import AccessLog
from signing_proxy.service.app import ProxyApp
from tests.harness import until

WAIT_S = 10.0
HEAD = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"


def counted(text: str, outcome: str) -> float:
    """``signing_proxy_requests_total`` for ``outcome`` (0 when absent)."""
    pattern = rf'^signing_proxy_requests_total\{{mode="agent",outcome="{re.escape(outcome)}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


Proxy = tuple[ProxyApp, int, list[str]]


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[Proxy]:
    config = parse_config(
        {
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path),
            "intercept": {"enabled": False},
            "log": {"access_log": False},  # the app's own log off: this test's log below takes its place
        }
    )
    app = ProxyApp(config, StaticKeyProvider(SigningKey.generate()))
    written: list[str] = []
    access = AccessLog(enabled=True, fmt="json", write=written.append)  # no writer: each line at once
    app.handler.policy = dataclasses.replace(app.handler.policy, access_log=access)
    [(_host, port)] = await app.start()
    try:
        yield app, port, written
    finally:
        await app.stop(drain_s=0)


def requests_logged(written: list[str]) -> list[dict[str, Any]]:
    docs = [json.loads(line) for block in written for line in block.splitlines()]
    return [doc for doc in docs if doc["event"] == "request"]


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``; everything answered until the proxy closes."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("data", "status", "outcome", "method"),
    [
        (
            b"GET http://a.example/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a.example\r\n\r\n",
            414,
            "uri-too-long",
            "-",
        ),
        (HEAD + b"X-A: b\r\n" * 300 + b"\r\n", 431, "too-many-header-fields", "-"),
        (HEAD + b"X-A: " + b"b" * 70_000 + b"\r\n\r\n", 431, "header-too-large", "-"),
        (b"\x16\x03\x01garbage\r\n\r\n", 400, "malformed-request", "-"),
        (HEAD + b"Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 400, "upgrade-not-supported", "GET"),
    ],
    ids=["414", "431-fields", "431-bytes", "400-garbage", "400-upgrade"],
)
async def test_a_request_refused_while_parsed_gets_its_line_and_its_count(
    proxy: Proxy, data: bytes, status: int, outcome: str, method: str
) -> None:
    app, port, written = proxy
    answer = await exchange(port, data)
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    assert counted(app.metrics.render().decode(), outcome) == 1
    [doc] = requests_logged(written)  # written before the answer left
    assert (doc["status"], doc["outcome"], doc["method"], doc["host"]) == (status, outcome, method, "-")
    assert doc["client"] == "127.0.0.1"


async def test_a_refusal_in_its_turn_after_a_pipelined_request_is_logged_after_it(proxy: Proxy) -> None:
    """RFC 9112 section 9.3.2: the request read before the broken one is answered first, then the
    refusal; each has its line, in that order."""
    app, port, written = proxy
    answer = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01garbage\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 400 " in answer
    assert [(doc["status"], doc["outcome"]) for doc in requests_logged(written)] == [
        (200, "local"),
        (400, "malformed-request"),
    ]
    assert counted(app.metrics.render().decode(), "malformed-request") == 1


async def test_a_body_broken_while_served_is_logged_once_with_its_refusal(proxy: Proxy) -> None:
    """The engine's refusal and the handler's own end were each logged (400 malformed-request, then
    the same request again as aborted): one request, one line, the status the client got."""
    app, port, written = proxy
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        writer.write(
            b"POST http://a.example/x HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n"
        )
        await until(lambda: any(conn.busy for conn in app.engine.connections), "the body being read")
        writer.write(b"zz\r\n")  # not a chunk size
        answer = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    await until(lambda: requests_logged(written), "the handler's line")  # written as it ends
    await asyncio.sleep(0.05)  # a second line, had one been written, would be there by now
    lines = [(d["method"], d["host"], d["status"], d["outcome"]) for d in requests_logged(written)]
    assert lines == [("POST", "a.example", 400, "malformed-request")]
    assert counted(app.metrics.render().decode(), "malformed-request") == 1
