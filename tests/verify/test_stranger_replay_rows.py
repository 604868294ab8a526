"""The bound on strangers' replay rows: with replay protection every accepted signature is a row
kept for its validity (up to ``verify.max_validity_s``), and anyone with a self-published key
directory can sign fresh ones at full rate. The rows of requests no trusted issuer vouches for are
at most ``max_stranger_replay_rows`` live ones: a new one past it is not recorded and the request is
refused 503 ``replay-store-full``; a signature seen before is still a replay; a request carrying a
chain of a ``trusted_issuers`` issuer (or signed with a pinned agent key) is never refused for it;
an expired row leaves the bound. The embedded SQLite store and a real redis-server; the stores'
clock is driven (``now``), never waited for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.errors import Error
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify.counters import SqliteCounterStore
from signing_proxy.verify.gateway import GatewayPolicy
from signing_proxy.verify.issuers import IssuerAnchor
from signing_proxy.verify.redis_counters import RedisCounterStore
from signing_proxy.verify.verifier import VerifierPolicy
from tests.redis_server import RedisServer
from tests.verify.conftest import Factory
from tests.verify.strangers import signed
from tests.verify.test_gateway import OWNER, World, on_store, world  # noqa: F401 (the fixture)

NOW = 1_800_000_000.0
BOUND = 3
FULL = "replay-store-full"  # the stable reasons and key names, pinned as operators see them
REPLAY_STRANGERS_KEY = "sp:gw:replay-strangers"


@contextlib.contextmanager
def refused_full() -> Iterator[None]:
    """The store's refusal of a stranger's new row (``ReplayRowsFull``): reason replay-store-full."""
    with pytest.raises(Error) as caught:
        yield
    assert (type(caught.value).__name__, caught.value.reason) == ("ReplayRowsFull", FULL)


async def test_a_strangers_new_row_past_the_bound_is_refused_and_recorded_nowhere(factory: Factory) -> None:
    store = factory()
    assert [await store.first_seen(f"s{i}", 60, NOW, BOUND) for i in range(BOUND)] == [True] * BOUND
    with refused_full():
        await store.first_seen("fourth", 60, NOW, BOUND)
    # a signature seen before is a replay, bound or not (never "full": it records nothing)
    assert not await store.first_seen("s0", 60, NOW + 1, BOUND)
    # a trusted request (no bound) is never refused for it, and is not in the bound
    assert await store.first_seen("trusted", 60, NOW + 1)
    with refused_full():
        await store.first_seen("fourth", 60, NOW + 1, BOUND)
    # the refused one was not recorded: as a trusted request's, it is new
    assert await store.first_seen("fourth", 60, NOW + 1)


async def test_expired_replay_rows_leave_the_bound(factory: Factory) -> None:
    store = factory()
    for i in range(BOUND):
        assert await store.first_seen(f"s{i}", 60, NOW, BOUND)
    with refused_full():
        await store.first_seen("late", 60, NOW + 59.9, BOUND)
    assert await store.first_seen("late", 60, NOW + 60, BOUND)  # [NOW, NOW + 60): the first rows are gone
    for i in range(BOUND - 1):
        assert await store.first_seen(f"t{i}", 60, NOW + 61, BOUND)
    with refused_full():
        await store.first_seen("one-too-many", 60, NOW + 61, BOUND)


async def test_a_zero_bound_records_no_strangers_row(factory: Factory) -> None:
    store = factory()
    with refused_full():
        await store.first_seen("s", 60, NOW, 0)
    assert await store.first_seen("s", 60, NOW)  # trusted: recorded


async def test_racing_clients_never_overshoot_the_replay_bound(factory: Factory) -> None:
    """Four clients (connections: workers, replicas) race 24 new strangers' signatures: exactly 3 kept."""
    stores = [factory() for _ in range(4)]

    async def attempt(i: int) -> str:
        try:
            return "kept" if await stores[i % 4].first_seen(f"race{i}", 60, NOW, BOUND) else "seen"
        except Error as exc:
            return exc.reason

    outcomes = await asyncio.gather(*(attempt(i) for i in range(24)))
    assert sorted(outcomes) == ["kept"] * BOUND + [FULL] * (24 - BOUND)


async def test_sqlite_counts_strangers_replay_rows_across_a_prune_and_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = SqliteCounterStore(path)
    try:
        for i in range(BOUND):
            await store.first_seen(f"s{i}", 10, NOW, BOUND)
        assert await store.first_seen("s0", 60, NOW + 10)  # a trusted request takes an expired row over
        for i in range(300):  # past PRUNE_EVERY writes: the prune deletes the other two expired rows
            await store.first_seen(f"t{i}", 1, NOW + 11 + i)
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT n FROM tally WHERE name = 'stranger_seen'").fetchone() == (0,)
    db.close()
    store = SqliteCounterStore(path)
    try:
        assert [await store.first_seen(f"n{i}", 60, NOW + 400, BOUND) for i in range(BOUND)] == [True] * BOUND
        with refused_full():
            await store.first_seen("past", 60, NOW + 400, BOUND)
    finally:
        await store.close()


async def test_sqlite_file_of_an_earlier_version_gets_the_replay_bound(tmp_path: Path) -> None:
    """A file whose ``seen`` has no ``stranger`` column: its rows keep answering (as trusted ones)."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE counters (key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at REAL)")
        db.execute("CREATE TABLE seen (key TEXT PRIMARY KEY, expires_at REAL NOT NULL)")
        db.execute("INSERT INTO seen VALUES ('old', ?)", (NOW + 60,))
    db.close()
    store = SqliteCounterStore(path)
    try:
        assert not await store.first_seen("old", 60, NOW, BOUND)
        assert [await store.first_seen(f"s{i}", 60, NOW, BOUND) for i in range(BOUND)] == [True] * BOUND
        with refused_full():
            await store.first_seen("past", 60, NOW, BOUND)
    finally:
        await store.close()


@pytest.mark.integration
async def test_redis_keeps_strangers_replay_keys_in_one_scored_set(redis_server: RedisServer) -> None:
    store = RedisCounterStore.from_url(redis_server.url)
    try:
        await store.client.flushdb()
        assert await store.first_seen("s", 60, NOW, BOUND)
        assert await store.first_seen("trusted", 60, NOW)
        members = await store.client.zrange(REPLAY_STRANGERS_KEY, 0, -1, withscores=True)
        assert members == [(b"sp:gw:r:s", (NOW + 60) * 1000)]
        assert 0 < await store.client.pttl("sp:gw:r:s") <= 60_000
    finally:
        await store.close()


# --- the gateway: 503 replay-store-full with Retry-After, trusted issuers and pinned keys exempt ---


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
async def replay_world(
    request: pytest.FixtureRequest,
    world: World,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[World]:
    world.gateway.policy = GatewayPolicy(replay_protection=True, max_stranger_replay_rows=BOUND)
    async with on_store(world, request.param, tmp_path) as on:
        yield on


async def test_the_gateway_refuses_a_strangers_new_signature_past_the_bound(replay_world: World) -> None:
    w = replay_world
    first = w.body()
    await w.check(first)  # the agent signs at NOW: one row
    for _ in range(BOUND - 1):
        w.clock.now += 1  # another created: another signature, another row
        await w.check(w.body())
    w.clock.now += 1
    refusal = await w.refused(w.body())
    assert (refusal.status, refusal.reason) == (503, "replay-store-full")
    assert refusal.headers == (("Retry-After", "60"),)
    # a chain whose authority issuer is in trusted_issuers: recorded beyond the bound, and replayed is 401
    w.gateway.issuers.trusted = {OWNER: IssuerAnchor(keys=(w.owner.public,))}
    trusted = w.body(w.chain())
    await w.check(trusted)
    refusal = await w.refused(trusted)  # the same second: the same signature
    assert (refusal.status, refusal.reason) == (401, "signature-replayed")
    w.gateway.issuers.trusted = {}
    assert (await w.refused(w.body())).reason == "replay-store-full"  # strangers still at the bound
    w.clock.now += 60  # the first signatures' validity (60 s) and skew (5 s) are over: rows left
    w.clock.now += 5
    await w.check(w.body())


async def test_a_pinned_agent_key_is_not_in_the_bound(replay_world: World) -> None:
    w = replay_world
    for _ in range(BOUND):
        w.clock.now += 1
        await w.check(w.body())
    pinned = SigningKey.generate()
    w.gateway.verifier.policy = VerifierPolicy(pinned_agent_keys=(pinned.public,))
    body = b'{"plain": true}'
    url = "https://exchange.example/feed"
    fields = signed("", pinned, now=int(w.clock.now), url=url, body=body)  # empty Signature-Agent
    verdict = await w.gateway.check("POST", url, fields, body)
    assert verdict.stack.agent.key_source == "pinned"
    w.clock.now += 1
    assert (await w.refused(w.body())).reason == "replay-store-full"


async def test_replay_store_full_is_logged_once_a_minute(
    world: World,  # noqa: F811 (the fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    world.gateway.policy = GatewayPolicy(replay_protection=True, max_stranger_replay_rows=0)
    caplog.set_level(logging.WARNING, logger="signing_proxy.gateway")
    for _ in range(10):
        world.clock.now += 1
        assert (await world.refused(world.body())).reason == "replay-store-full"
    lines = [r.getMessage() for r in caplog.records if "replay-store-full" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "gateway.max_stranger_replay_rows" in lines[0]
    world.clock.now += 60
    await world.refused(world.body())
    assert len([r for r in caplog.records if "replay-store-full" in r.getMessage()]) == 2


def test_the_replay_bound_is_a_setting_from_zero() -> None:
    base = {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000"}}
    assert parse_config(base).gateway.max_stranger_replay_rows == 1_000_000
    assert GatewayPolicy().max_stranger_replay_rows == 1_000_000
    zero = {
        "mode": "gateway",
        "gateway": {"upstream": "http://127.0.0.1:9000", "max_stranger_replay_rows": 0},
    }
    assert parse_config(zero).gateway.max_stranger_replay_rows == 0
    for value in (-1, 10**7 + 1, True):
        bad = {
            "mode": "gateway",
            "gateway": {"upstream": "http://127.0.0.1:9000", "max_stranger_replay_rows": value},
        }
        with pytest.raises(ConfigError, match=r"^gateway\.max_stranger_replay_rows: "):
            parse_config(bad)
