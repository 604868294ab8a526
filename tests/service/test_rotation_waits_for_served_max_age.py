"""`keys rotate` waits for the max-age the publication listener served, not for the max-age of the
configuration it reads. ``publish`` is restart-only: after an edit lowering
``publish.directory_max_age_s`` and a SIGHUP the listener still serves the old max-age, and a copy
fetched before a restart with a lower one is held for the old value. A new key activating after the
lower max-age was refused by every verifier holding such a copy ("rotation must never cause a
refusal"). The listener records what it served in the agent's store folder (``served.json``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import stat
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from signing_proxy.config import parse_config
from signing_proxy.core.rotation import ROTATION_MARGIN_S
from signing_proxy.service.publish import PublishServer
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider, StoreWatcher
from tests.harness import WAIT_S, run_cli, until

DIRECTORY = "/.well-known/http-message-signatures-directory"
SERVED_MAX_AGE_S = 21_600
LOWER_MAX_AGE_S = 600
LIFETIME_S = 90 * 86_400


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def raw_config(data: Path, max_age_s: int, agents: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "data_dir": str(data),
        "publish": {
            "listen": "127.0.0.1:0",
            "domain": "agent.example",
            "directory_max_age_s": max_age_s,
            "agents": list(agents),
        },
    }


def config_file(tmp_path: Path, name: str, max_age_s: int, agents: tuple[str, ...] = ()) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw_config(tmp_path / "data", max_age_s, agents)))
    return str(path)


def listener(
    data: Path, max_age_s: int, clock: Any = time.time, agents: tuple[str, ...] = (), **kwargs: Any
) -> PublishServer:
    config = parse_config(raw_config(data, max_age_s, agents))
    watchers: dict[str, StoreWatcher] = {
        config.signing.agent: StoreKeyProvider(KeyStore(config.data_path, config.signing.agent))
    }
    for agent in config.publish.agents:
        watchers[agent] = StoreWatcher(KeyStore(config.data_path, agent), private=False)
    return PublishServer(config, watchers, clock=clock, **kwargs)


def new_key_activation(data: Path, agent: str = "default") -> int:
    records = KeyStore(data, agent).load(private=False).records
    return max(records, key=lambda r: r.created_at).activation


async def served_cache_control(port: int, path: str = DIRECTORY) -> str:
    timeout = aiohttp.ClientTimeout(total=WAIT_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        assert resp.status == 200, await resp.text()
        return resp.headers["Cache-Control"]


async def rotate(*args: str) -> Any:
    done = await asyncio.to_thread(run_cli, "keys", "rotate", *args)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def data(tmp_path: Path) -> Path:
    KeyStore(tmp_path / "data").create(time.time(), lifetime_s=LIFETIME_S)
    return tmp_path / "data"


async def test_the_activation_waits_for_the_max_age_the_listener_serves(tmp_path: Path, data: Path) -> None:
    lower = config_file(tmp_path, "lower.yaml", LOWER_MAX_AGE_S)  # edited; the listener is not restarted
    server = listener(data, SERVED_MAX_AGE_S)
    try:
        ((_, port),) = await server.start()
        assert await served_cache_control(port) == f"max-age={SERVED_MAX_AGE_S}"
        before = math.ceil(time.time())
        done = await rotate("--config", lower)
    finally:
        await server.stop()
    assert new_key_activation(data) >= before + SERVED_MAX_AGE_S + ROTATION_MARGIN_S
    assert f"a copy served with max-age {SERVED_MAX_AGE_S} may be cached until" in done.stdout
    assert f"publish.directory_max_age_s ({LOWER_MAX_AGE_S} s): waiting for it" in done.stdout
    assert "warning" not in done.stderr


async def test_a_restart_with_a_lower_max_age_still_waits_for_the_copies_served_before(
    tmp_path: Path, data: Path
) -> None:
    lower = config_file(tmp_path, "lower.yaml", LOWER_MAX_AGE_S)
    first = listener(data, SERVED_MAX_AGE_S)
    try:
        ((_, port),) = await first.start()
        assert await served_cache_control(port) == f"max-age={SERVED_MAX_AGE_S}"
        served_at = math.floor(time.time())
    finally:
        await first.stop()
    second = listener(data, LOWER_MAX_AGE_S)  # restarted with the lower max-age
    try:
        ((_, port),) = await second.start()
        assert await served_cache_control(port) == f"max-age={LOWER_MAX_AGE_S}"
        await rotate("--config", lower)
    finally:
        await second.stop()
    assert new_key_activation(data) >= served_at + SERVED_MAX_AGE_S + ROTATION_MARGIN_S


async def test_each_published_agent_gets_its_own_record(tmp_path: Path, data: Path) -> None:
    KeyStore(data, "alice").create(time.time(), lifetime_s=LIFETIME_S)
    lower = config_file(tmp_path, "lower.yaml", LOWER_MAX_AGE_S, agents=("alice",))
    server = listener(data, SERVED_MAX_AGE_S, agents=("alice",))
    try:
        ((_, port),) = await server.start()
        path = f"/agents/alice{DIRECTORY}"
        assert await served_cache_control(port, path) == f"max-age={SERVED_MAX_AGE_S}"
        before = math.ceil(time.time())
        await rotate("--config", lower, "--agent", "alice")
    finally:
        await server.stop()
    assert new_key_activation(data, "alice") >= before + SERVED_MAX_AGE_S + ROTATION_MARGIN_S
    for agent in ("default", "alice"):
        record = KeyStore(data, agent).path / "served.json"
        assert stat.S_IMODE(record.stat().st_mode) == 0o600  # owner-only, like the rest of the store
        assert [e["max_age_s"] for e in json.loads(record.read_text())["listeners"]] == [SERVED_MAX_AGE_S]


async def test_the_listener_renews_its_record_while_it_runs(data: Path) -> None:
    clock = Clock(time.time())
    server = listener(data, SERVED_MAX_AGE_S, clock, served_interval_s=0.01)
    record = KeyStore(data).path / "served.json"

    def until_moment() -> str:
        (entry,) = json.loads(record.read_text())["listeners"]
        return str(entry["until"])

    try:
        await server.start()
        first = until_moment()
        clock.t += 3600  # an hour on the listener's clock: the next renewal promises an hour later
        await until(lambda: until_moment() != first, "the periodic renewal of served.json")
    finally:
        await server.stop()
    assert until_moment() > first


async def test_a_record_that_cannot_be_written_is_logged_once_and_serving_goes_on(
    data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = KeyStore(data).path / "served.json"
    record.mkdir()  # not a file: nothing can be written there (whoever runs the tests)
    server = listener(data, SERVED_MAX_AGE_S)
    with caplog.at_level(logging.WARNING, logger="signing_proxy.publish"):
        try:
            ((_, port),) = await server.start()
            await asyncio.to_thread(server.record_served)
            await asyncio.to_thread(server.record_served)
            assert await served_cache_control(port) == f"max-age={SERVED_MAX_AGE_S}"
        finally:
            await server.stop()
    lines = [r.getMessage() for r in caplog.records if "cannot record" in r.getMessage()]
    assert len(lines) == 1, lines
    assert str(record) in lines[0]


async def test_a_corrupt_record_is_replaced_with_a_warning_naming_it(
    data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = KeyStore(data).path / "served.json"
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("{not json")
    server = listener(data, SERVED_MAX_AGE_S)
    with caplog.at_level(logging.WARNING, logger="signing_proxy.publish"):
        try:
            await server.start()
        finally:
            await server.stop()
    assert any(str(record) in r.getMessage() for r in caplog.records), caplog.records
    assert [e["max_age_s"] for e in json.loads(record.read_text())["listeners"]] == [SERVED_MAX_AGE_S]
