"""Fixtures of the counter-store tests: a real redis-server per module, and a factory of stores
(``counter_stores``: the embedded SQLite store, then Redis), each closed at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from signing_proxy.verify.counters import CounterStore, SqliteCounterStore
from signing_proxy.verify.redis_counters import RedisCounterStore
from tests.redis_server import RedisServer

Factory = Callable[[], CounterStore]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
async def factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """Makes stores over one state: one SQLite file, or one Redis database flushed first."""
    made: list[CounterStore] = []
    if request.param == "sqlite":

        def make() -> CounterStore:
            made.append(SqliteCounterStore(tmp_path / "counters.sqlite3"))
            return made[-1]
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        first = RedisCounterStore.from_url(server.url)
        await first.client.flushdb()

        def make() -> CounterStore:
            made.append(RedisCounterStore.from_url(server.url) if made else first)
            return made[-1]

    yield make
    for store in made:
        await store.close()
