"""Counter stores: the quota window, refusal at count >= limit without counting, replay keys, and
atomicity under concurrent clients — the embedded SQLite store and a real redis-server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify.counters import CounterStore, SqliteCounterStore, Taken
from signing_proxy.verify.redis_counters import RedisCounterStore
from signing_proxy.verify.stores import open_counter_store
from tests.redis_server import RedisServer
from tests.verify.conftest import Factory

NOW = 1_800_000_000.0


async def take(store: CounterStore, key: str, limit: int, window_s: float | None, now: float) -> Taken:
    """One counter, through ``take_all`` (the stores' one way to count)."""
    return (await store.take_all((QuotaCounter(key, limit, window_s),), now))[1]


async def test_take_counts_up_to_the_limit_then_refuses_without_counting(factory: Factory) -> None:
    store = factory()
    results = [await take(store, "chain", 3, 60, NOW) for _ in range(5)]
    assert [r.allowed for r in results] == [True, True, True, False, False]
    assert [r.count for r in results] == [1, 2, 3, 3, 3]  # a refusal is not an access
    assert results[-1].reset_at is not None
    assert NOW + 59 <= results[-1].reset_at <= NOW + 60


async def test_take_all_counts_every_counter_or_none(factory: Factory) -> None:
    # a chain's capped links: each counted on an admitted access; a refusal by one counts none
    store = factory()
    both = (QuotaCounter("grant", 2, 60), QuotaCounter("child", 1, 60))
    index, taken = await store.take_all(both, NOW)
    assert (index, taken.allowed, taken.count) == (1, True, 1)  # the child has the fewest left
    index, taken = await store.take_all(both, NOW)
    assert (index, taken.allowed, taken.count) == (1, False, 1)  # refused by the child ...
    assert (await take(store, "grant", 2, 60, NOW)).count == 2  # ... without counting the grant
    index, taken = await store.take_all((QuotaCounter("grant", 2, 60), QuotaCounter("other", 5, 60)), NOW)
    assert (index, taken.allowed, taken.count) == (0, False, 2)
    assert (await take(store, "other", 5, 60, NOW)).count == 1


@pytest.mark.parametrize("tight", [0, 1, 2])
async def test_take_all_refusal_names_the_exhausted_counter_and_charges_none(
    factory: Factory, tight: int
) -> None:
    """A refusal names the index of the counter at its limit, wherever it is, and counts no counter."""
    store = factory()
    assert (await take(store, "tight", 1, 60, NOW)).allowed
    keys = ["a", "b"]
    keys.insert(tight, "tight")
    index, taken = await store.take_all([QuotaCounter(k, 1 if k == "tight" else 5, 60) for k in keys], NOW)
    assert (index, taken.allowed, taken.count) == (tight, False, 1)
    assert (await take(store, "a", 5, 60, NOW)).count == 1  # the first access to each: none was charged
    assert (await take(store, "b", 5, 60, NOW)).count == 1
    assert (await take(store, "tight", 1, 60, NOW)).count == 1


async def _after(store: CounterStore, start: float, seconds: float) -> float:
    """The time ``seconds`` after ``start``: SQLite is told it; Redis expires keys by its own clock."""
    if isinstance(store, RedisCounterStore):
        await asyncio.sleep(seconds)
        return time.time()
    return start + seconds


async def test_take_all_counters_keep_their_own_windows(factory: Factory) -> None:
    """Counters taken together each expire on their own window: the short one reopens, the long one not."""
    store = factory()
    short, long = QuotaCounter("short", 1, 1.0), QuotaCounter("long", 1, 60)
    start = time.time()
    assert (await store.take_all((short, long), start))[1].allowed
    index, by_short = await store.take_all((short, long), start)
    assert (index, by_short.allowed) == (0, False)
    assert by_short.reset_at is not None
    assert start < by_short.reset_at <= start + 1.0
    index, by_long = await store.take_all((long, short), start)
    assert (index, by_long.allowed) == (0, False)
    assert by_long.reset_at is not None
    assert start + 59 <= by_long.reset_at <= start + 60
    later = await _after(store, start, 1.1)  # past the short window only
    reopened = await take(store, "short", 1, 1.0, later)
    assert (reopened.allowed, reopened.count) == (True, 1)
    assert not (await take(store, "long", 1, 60, later)).allowed


async def test_keys_are_counted_apart(factory: Factory) -> None:
    store = factory()
    assert (await take(store, "a", 1, 60, NOW)).allowed
    assert (await take(store, "b", 1, 60, NOW)).allowed
    assert not (await take(store, "a", 1, 60, NOW)).allowed


async def test_sqlite_window_opens_again_at_its_end(tmp_path: Path) -> None:
    store = SqliteCounterStore(tmp_path / "c.sqlite3")
    try:
        assert (await take(store, "k", 1, 10, NOW)).allowed
        assert not (await take(store, "k", 1, 10, NOW + 9.99)).allowed
        again = await take(store, "k", 1, 10, NOW + 10)  # the window is [NOW, NOW + 10)
        assert again.allowed
        assert again.count == 1
        assert again.reset_at == NOW + 20
        lifetime = [await take(store, "life", 2, None, NOW + t) for t in (0, 1e6, 2e6)]
        assert [r.allowed for r in lifetime] == [True, True, False]
        assert lifetime[-1].reset_at is None
    finally:
        await store.close()


async def test_first_seen_once_within_its_ttl(factory: Factory) -> None:
    store = factory()
    assert await store.first_seen("sig", 30, NOW)
    assert not await store.first_seen("sig", 30, NOW + 1)
    assert await store.first_seen("other", 30, NOW)


async def test_sqlite_seen_key_expires(tmp_path: Path) -> None:
    store = SqliteCounterStore(tmp_path / "c.sqlite3")
    try:
        assert await store.first_seen("sig", 5, NOW)
        assert not await store.first_seen("sig", 5, NOW + 4.9)
        assert await store.first_seen("sig", 5, NOW + 5)
    finally:
        await store.close()


async def test_concurrent_clients_never_exceed_the_limit(factory: Factory) -> None:
    """Four clients (connections) race 40 takes against a limit of 7: exactly 7 are admitted."""
    stores = [factory() for _ in range(4)]
    results = await asyncio.gather(*(take(stores[i % 4], "race", 7, 60, NOW) for i in range(40)))
    assert sum(r.allowed for r in results) == 7
    assert sorted(r.count for r in results if r.allowed) == list(range(1, 8))
    seen = await asyncio.gather(*(stores[i % 4].first_seen("replayed", 60, NOW) for i in range(12)))
    assert sum(seen) == 1


@pytest.mark.integration
async def test_redis_keys_expire_with_their_window(redis_server: RedisServer) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()
        taken = await take(store, "w", 1, 0.2, NOW)
        assert taken.allowed
        ttl = await store.client.pttl("sp:gw:q:w")
        assert 0 < ttl <= 200
        assert await store.first_seen("s", 30, NOW)
        assert 0 < await store.client.pttl("sp:gw:r:s") <= 30_000
        lifetime = await take(store, "life", 1, None, NOW)
        assert lifetime.allowed
        assert lifetime.reset_at is None
        assert await store.client.pttl("sp:gw:q:life") == -1
    finally:
        await store.close()


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_counter_store("sqlite", tmp_path), SqliteCounterStore)
    chosen = open_counter_store("sqlite://" + str(tmp_path / "x.db"), tmp_path)
    assert isinstance(chosen, SqliteCounterStore)
    assert chosen.path == tmp_path / "x.db"
    assert isinstance(open_counter_store("redis://127.0.0.1:1/0", tmp_path), RedisCounterStore)
    with pytest.raises(ValueError, match="memcached"):
        open_counter_store("memcached://x", tmp_path)
