"""A failed upstream exchange leaves nothing for the cycle collector: request, body and connections
go as soon as the client has its ``502``.

A review found each failed forward kept in a reference cycle: the response stream's future held the
``ProxyError``, the error's traceback held ``forward``'s frame (and the handler's, with the request
body and the signed ``Outgoing``), and ``forward``'s frame held the stream and so the future. The
proxy freezes its start-up heap and raises the young generation's threshold (``cli.run``), so such a
cycle waits long for a full pass: 160 failed 10 MiB uploads kept 1.7 GB while idle. Discovery shared
a failed manifest fetch with its waiters the same way (the future kept the error that each raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from pathlib import Path

import pytest

from signing_proxy.config import DiscoveryConfig, parse_config
from signing_proxy.core.errors import ManifestError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.errors import ProxyError
from signing_proxy.net.client import FetchedResponse
from signing_proxy.proxy.discovery import Discovery
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S
from tests.memory import left_in_cycles
from tests.proxy.raw_upstream import raw_backend

KEY = SigningKey.generate()
BODY = b"u" * (1024 * 1024)
MANIFEST_URL = "http://127.0.0.1:9/.well-known/svc.json"


def read_then_reset(conn: socket.socket) -> None:
    """Reads one request head and its Content-Length body, then resets the connection unanswered."""
    conn.settimeout(WAIT_S)
    with conn, contextlib.suppress(OSError):
        got = b""
        while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length and (chunk := conn.recv(65536)):
            body += chunk
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def upload_answered_502(tmp: Path, origin_port: int) -> bytes:
    authority = f"127.0.0.1:{origin_port}"
    return await answered(
        tmp,
        f"POST http://{authority}/upload HTTP/1.1\r\nHost: {authority}\r\n"
        f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode()
        + BODY,
    )


async def answered(tmp: Path, request: bytes) -> bytes:
    """What an in-process proxy (signing with ``KEY``) answers ``request``, read to its close."""
    config = parse_config(
        {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), "intercept": {"enabled": False}}
    )
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(-1), WAIT_S)  # to the close: the handler is done
        writer.close()
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), WAIT_S)
        return answer
    finally:
        await app.stop()


def test_a_failed_forward_is_freed_without_the_cycle_collector(
    tmp_path: Path, no_cycle_collector: None
) -> None:
    with raw_backend(read_then_reset) as origin_port, asyncio.Runner() as runner:
        answer = runner.run(upload_answered_502(tmp_path, origin_port))
        cycles = left_in_cycles()
    assert answer.startswith(b"HTTP/1.1 502 "), answer[:200]
    assert b"upstream-reset" in answer
    for held in ("forward", "ProxyHandler.serve", "ResponseStream", "UpstreamConnection", "Request"):
        assert cycles[held] == 0, (held, cycles)


async def manifest_refused_to_three(fail: bool) -> tuple[list[str], int]:
    """Three refusals at once want the same manifest; its one fetch fails (or its body is no JSON):
    what each was told, and how many fetches went."""
    all_in = asyncio.Event()  # the three have asked: the first fetches, the others wait on it
    asked: list[int] = []

    async def fetch(
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
        egress: bool = False,
    ) -> FetchedResponse:
        await all_in.wait()
        if fail:
            raise ProxyError(502, "upstream-reset", "the upstream closed the connection mid-response")
        return FetchedResponse(200, "OK", (), b"not a manifest " * 1000)

    discovery = Discovery(DiscoveryConfig, fetch)

    async def refused() -> str:
        asked.append(1)
        if len(asked) == 3:
            all_in.set()  # the third asks next, in this same step: the fetch resumes after
        try:
            await discovery.manifest(MANIFEST_URL, same_origin=True)
        except ManifestError as exc:
            return exc.reason
        return "fetched"

    reasons = await asyncio.wait_for(asyncio.gather(*(refused() for _ in range(3))), WAIT_S)
    return list(reasons), discovery.fetches


@pytest.mark.parametrize(("fail", "reason"), [(True, "manifest-fetch-failed"), (False, "manifest-malformed")])
def test_a_failed_manifest_fetch_shared_by_waiters_is_freed_without_the_cycle_collector(
    fail: bool, reason: str, no_cycle_collector: None
) -> None:
    with asyncio.Runner() as runner:
        reasons, fetches = runner.run(manifest_refused_to_three(fail))
        cycles = left_in_cycles()
    assert (reasons, fetches) == ([reason] * 3, 1)
    for held in ("Discovery.manifest", "Discovery._fetch", "ManifestError"):
        assert cycles[held] == 0, (held, cycles)
