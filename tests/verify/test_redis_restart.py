"""Redis losing its data (a restart without persistence, a FLUSHALL) fails closed: no count starts
again from zero and no replay is admitted until an operator accepts the loss; a fresh empty Redis
needs no manual step, and the shipped Redis persists every write (AOF, fsync always)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.exceptions import ConnectionError as RedisConnectionError

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify.redis_counters import EPOCH_KEY, CounterStateLost, RedisCounterStore
from tests.harness import WAIT_S, stop_process
from tests.redis_server import RedisServer, _ping

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
CAP = (QuotaCounter("chain-A", 2, None),)  # a lifetime quota: no window would ever reset it
SIG = "sig-1"


def restart(server: RedisServer, *extra: str) -> None:
    """Stop ``server`` and start an empty one (or, with persistence in ``extra``, the same data)
    on the same port, so the stores' connection pools reconnect to it."""
    assert server.proc is not None
    stop_process(server.proc)
    binary = shutil.which("redis-server")
    assert binary is not None
    args = ["--port", str(server.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(server.tmp)]
    server.proc = subprocess.Popen(
        [binary, *args, *(extra or ("--appendonly", "no"))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + WAIT_S
    while not _ping(server.port):
        assert server.proc.poll() is None, "redis-server did not restart"
        assert time.monotonic() < deadline, "redis-server did not answer"
        time.sleep(0.02)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as running:
        yield running


async def outcome(step: Awaitable[Any]) -> object:
    """What a step came to: its answer, or the name of the store error it raised."""
    try:
        return await step
    except (CounterStateLost, RedisConnectionError) as exc:
        return type(exc).__name__


async def admitted(store: RedisCounterStore) -> object:
    taken = await outcome(store.take_all(CAP, NOW))
    return taken[1].allowed if isinstance(taken, tuple) else taken


async def stored_epoch(store: RedisCounterStore) -> bytes:
    value = await store.client.get(EPOCH_KEY)
    assert isinstance(value, bytes)
    return value


async def test_a_fresh_empty_redis_needs_no_manual_step(server: RedisServer) -> None:
    replicas = [RedisCounterStore.from_url(server.url) for _ in range(2)]
    try:
        assert [await admitted(replicas[i % 2]) for i in range(3)] == [True, True, False]
        assert await replicas[0].first_seen(SIG, 60, NOW)
        assert not await replicas[1].first_seen(SIG, 60, NOW)
        epoch = await stored_epoch(replicas[0])
        assert epoch.startswith(b"gw:")
        assert replicas[0].epoch == replicas[1].epoch == epoch
        assert await replicas[0].client.pttl(EPOCH_KEY) == -1  # the sentinel never expires
    finally:
        for store in replicas:
            await store.close()


async def test_a_restart_without_data_refuses_counts_and_replays(server: RedisServer) -> None:
    store = RedisCounterStore.from_url(server.url)
    try:
        assert [await admitted(store) for _ in range(3)] == [True, True, False]
        assert await store.first_seen(SIG, 60, NOW)
        restart(server)  # empty, as a Redis without persistence comes back
        after = [await admitted(store) for _ in range(4)]
        assert True not in after, after  # the spent cap of 2 is never admitted again
        assert after[-1] == "CounterStateLost"
        assert await outcome(store.first_seen(SIG, 60, NOW)) == "CounterStateLost"  # no replay
        later = RedisCounterStore.from_url(server.url)  # a replica started after the loss
        try:
            assert await admitted(later) == "CounterStateLost"
            assert await outcome(later.first_seen(SIG, 60, NOW)) == "CounterStateLost"
        finally:
            await later.close()
    finally:
        await store.close()


async def test_a_flush_refuses_even_after_a_new_replica_recreated_the_epoch(server: RedisServer) -> None:
    old = RedisCounterStore.from_url(server.url)
    new = RedisCounterStore.from_url(server.url)
    try:
        assert [await admitted(old) for _ in range(3)] == [True, True, False]
        assert await old.first_seen(SIG, 60, NOW)
        await old.client.flushall()
        # the documented gap: a replica whose first use follows the loss cannot tell it from a
        # fresh Redis, and admits until a replica that saw the old epoch writes the tombstone
        assert await admitted(new) is True
        assert await admitted(old) == "CounterStateLost"
        assert (await stored_epoch(old)).startswith(b"lost:")
        assert await admitted(new) == "CounterStateLost"
        assert await outcome(new.first_seen(SIG, 60, NOW)) == "CounterStateLost"
        assert await outcome(old.first_seen(SIG, 60, NOW)) == "CounterStateLost"
        # an operator accepts the loss; every store adopts the new epoch and counts on from what
        # Redis holds now (the one admission in the gap)
        await old.client.set(EPOCH_KEY, b"ack-1")
        assert await admitted(old) is True
        assert await admitted(new) is False
        assert old.epoch == new.epoch == b"ack-1"
        assert await new.first_seen(SIG, 60, NOW)
    finally:
        await old.close()
        await new.close()


def test_the_shipped_redis_persists_every_write() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "gateway.yaml").read_text()) if d]
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "signing-proxy-redis"
    )
    pod = deployment["spec"]["template"]["spec"]
    redis = pod["containers"][0]
    options = dict(zip(redis["args"][::2], redis["args"][1::2], strict=True))
    # the AOF directory is a mounted PersistentVolumeClaim, not the container's own layer
    mount = next(m for m in redis["volumeMounts"] if m["mountPath"] == options["--dir"])
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert volume["persistentVolumeClaim"]["claimName"] in claims
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "always"
    assert options["--maxmemory-policy"] == "noeviction"  # the sentinel and counts are never evicted


async def test_a_restart_with_the_shipped_persistence_keeps_counts_and_replays(server: RedisServer) -> None:
    restart(server, "--appendonly", "yes", "--appendfsync", "always")
    store = RedisCounterStore.from_url(server.url)
    try:
        assert [await admitted(store) for _ in range(3)] == [True, True, False]
        assert await store.first_seen(SIG, 60, NOW)
        restart(server, "--appendonly", "yes", "--appendfsync", "always")
        after = [await admitted(store) for _ in range(3)]
        assert True not in after, after
        assert after[-1] is False
        assert await outcome(store.first_seen(SIG, 60, NOW)) is False  # still a replay
    finally:
        await store.close()


async def test_a_loss_the_probe_sees_first_is_refused_by_a_replica_started_after_it(
    server: RedisServer,
) -> None:
    """The probe read the epoch and raised, but wrote nothing: a replica started after the loss
    created a fresh epoch and admitted from zero until some older replica's next count."""
    store = RedisCounterStore.from_url(server.url)
    try:
        assert await admitted(store) is True
        restart(server)
        first = await outcome(store.ping())  # the pool's old connection may fail first
        assert first in ("ConnectionError", "CounterStateLost")
        if first == "ConnectionError":
            assert await outcome(store.ping()) == "CounterStateLost"
        later = RedisCounterStore.from_url(server.url)
        try:
            assert await admitted(later) == "CounterStateLost"
        finally:
            await later.close()
    finally:
        await store.close()


async def test_readiness_sees_a_loss_the_store_has_seen(server: RedisServer) -> None:
    """/readyz probes with the store's ping(): PING alone answered while every count was refused."""
    store = RedisCounterStore.from_url(server.url)
    try:
        await store.ping()  # fresh: nothing adopted yet
        assert await admitted(store) is True
        await store.ping()
        restart(server)
        first = await outcome(store.ping())  # the pool's old connection may fail first
        assert first in ("ConnectionError", "CounterStateLost")
        assert await outcome(store.ping()) == "CounterStateLost"
        assert await admitted(store) == "CounterStateLost"  # the tombstone written
        later = RedisCounterStore.from_url(server.url)
        try:
            assert await outcome(later.ping()) == "CounterStateLost"
        finally:
            await later.close()
        await store.client.set(EPOCH_KEY, b"ack-1")  # an operator accepts the loss
        await store.ping()
        assert await admitted(store) is True
    finally:
        await store.close()
