"""A SIGHUP reload applies ``timeouts.read_s`` (and ``connect_s``, ``limits.max_response_header_bytes``)
to the next upstream exchange: the pool copied them at start and kept them, while the reload reported
"configuration reloaded" with nothing pending. In-process proxy, an origin on 127.0.0.1 that never
answers or answers late, every wait bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def config(tmp: Path, read_s: float, connect_s: float = 10.0, **sections: object) -> Config:
    return parse_config(
        {
            "data_dir": str(tmp),
            "listen": "127.0.0.1:0",
            "intercept": {"enabled": False},
            "log": {"access_log": False},
            "hosts": {"unsigned": ["127.0.0.1"]},
            "timeouts": {"read_s": read_s, "connect_s": connect_s},
            **sections,
        }
    )


@contextlib.asynccontextmanager
async def origin(answer: Answer) -> AsyncIterator[int]:
    """An origin on 127.0.0.1 that reads a request head, then runs ``answer``; yields its port."""
    handlers: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await answer(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)


async def never(_writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()  # cancelled when the origin stops


async def late(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(1.5)  # the scenario itself: longer than the short timeout, far below the long
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()


async def status_through(proxy: tuple[str, int], port: int) -> bytes:
    """The status line of ``GET http://127.0.0.1:PORT/`` through the proxy (bounded by WAIT_S)."""
    reader, writer = await asyncio.open_connection(*proxy)
    try:
        target = f"127.0.0.1:{port}"
        writer.write(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        return head.split(b"\r\n")[0]
    finally:
        writer.close()


async def test_a_shorter_read_timeout_applies_to_the_next_request(tmp_path: Path) -> None:
    app = ProxyApp(config(tmp_path, read_s=60), StaticKeyProvider(SigningKey.generate()))
    [proxy] = await app.start()
    try:
        assert app.reload(config(tmp_path, read_s=0.5)) == []
        async with origin(never) as port:
            # before: the 60 s of the start-up configuration, past this test's bound of WAIT_S
            assert await status_through(proxy, port) == b"HTTP/1.1 504 Gateway Timeout"
    finally:
        await app.stop(drain_s=0)


async def test_a_longer_read_timeout_lets_a_late_answer_through(tmp_path: Path) -> None:
    app = ProxyApp(config(tmp_path, read_s=0.3), StaticKeyProvider(SigningKey.generate()))
    [proxy] = await app.start()
    try:
        async with origin(late) as port:
            assert await status_through(proxy, port) == b"HTTP/1.1 504 Gateway Timeout"
            assert app.reload(config(tmp_path, read_s=30)) == []
            assert await status_through(proxy, port) == b"HTTP/1.1 200 OK"  # before: 504 again
    finally:
        await app.stop(drain_s=0)


async def test_the_pool_takes_the_reloaded_connect_timeout_and_head_limit(tmp_path: Path) -> None:
    app = ProxyApp(config(tmp_path, read_s=60), StaticKeyProvider(SigningKey.generate()))
    try:
        new = config(tmp_path, read_s=7, connect_s=2.5, limits={"max_response_header_bytes": 4096})
        assert app.reload(new) == []
        assert (app.pool.connect_timeout_s, app.pool.read_timeout_s, app.pool.max_head_bytes) == (
            2.5,
            7,
            4096,
        )
    finally:
        await app.stop(drain_s=0)
