"""The bound on strangers' counters: any https issuer may sign capped chains (``trusted_issuers_only``
is false by default), and each new chain is a counter row kept for its window (a ``quota_period``
up to 10,000 years, an ``exp`` up to the year 9999). The rows of chains whose authority issuer is not in
``trusted_issuers`` are at most ``max_stranger_quota_rows`` live ones: a take that would create one
more counts nothing and is refused 503 ``quota-store-full``; rows that exist keep counting, trusted
issuers' chains are never refused for it, and an expired row leaves the bound. The embedded SQLite
store and a real redis-server; the stores' clock is driven (``now``), never waited for."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.delegation import issue_authority
from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.core.jwk import SigningKey
from signing_proxy.proxy.gateway import GatewayPipeline
from signing_proxy.verify.counters import QUOTA_STORE_FULL, CounterStore, SqliteCounterStore, StrangerRowsFull
from signing_proxy.verify.gateway import GatewayPolicy
from signing_proxy.verify.issuers import IssuerAnchor
from signing_proxy.verify.redis_counters import STRANGERS_KEY, RedisCounterStore
from tests.redis_server import RedisServer
from tests.verify.conftest import Factory
from tests.verify.fakes import NOW as NOW_W  # the world fixture's clock
from tests.verify.test_gateway import OWNER, World, on_store, world  # noqa: F401 (the fixture)

NOW = 1_800_000_000.0
BOUND = 3


async def stranger(store: CounterStore, key: str, now: float, limit: int = 5, window_s: float = 60) -> int:
    """One access of a stranger's one-counter chain: the count after it (StrangerRowsFull raised)."""
    index, taken = await store.take_all((QuotaCounter(key, limit, window_s),), now, BOUND)
    assert (index, taken.allowed) == (0, True)
    return taken.count


async def test_a_new_strangers_row_past_the_bound_is_refused_and_counts_nothing(factory: Factory) -> None:
    store = factory()
    assert [await stranger(store, f"s{i}", NOW) for i in range(BOUND)] == [1] * BOUND
    with pytest.raises(StrangerRowsFull) as caught:
        await stranger(store, "fourth", NOW)
    assert caught.value.reason == QUOTA_STORE_FULL == "quota-store-full"
    # the chains that have their rows keep counting, bound or not: no count reset, none skipped
    assert await stranger(store, "s0", NOW + 1) == 2
    assert await stranger(store, "s0", NOW + 2) == 3
    # a trusted issuer's chain (no bound) is never refused for it, and is not in the bound
    assert (await store.take_all((QuotaCounter("trusted", 5, 60),), NOW + 3))[1].allowed
    with pytest.raises(StrangerRowsFull):
        await stranger(store, "fourth", NOW + 3)
    # the refused take counted nothing: as a trusted chain's first access, its count is 1
    assert (await store.take_all((QuotaCounter("fourth", 5, 60),), NOW + 3))[1].count == 1


async def test_expired_rows_leave_the_bound(factory: Factory) -> None:
    store = factory()
    for i in range(BOUND):
        await stranger(store, f"s{i}", NOW, window_s=60)
    with pytest.raises(StrangerRowsFull):
        await stranger(store, "late", NOW + 59.9)
    assert await stranger(store, "late", NOW + 60) == 1  # [NOW, NOW + 60): the first rows are gone
    for i in range(BOUND - 1):  # "late" holds one place, two new chains the others
        await stranger(store, f"t{i}", NOW + 61)
    with pytest.raises(StrangerRowsFull):
        await stranger(store, "one-too-many", NOW + 61)


async def test_a_take_creating_several_rows_fits_whole_or_counts_none(factory: Factory) -> None:
    store = factory()
    await stranger(store, "grant", NOW)
    child = (QuotaCounter("grant", 5, 60), QuotaCounter("child", 5, 60))
    assert (await store.take_all(child, NOW, BOUND))[1].allowed  # 2 rows of 3
    both_new = (QuotaCounter("a", 5, 60), QuotaCounter("b", 5, 60))
    with pytest.raises(StrangerRowsFull):  # 4 rows: refused, "a" not counted either
        await store.take_all(both_new, NOW, BOUND)
    assert await stranger(store, "a", NOW) == 1  # 3 rows of 3


async def test_a_lowered_bound_refuses_only_new_rows(factory: Factory) -> None:
    store = factory()
    for i in range(BOUND):
        await stranger(store, f"s{i}", NOW)
    _, taken = await store.take_all((QuotaCounter("s1", 5, 60),), NOW, 1)  # bound lowered to 1
    assert (taken.allowed, taken.count) == (True, 2)
    with pytest.raises(StrangerRowsFull):
        await store.take_all((QuotaCounter("new", 5, 60),), NOW, 1)


async def test_an_exhausted_counter_answers_its_quota_before_the_bound(factory: Factory) -> None:
    """A chain at its limit is refused by its own count (429), whatever the bound."""
    store = factory()
    for i in range(BOUND):
        await stranger(store, f"s{i}", NOW, limit=1)
    index, taken = await store.take_all((QuotaCounter("s0", 1, 60), QuotaCounter("new", 5, 60)), NOW, BOUND)
    assert (index, taken.allowed, taken.count) == (0, False, 1)


async def test_racing_clients_never_overshoot_the_bound(factory: Factory) -> None:
    """Four clients (connections: workers, replicas) race 24 new strangers' chains: exactly 3 kept."""
    stores = [factory() for _ in range(4)]

    async def attempt(i: int) -> bool:
        try:
            await stranger(stores[i % 4], f"race{i}", NOW)
        except StrangerRowsFull:
            return False
        return True

    assert sum(await asyncio.gather(*(attempt(i) for i in range(24)))) == BOUND


async def test_sqlite_counts_strangers_rows_across_a_prune_and_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = SqliteCounterStore(path)
    try:
        for i in range(BOUND):
            await stranger(store, f"s{i}", NOW, window_s=10)
        # a trusted chain's first access on an expired stranger's row takes it out of the bound
        assert (await store.take_all((QuotaCounter("s0", 5, 60),), NOW + 10))[1].allowed
        for i in range(300):  # past PRUNE_EVERY writes: the prune deletes the other two expired rows
            await store.take_all((QuotaCounter(f"t{i}", 5, 1),), NOW + 11 + i)
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT n FROM tally").fetchone() == (0,)
    store = SqliteCounterStore(path)
    try:
        assert [await stranger(store, f"n{i}", NOW + 400) for i in range(BOUND)] == [1] * BOUND
        with pytest.raises(StrangerRowsFull):
            await stranger(store, "past", NOW + 400)
    finally:
        await store.close()


async def test_sqlite_file_of_an_earlier_version_is_upgraded(tmp_path: Path) -> None:
    """A file without the ``stranger`` column: its rows keep counting (as trusted ones)."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE counters (key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at REAL)")
        db.execute("CREATE TABLE seen (key TEXT PRIMARY KEY, expires_at REAL NOT NULL)")
        db.execute("INSERT INTO counters VALUES ('old', 4, ?)", (NOW + 60,))
    db.close()
    store = SqliteCounterStore(path)
    try:
        assert await stranger(store, "old", NOW) == 5
        assert [await stranger(store, f"s{i}", NOW) for i in range(BOUND)] == [1] * BOUND
        with pytest.raises(StrangerRowsFull):
            await stranger(store, "past", NOW)
    finally:
        await store.close()


@pytest.mark.integration
async def test_redis_keeps_strangers_keys_in_one_scored_set(redis_server: RedisServer) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()
        await stranger(store, "s", NOW, window_s=60)
        await store.take_all((QuotaCounter("trusted", 5, 60),), NOW)
        members = await store.client.zrange(STRANGERS_KEY, 0, -1, withscores=True)
        assert members == [(b"sp:gw:q:s", (NOW + 60) * 1000)]
    finally:
        await store.close()


# --- the gateway: 503 quota-store-full with Retry-After, trusted issuers exempt ---

TRUSTED = "https://trusted.example"


def capped(w: World, n: int, owner: SigningKey | None = None, iss: str = OWNER) -> bytes:
    """A body whose chain is one authority JWT capping 5 accesses a minute: one counter, its own."""
    chain = issue_authority(
        owner or w.owner,
        iss=iss,
        holder_jkt=w.agent.thumbprint,
        now=NOW_W,
        exp=NOW_W + 3600 + n,  # a new chain each n
        max_accesses=5,
        quota_period_s=60,
    )
    return w.body(chain, expires_at=NOW_W + 1800)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
async def gateway_world(
    request: pytest.FixtureRequest,
    world: World,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[World]:
    world.gateway.policy = GatewayPolicy(max_stranger_quota_rows=BOUND)  # no replay check: a chain reused
    async with on_store(world, request.param, tmp_path) as on:
        yield on


async def test_the_gateway_refuses_a_strangers_new_chain_past_the_bound(gateway_world: World) -> None:
    w = gateway_world
    assert [(await w.check(capped(w, n))).remaining_accesses for n in range(BOUND)] == [4] * BOUND
    refusal = await w.refused(capped(w, BOUND))
    assert (refusal.status, refusal.reason) == (503, "quota-store-full")
    assert refusal.headers == (("Retry-After", "60"),)
    w.clock.now += 1  # a chain that has its counter keeps counting
    assert (await w.check(capped(w, 0))).remaining_accesses == 3
    # an issuer in trusted_issuers: its new chains are not in the bound
    issuer = SigningKey.generate()
    w.gateway.issuers.trusted = {TRUSTED: IssuerAnchor(keys=(issuer.public,))}
    trusted = await w.check(capped(w, 9, issuer, TRUSTED))
    assert trusted.remaining_accesses == 4
    refusal = await w.refused(capped(w, BOUND))  # strangers still at the bound
    assert refusal.reason == "quota-store-full"
    w.clock.now += 60  # the strangers' windows ended: their rows left the bound
    assert (await w.check(capped(w, BOUND))).remaining_accesses == 4


def test_the_bound_is_a_setting_from_zero() -> None:
    base = {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000"}}
    assert parse_config(base).gateway.max_stranger_quota_rows == 100_000
    assert GatewayPolicy().max_stranger_quota_rows == 100_000
    zero = {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000", "max_stranger_quota_rows": 0}}
    assert parse_config(zero).gateway.max_stranger_quota_rows == 0
    for value in (-1, 10**8, True):
        bad = {
            "mode": "gateway",
            "gateway": {"upstream": "http://127.0.0.1:9000", "max_stranger_quota_rows": value},
        }
        with pytest.raises(ConfigError, match=r"^gateway\.max_stranger_quota_rows: "):
            parse_config(bad)


async def test_the_gateway_mode_passes_the_setting_on(tmp_path: Path) -> None:
    raw = {
        "mode": "gateway",
        "data_dir": str(tmp_path),
        "gateway": {"upstream": "http://127.0.0.1:9000", "max_stranger_quota_rows": 7},
    }
    pipeline = GatewayPipeline(parse_config(raw))
    try:
        assert pipeline.verifier.policy.max_stranger_quota_rows == 7
    finally:
        await pipeline.close()
