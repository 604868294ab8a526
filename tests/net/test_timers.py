"""``Deadline``: one loop timer for a deadline that moves with every request.

Moving the deadline later costs no timer; the armed one re-arms for what remains when it fires early.
Moving it earlier re-arms at once. A cleared or cancelled deadline calls nothing, and lets go of its
callback (often a method of its owner, which holds the deadline: a cycle would outlive the owner).
"""

from __future__ import annotations

import asyncio
import weakref

import pytest

from signing_proxy.config import UpstreamConfig
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net import upstream
from signing_proxy.net.timers import TIMER_SLACK_S, Deadline
from signing_proxy.net.upstream import UpstreamPool

STEP_S = 0.05


async def test_it_fires_at_the_deadline_not_before() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = Deadline(loop)
    due = loop.time() + STEP_S
    deadline.set(due, lambda: fired.append(loop.time()))
    await asyncio.sleep(STEP_S / 2)
    assert fired == []
    await asyncio.sleep(STEP_S * 2)
    assert len(fired) == 1
    assert fired[0] >= due - TIMER_SLACK_S


async def test_a_deadline_moved_later_fires_once_at_the_new_time() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = Deadline(loop)
    deadline.set(loop.time() + STEP_S, lambda: fired.append(loop.time()))
    await asyncio.sleep(STEP_S / 2)
    later = loop.time() + STEP_S * 2  # past the armed timer: it fires early and re-arms
    deadline.push(later)
    await asyncio.sleep(STEP_S * 1.2)
    assert fired == []  # the first timer fired and found the deadline moved
    await asyncio.sleep(STEP_S * 2)
    assert len(fired) == 1
    assert fired[0] >= later - TIMER_SLACK_S


async def test_a_deadline_moved_earlier_fires_early() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    deadline = Deadline(loop)
    deadline.set(loop.time() + 60, lambda: fired.append("late"))
    deadline.set(loop.time() + STEP_S, lambda: fired.append("early"))
    await asyncio.sleep(STEP_S * 3)
    assert fired == ["early"]


async def test_cleared_and_cancelled_deadlines_call_nothing_and_hold_nothing(
    no_cycle_collector: None,
) -> None:
    loop = asyncio.get_running_loop()

    class Owner:
        def __init__(self) -> None:
            self.deadline = Deadline(loop)
            self.calls = 0

        def due(self) -> None:
            self.calls += 1

    cleared, cancelled = Owner(), Owner()
    cleared.deadline.set(loop.time() + STEP_S, cleared.due)
    cancelled.deadline.set(loop.time() + STEP_S, cancelled.due)
    cleared.deadline.clear()
    cleared.deadline.push(loop.time() + STEP_S / 2)  # bytes after the exchange ended: nothing is due
    assert cleared.deadline.deadline is None
    cancelled.deadline.cancel()
    await asyncio.sleep(STEP_S * 3)
    assert (cleared.calls, cancelled.calls) == (0, 0)
    gone = weakref.ref(cancelled)
    del cancelled  # freed by reference counting alone (no_cycle_collector): the deadline let go of owner.due
    assert gone() is None


class Server:
    """A loopback server that accepts and never answers."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Target:
        async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return parse_absolute_uri(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/")

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.close()
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


class Sink:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def on_head(self, head: object) -> None: ...
    def on_body(self, data: bytes) -> None: ...
    def on_feed_end(self) -> None: ...
    def on_complete(self) -> None: ...

    def on_fail(self, error: ProxyError) -> None:
        self.failed.append(error.reason)


async def test_a_pooled_upstream_connection_is_closed_after_the_idle_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream, "POOL_IDLE_S", STEP_S)
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=5, read_timeout_s=30)
    async with Server() as target:
        conn = await pool.connect(target)
        conn.reusable = True  # as after a keep-alive response
        pool.release(conn)
        assert pool.take_idle(target) is conn  # taken: no expiry while in use
        pool.release(conn)
        await asyncio.sleep(STEP_S * 4)
        assert pool.take_idle(target) is None
        assert conn.transport is not None
        assert conn.transport.is_closing()


async def test_the_read_timeout_of_a_reused_connection_is_not_the_pools_later_expiry() -> None:
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=5, read_timeout_s=STEP_S)
    async with Server() as target:
        conn = await pool.connect(target)
        conn.reusable = True
        pool.release(conn)  # idle expiry armed 30 s out
        taken = pool.take_idle(target)
        assert taken is conn
        sink = Sink()
        conn.start(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"", sink, head_only=False)
        await asyncio.sleep(STEP_S * 4)  # the server never answers
        assert sink.failed == ["upstream-timeout"]


async def test_a_connection_paused_for_a_slow_client_reads_again_once_pooled() -> None:
    # the last exchange's client stopped reading, so the upstream's reading was paused; pooled like
    # that, the next exchange on it would never see its answer (504 for an innocent client)
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=5, read_timeout_s=30)
    async with Server() as target:
        conn = await pool.connect(target)
        conn.reusable = True
        assert conn.transport is not None
        conn.pause_reading()  # the client's write buffer was full
        assert not conn.transport.is_reading()
        pool.release(conn)
        assert pool.take_idle(target) is conn
        assert conn.transport.is_reading()
        conn.close()


async def test_a_reused_connection_takes_the_pools_timeouts_after_a_reload() -> None:
    """A reload sets the pool's read timeout and head limit; a kept-alive connection taken from the
    idle pool serves with them too (renewed by each use, it could otherwise keep the old ones)."""
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=5, read_timeout_s=30, max_head_bytes=65536)
    async with Server() as target:
        conn = await pool.connect(target)
        conn.reusable = True
        pool.release(conn)
        pool.read_timeout_s, pool.max_head_bytes = 0.5, 4096  # what ProxyApp.reload does
        assert pool.take_idle(target) is conn
        assert (conn.read_timeout_s, conn.max_head_bytes) == (0.5, 4096)
        conn.close()
