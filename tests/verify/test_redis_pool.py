"""The Redis store's connection pool waits for a free connection instead of refusing: more
concurrent operations than the pool holds all succeed against a healthy Redis, and a wait that
runs out is a ``RedisError`` (the gateway's 503), after the store's timeout, not at once."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import RedisError

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify.redis_counters import REDIS_MAX_CONNECTIONS, RedisCounterStore
from tests.harness import WAIT_S
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
NOW = 1_800_000_000.0
# more than our pool and more than redis-py's own default (100 connections since redis-py 6)
CONCURRENT = 3 * max(REDIS_MAX_CONNECTIONS, 100)


async def test_more_concurrent_operations_than_the_pool_all_succeed(redis_server: RedisServer) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()

        async def one(i: int) -> object:
            if i % 3 == 0:
                return await store.first_seen(f"sig-{i}", 60, NOW)
            if i % 3 == 1:
                return (await store.take_all((QuotaCounter(f"chain-{i}", 5, 60),), NOW))[1].allowed
            await store.ping()  # the readiness probe shares the pool
            return True

        results = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(CONCURRENT)), return_exceptions=True), WAIT_S
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed == [], f"{len(failed)} of {CONCURRENT} failed, first: {failed[0]!r}"
        assert all(r is True for r in results)
    finally:
        await store.close()


async def test_a_busy_pool_waits_for_a_connection(redis_server: RedisServer) -> None:
    store = RedisCounterStore.from_url(redis_server.url, max_connections=1)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(store.first_seen(f"one-{i}", 60, NOW) for i in range(20))), WAIT_S
        )
        assert results == [True] * 20  # one at a time on the one connection, none refused
    finally:
        await store.close()


async def test_a_wait_that_runs_out_is_a_store_error_then_the_store_recovers(
    redis_server: RedisServer,
) -> None:
    store = RedisCounterStore.from_url(redis_server.url, max_connections=1, timeout_s=0.2)
    try:
        await store.ping()  # the epoch adopted
        pool = store.client.connection_pool
        held = await pool.get_connection()  # type: ignore[no-untyped-call]  # the pool's one connection
        try:
            started = time.monotonic()
            with pytest.raises(RedisError):  # answered 503 replay-store-unavailable
                await asyncio.wait_for(store.first_seen("late", 60, NOW), WAIT_S)
            assert time.monotonic() - started >= 0.1  # it waited for a connection, then gave up
        finally:
            await pool.release(held)
        assert await asyncio.wait_for(store.first_seen("late", 60, NOW), WAIT_S)
    finally:
        await store.close()


async def test_a_waiter_cancelled_as_it_was_woken_passes_the_wake_up_on(redis_server: RedisServer) -> None:
    """On Python 3.11 a waiter cancelled in the loop turn it was notified took the notification
    with it: the released connection sat idle while the next waiter waited out its timeout (503)."""
    store = RedisCounterStore.from_url(redis_server.url, max_connections=1, timeout_s=WAIT_S)
    try:
        await store.ping()
        pool = store.client.connection_pool
        held = await pool.get_connection()  # type: ignore[no-untyped-call]  # the pool's one connection
        first = asyncio.create_task(store.ping())  # waits for it (a request, or the readiness probe)
        await asyncio.sleep(0.05)
        second = asyncio.create_task(store.ping())  # waits behind it
        await asyncio.sleep(0.05)
        await pool.release(held)  # notifies the first...
        first.cancel()  # ...whose client goes away in the same loop turn
        started = time.monotonic()
        await asyncio.wait_for(second, WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2  # woken by the release, not by its timeout
    finally:
        await store.close()
