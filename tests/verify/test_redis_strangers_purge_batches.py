"""A Lua script holds Redis for every client: the strangers' sets (quota counters, replay keys) were
purged of every expired member in one call, 0.6 s for a million (10 million: past the client
timeout, every request that needs the store 503 on every replica). Live members are counted with
ZCOUNT, and at most ``STRANGERS_PURGE_BATCH`` expired ones leave per call."""

from __future__ import annotations

import pytest

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify.redis_counters import (
    REPLAY_STRANGERS_KEY,
    STRANGERS_KEY,
    STRANGERS_PURGE_BATCH,
    RedisCounterStore,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

NOW = 1_700_000_000
EXPIRED = 3 * STRANGERS_PURGE_BATCH
LIVE = 5


async def fill(store: RedisCounterStore, key: str) -> None:
    """``EXPIRED`` members that expired a second ago and ``LIVE`` that expire in a minute."""
    await store.client.zadd(key, {f"sp:gw:old:{i}": (NOW - 1) * 1000 for i in range(EXPIRED)})
    await store.client.zadd(key, {f"sp:gw:live:{i}": (NOW + 60) * 1000 for i in range(LIVE)})


async def test_a_replay_key_counts_the_live_and_removes_a_batch_of_the_expired(
    redis_server: RedisServer,
) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()
        await store.first_seen("warm", 60, NOW - 120, 10)  # the epoch, and the script, in place
        await store.client.delete(REPLAY_STRANGERS_KEY)
        await fill(store, REPLAY_STRANGERS_KEY)
        assert await store.first_seen("new", 60, NOW, LIVE + 1)  # the expired are not in the bound
        left = await store.client.zcard(REPLAY_STRANGERS_KEY)
        assert left == EXPIRED - STRANGERS_PURGE_BATCH + LIVE + 1  # one batch gone, not all at once
        for i in range(2):  # the next calls take the next batches
            await store.first_seen(f"more{i}", 60, NOW, LIVE + 10)
        assert await store.client.zcard(REPLAY_STRANGERS_KEY) == LIVE + 3
    finally:
        await store.close()


async def test_a_quota_counter_counts_the_live_and_removes_a_batch_of_the_expired(
    redis_server: RedisServer,
) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()
        counter = QuotaCounter(key="chain-a", limit=10, window_s=60)
        await store.take_all([counter], NOW - 120, 10)
        await store.client.delete(STRANGERS_KEY)
        await fill(store, STRANGERS_KEY)
        _, taken = await store.take_all([QuotaCounter(key="chain-b", limit=10, window_s=60)], NOW, LIVE + 1)
        assert taken.allowed
        assert await store.client.zcard(STRANGERS_KEY) == EXPIRED - STRANGERS_PURGE_BATCH + LIVE + 1
    finally:
        await store.close()
